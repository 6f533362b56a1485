"""Config loading: overrides, all errors reported at once, presets validate."""

from __future__ import annotations

import pytest
from pydantic import Field

from infra.config import StrictModel, apply_overrides, build_config, load_config, parse_override
from infra.errors import ConfigError


class Inner(StrictModel):
    k: int = Field(default=5, gt=0, description="top k")


class Outer(StrictModel):
    name: str = Field(default="x", description="name")
    inner: Inner = Field(default_factory=Inner, description="inner")


def test_parse_override_types() -> None:
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_override("novalue")


def test_apply_overrides_nested() -> None:
    assert apply_overrides({"inner": {"k": 1}}, ["inner.k=7", "name=y"]) == {"inner": {"k": 7}, "name": "y"}


def test_all_errors_reported_together() -> None:
    with pytest.raises(ConfigError) as info:
        build_config(Outer, {"inner": {"k": -1}, "nmae": "typo"}, "test.yaml")
    msg = str(info.value)
    assert "2 configuration error(s)" in msg
    assert "inner.k" in msg and "nmae" in msg and "test.yaml" in msg


def test_load_defaults_with_overrides() -> None:
    cfg = load_config(Outer, None, ["inner.k=9"])
    assert cfg.inner.k == 9


def test_unknown_preset_lists_available() -> None:
    with pytest.raises(ConfigError, match="available presets"):
        load_config(Outer, "no_such_preset")
