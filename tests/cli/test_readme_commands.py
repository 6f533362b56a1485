"""Docs that run: every ``searchloop`` command in README's code blocks, and every override shown inline, works.

Flow commands (those offering ``--dry-run``) are resolved with ``--dry-run``: the preset, the overrides and the
input paths are checked and the stage plan printed, nothing starts. Every other command must at least parse
(``--help``). Inline overrides such as ```agent.generator.backend=vllm``` are loaded onto the flow they belong
to, so a renamed key cannot leave a failing command in the README.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"
# the flow (and a preset) an inline override of each top-level key belongs to
OVERRIDE_FLOWS = {"agent": ("evaluate", "eval_mini"), "sampling": ("em-loop", "exsearch_cpu_demo"),
                  "index": ("build-index", "index_mini_bm25")}


def readme_commands() -> list[list[str]]:
    """The ``searchloop`` command lines of README's fenced code blocks (comments dropped, ``a / b / c`` split)."""
    commands, fenced = [], False
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        words = line.split("#", 1)[0].strip()
        if not fenced or "searchloop " not in words and not words.endswith("searchloop --help"):
            continue
        argv = shlex.split(words[words.index("searchloop") + len("searchloop"):])
        if "/" in argv:  # "searchloop up / status / down"
            commands += [[a] for a in argv if a != "/"]
        else:
            commands.append(argv)
    return commands


def readme_overrides() -> list[str]:
    """Inline ``key.sub=value`` overrides of flow configs quoted in README's prose."""
    found = re.findall(r"`((?:agent|sampling|index)\.[\w.]+=[^`\s]+)`", README.read_text(encoding="utf-8"))
    return sorted(set(found))


def test_readme_has_commands_to_check() -> None:
    commands = readme_commands()
    assert len(commands) >= 15 and ["eval", "--preset", "eval_mini", "agent.limit=5"] in commands
    assert "sampling.generator.backend=vllm" in readme_overrides()


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_readme_command_runs(argv: list[str], tmp_path) -> None:
    runner = CliRunner()
    words = [a for a in argv if not a.startswith("-") and "=" not in a and "<" not in a][:2]
    helped = runner.invoke(app, [*words, "--help"])
    assert helped.exit_code == 0, f"searchloop {' '.join(words)} --help failed:\n{helped.output}"
    if "--dry-run" not in helped.output or argv == ["--help"]:
        return
    for ref in re.findall(r"models:/([\w.-]+)@(\w+)", " ".join(argv)):
        _register(*ref, tmp_path)  # the flow that registers it runs later in README: stand in for it
    result = runner.invoke(app, [*argv, "--dry-run"])
    assert result.exit_code == 0, f"searchloop {' '.join(argv)} --dry-run failed:\n{result.output}"


def _register(name: str, alias: str, tmp_path) -> None:
    """A version of registered model ``name`` with ``alias`` in the session's MLflow store (an HF-looking folder)."""
    from infra import tracking

    if tracking.get_alias(name, alias) is not None:
        return
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    c = tracking.client()
    if not c.search_registered_models(f"name = '{name}'"):
        c.create_registered_model(name)
    tracking.set_alias(name, alias, str(c.create_model_version(name, str(folder)).version))


@pytest.mark.parametrize("override", readme_overrides())
def test_readme_override_is_a_valid_key(override: str) -> None:
    from flows.specs import resolve

    flow, preset = OVERRIDE_FLOWS[override.split(".", 1)[0]]
    value = override.split("=", 1)[1]
    if "…" in value or "<" in value:  # a placeholder value: check the key with the preset's own value
        pytest.skip(f"{override} shows a placeholder value")
    resolve(flow, preset, [override])
