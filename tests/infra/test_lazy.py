"""The one dotted-string loader: tables of ``module:attr`` targets, unknown names listing the valid ones."""

from __future__ import annotations

import pytest

from infra.errors import ConfigError
from infra.lazy import check_name, load_object, pick, unknown_name


def test_load_object_and_pick() -> None:
    assert load_object("infra.lazy:pick") is pick
    assert load_object("os.path:join.__name__") == "join"
    table = {"lazy": "infra.lazy:check_name"}
    assert pick(table, "lazy", "thing") is check_name
    with pytest.raises(ConfigError, match=r"unknown thing 'lazzy' \(did you mean 'lazy'\?\); choose one of: lazy"):
        pick(table, "lazzy", "thing")


@pytest.mark.parametrize("target", ["infra.lazy", "infra.nope:x", "infra.lazy:nope", ":x"])
def test_broken_targets_are_config_errors(target: str) -> None:
    with pytest.raises(ConfigError, match="import target"):
        load_object(target)


def test_check_name_is_a_value_error_for_validators() -> None:
    assert check_name("research", ["research", "searchr1"], "protocol") == "research"
    with pytest.raises(ValueError, match="unknown protocol 'reseach'.*choose one of: research, searchr1"):
        check_name("reseach", ["research", "searchr1"], "protocol")
    assert unknown_name("x", "zzz", ["a"]) == "unknown x 'zzz'; choose one of: a"


def _defines(target: str) -> bool:
    """The target's module file defines its attribute at top level (read from the AST: nothing is imported)."""
    import ast
    import importlib.util
    from pathlib import Path

    module, _, attr = target.partition(":")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{target}: no module {module}"
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return attr.split(".")[0] in names


def test_every_table_names_something_that_exists() -> None:
    """Every target of every table exists (a renamed module cannot hide until a run picks it)."""
    from tasks.dispatch import STEPS
    from training.generation.base import GENERATORS
    from training.protocols.base import PROTOCOLS
    from training.rl.engines import ENGINES

    engines = {f"{n}.{k}": t for n, e in ENGINES.items() for k, t in (("launch", e.launch), ("stage3", e.stage3)) if t}
    for table in (PROTOCOLS, STEPS, engines, GENERATORS):
        for target in table.values():
            assert _defines(target), target


def test_table_name_fields_report_every_bad_name_at_load_time() -> None:
    from infra.config import load_config
    from infra.errors import ConfigError
    from training.rl.config import RLConfig

    with pytest.raises(ConfigError) as err:
        load_config(RLConfig, "research_grpo_cpu_demo", ["protocol=reseach", "stages.grpo.reward=reserch"])
    text = str(err.value)
    assert "2 configuration error(s)" in text
    assert "unknown protocol 'reseach' (did you mean 'research'?); choose one of: exsearch, r1searcher, research" in text  # noqa: E501
    assert "unknown reward 'reserch'" in text and "searchr1_em" in text
