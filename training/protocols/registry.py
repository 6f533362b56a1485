"""The table of tag protocols: a name -> the dotted import string of its ``SearchProtocol`` subclass.

A leaf (``infra.lazy`` only), so config models check a protocol name (:data:`ProtocolName`) without importing any
protocol; ``training.protocols.base.load_protocol`` / :func:`protocol_class` import the one chosen. A new protocol is
one module plus one line here (``docs/extending.md``).
"""

from __future__ import annotations

from typing import Any

from infra.lazy import pick, table_name

PROTOCOLS: dict[str, str] = {
    "research": "training.protocols.research:ReSearchProtocol",
    "searchr1": "training.protocols.searchr1:SearchR1Protocol",
    "r1searcher": "training.protocols.r1searcher:R1SearcherProtocol",
    "exsearch": "training.protocols.exsearch:ExSearchProtocol",
    "smartsearch": "training.protocols.smartsearch:SmartSearchProtocol",
}

ProtocolName = table_name(PROTOCOLS, "protocol")
"""A config field naming a protocol: checked when the config loads, with the other errors."""


def protocol_class(name: str) -> Any:
    """The ``SearchProtocol`` subclass named ``name`` (imported now), for its class-level facts (normalisation,
    judge prompt, warm-up renderer) without building an instance.

    Raises:
        ConfigError: for an unknown name (listing the valid ones).
    """
    return pick(PROTOCOLS, name, "protocol")
