"""One loader for every table of dotted import strings (``"package.module:attr"``), verl-style.

Engines, protocols, generation backends, dispatched steps and retrain trainers are named in small tables of import
strings so that a heavy engine is imported only when chosen. :func:`pick` looks a name up and imports its target;
:func:`check_name` (and the field type :func:`table_name`) is the load-time check config models use, so a misspelt
name is reported with the other config errors and lists the valid names.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from infra.errors import ConfigError


def unknown_name(what: str, name: object, names: Iterable[str]) -> str:
    """``unknown <what> 'x'; choose one of: a, b, c`` (with a close match suggested when there is one)."""
    names = list(names)
    close = difflib.get_close_matches(str(name), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {what} {name!r}{hint}; choose one of: {', '.join(names)}"


def check_name(name: str, names: Iterable[str], what: str) -> str:
    """Return ``name`` if it is one of ``names``; else raise ValueError listing them (pydantic collects it).

    Raises:
        ValueError: for an unknown name.
    """
    names = list(names)
    if name not in names:
        raise ValueError(unknown_name(what, name, names))
    return name


def table_name(names: Iterable[str], what: str) -> Any:
    """A config field type: a ``str`` that must be one of ``names`` (a table's keys), checked when the config loads
    with the other errors; the error lists the valid names and suggests a close one.

    A mapping is read when a config is checked, not when the type is made, so a line added to the table later (a
    backend registered by a plugin or a test) is valid at once.

    Example: ``ProtocolName = table_name(PROTOCOLS, "protocol")``, then ``protocol: ProtocolName = Field(...)``.
    """
    from typing import Annotated

    from pydantic import AfterValidator

    live = names if isinstance(names, Mapping) else tuple(names)
    return Annotated[str, AfterValidator(lambda name: check_name(name, sorted(live), what))]


def load_object(target: str) -> Any:
    """Import ``"package.module:attr"`` and return the attribute.

    Raises:
        ConfigError: for a malformed target, a missing module or a missing attribute.
    """
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"import target {target!r} is not of the form 'package.module:attr'")
    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):  # the target's own module is missing
            raise ConfigError(f"import target {target!r}: no module {exc.name!r}") from exc
        raise  # a dependency of the target is missing: let its own message through
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigError(f"import target {target!r}: {module} has no attribute {attr!r}") from exc
    return obj


def pick(table: Mapping[str, str], name: str, what: str) -> Any:
    """The object the table names under ``name``, imported now.

    Raises:
        ConfigError: for a name not in ``table`` (listing the valid ones), or a broken target.
    """
    target = table.get(name)
    if target is None:
        raise ConfigError(unknown_name(what, name, table))
    return load_object(target)
