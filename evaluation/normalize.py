"""Answer normalizations by name (a leaf: stdlib and ``infra.errors`` only): ``squad``, ``r1searcher``,
``exsearch_released_buggy`` (see ``evaluation.metrics`` for what each does and which seed uses it).

Config models name one with :data:`NormalizationName` (checked when the config loads); a protocol names its seed's
rule in ``SearchProtocol.normalization``.
"""

from __future__ import annotations

import re
import string
from typing import Literal

from infra.errors import ConfigError
from infra.lazy import table_name

Normalization = Literal["squad", "r1searcher", "exsearch_released_buggy"]
NORMALIZATIONS: tuple[str, ...] = ("squad", "r1searcher", "exsearch_released_buggy")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)
_R1_PUNCT = frozenset(string.punctuation + "\u2018\u2019\u00b4`")
# Every one-character entry of ExSearch's stop-word set: its remove_punc deletes each such *character*, so the
# letters "a" and "i" vanish from every word (the set holds the words "a" and "i").
_EXSEARCH_DELETED_CHARS = frozenset("ai.,!?;:-()[]{}\"'/\\|<>=+*&^%$#@~`")


def _squad(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _ASCII_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _r1searcher(text: str) -> str:
    text = {"True": "yes", "False": "no"}.get(text, text)
    text = text.replace("_", " ").lower()
    text = "".join(" " if ch in _R1_PUNCT else ch for ch in text)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _exsearch_buggy(text: str) -> str:
    """ExSearch's v1-branch normalization (mangopy/SearchLM @ v1 ``src/utilize/metrics.py``). BROKEN ON PURPOSE.

    It deletes every character found in a stop-word set; the set contains the one-letter words "a" and "i", so
    all letters ``a`` and ``i`` are removed ("Paris" -> "prs"), along with most ASCII punctuation (but not ``_``).
    EM is mostly unaffected because both sides are mangled alike; F1 tokens are distorted.
    """
    text = "".join(ch for ch in text.lower() if ch not in _EXSEARCH_DELETED_CHARS)
    return " ".join(_ARTICLES.sub(" ", text).split())


_NORMALIZERS = {"squad": _squad, "r1searcher": _r1searcher, "exsearch_released_buggy": _exsearch_buggy}


def normalize_answer(text: str, normalization: Normalization = "squad") -> str:
    """Normalize an answer string.

    Args:
        text: raw answer.
        normalization: ``"squad"``, ``"r1searcher"`` or ``"exsearch_released_buggy"`` (broken; see module doc).

    Raises:
        ConfigError: for an unknown normalization name.
    """
    try:
        fn = _NORMALIZERS[normalization]
    except KeyError:
        choices = ", ".join(NORMALIZATIONS)
        raise ConfigError(f"unknown normalization {normalization!r}; choose one of {choices}") from None
    return fn(text)


NormalizationName = table_name(NORMALIZATIONS, "normalization")
"""A config field naming a normalization: checked when the config loads, with the other errors."""
