"""Configuration: strict pydantic models, YAML presets and ``a.b=value`` overrides.

A preset is one YAML file whose keys match a flow's config model. Overrides from the CLI are applied on top.
Validation collects every error and reports them together, each with the file and the dotted key.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from infra.errors import ConfigError

PRESET_DIR = Path(__file__).resolve().parent.parent / "flows" / "configs"

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config model: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value`` into (["a","b","c"], value); the value is read as YAML (``3``, ``true``, ``[1,2]``).

    Raises:
        ConfigError: if the text has no ``=`` or an empty key.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form key.sub=value (e.g. retrieval.index=<dir>)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def _section_model(model: type[BaseModel] | None, path: list[str]) -> type[BaseModel] | None:
    """The pydantic model class of the section at ``path`` inside ``model`` (None past a list, dict or scalar)."""
    for part in path:
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        annotation = field.annotation
        candidates = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def apply_overrides(
    data: Mapping[str, Any], overrides: Iterable[str], model: type[BaseModel] | None = None
) -> dict[str, Any]:
    """Return a deep copy of ``data`` with each ``a.b=value`` override set (creating nested dicts).

    When ``model`` is given and the overridden key's section declares ``one_of`` (mutually exclusive keys, e.g.
    ``RetrieverSpec``: url / index / corpus), setting one of them drops the others the preset had, so
    ``retrieval.index=<dir>`` replaces a preset's ``retrieval.corpus``.
    """
    out: dict[str, Any] = orjson.loads(orjson.dumps(dict(data), default=str))
    errors = []
    for text in overrides:
        try:
            path, value = parse_override(text)
        except ConfigError as exc:
            errors.append(str(exc))
            continue
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                errors.append(f"override {text!r}: {part!r} is a value, not a section")
                break
            node = child
        else:
            node[path[-1]] = value
            exclusive = getattr(_section_model(model, path[:-1]), "one_of", ())
            if path[-1] in exclusive and value is not None:
                for sibling in exclusive:
                    if sibling != path[-1]:
                        node.pop(sibling, None)
    if errors:
        raise ConfigError("invalid overrides:\n  - " + "\n  - ".join(errors))
    return out


def resolve_preset(name_or_path: str | Path) -> Path:
    """Find a preset by name (``flows/configs/<name>.yaml``) or path.

    Raises:
        ConfigError: naming the available presets when none matches.
    """
    p = Path(name_or_path)
    if p.suffix in {".yaml", ".yml"} and p.exists():
        return p
    candidate = PRESET_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    names = sorted(x.stem for x in PRESET_DIR.glob("*.yaml"))
    close = difflib.get_close_matches(str(name_or_path), names, n=3)
    if close:
        raise ConfigError(f"preset {str(name_or_path)!r} not found (did you mean {' or '.join(map(repr, close))}?); "
                          "`searchloop presets` lists them all")
    raise ConfigError(f"preset {str(name_or_path)!r} not found; available presets: {', '.join(names)}")


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping; raise ConfigError naming the file on syntax errors or a non-mapping top level."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML syntax error: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(data).__name__}")
    return data


def close_key(model: type[BaseModel] | None, loc: Iterable[Any]) -> str | None:
    """The field of ``model``'s section at ``loc[:-1]`` whose name is closest to the unknown key ``loc[-1]``."""
    parts = [str(p) for p in loc if not isinstance(p, int)]
    section = _section_model(model, parts[:-1]) if model is not None and parts else None
    if section is None:
        return None
    close = difflib.get_close_matches(parts[-1], list(section.model_fields), n=1)
    return ".".join([*parts[:-1], close[0]]) if close else None


def format_validation_error(exc: ValidationError, source: str, model: type[BaseModel] | None = None) -> str:
    """Render every pydantic error as ``source: key.path: message`` lines (an unknown key with the closest known
    key of ``model`` as a "did you mean")."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            close = close_key(model, err["loc"])
            hint = f"did you mean {close!r}? " if close else "check spelling; "
            msg = f"unknown key ({hint}see the preset files in flows/configs)"
        lines.append(f"{source}: {key}: {msg} (got {err.get('input')!r})"[:400])
    return problem_list(lines, "configuration error")


def problem_list(problems: list[str], what: str) -> str:
    """One problem as one line; several as ``N <what>s:`` followed by one indented line each."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} {what}(s):\n  - " + "\n  - ".join(problems)


def build_config(model: type[M], data: Mapping[str, Any], source: str = "<config>") -> M:
    """Validate ``data`` against ``model``, raising one ConfigError that lists every problem."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, model)) from exc


def load_config(model: type[M], preset: str | Path | None = None, overrides: Iterable[str] = ()) -> M:
    """Load a preset (or the model defaults), apply overrides and validate.

    Args:
        model: the config model class.
        preset: preset name or YAML path; ``None`` uses the model's defaults.
        overrides: ``a.b=value`` strings applied after the preset.
    """
    data: dict[str, Any] = {}
    source = "<defaults>"
    if preset is not None:
        path = resolve_preset(preset)
        data = read_yaml(path)
        source = str(path)
    overrides = list(overrides)
    if overrides:
        data = apply_overrides(data, overrides, model)
        source += " + overrides"
    return build_config(model, data, source)


def config_hash(cfg: BaseModel | Mapping[str, Any]) -> str:
    """Stable short hash of a config (sorted JSON), used in manifests and cache keys."""
    payload = cfg.model_dump(mode="json") if isinstance(cfg, BaseModel) else dict(cfg)
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS, default=str)).hexdigest()[:16]


SECRET_MASK = "**********"  # what pydantic writes for a SecretStr in every dump, repr and record


def secret_value(value: SecretStr | str | None, env: str | None = None) -> str | None:
    """The plain text of a secret field, else of the environment variable ``env`` (None when neither is set).

    A masked value (a config that went through a record, e.g. Prefect parameters of a deployment run) counts as
    unset, so the environment supplies the real secret on the machine that uses it.
    """
    raw = value.get_secret_value() if isinstance(value, SecretStr) else value
    if raw and raw != SECRET_MASK:
        return raw
    return (os.environ.get(env) or None) if env else None


_SECRET_NAME = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL")


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the values of secret-looking names (``*TOKEN*``, ``*KEY*``, ``*SECRET*``...) masked."""
    return {k: SECRET_MASK if any(s in k.upper() for s in _SECRET_NAME) else v for k, v in env.items()}
