"""Settings: the model cache follows the data home unless SEARCHLOOP_MODEL_CACHE shares one across homes."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.settings import REPO_ROOT, Settings


def test_model_cache_lives_in_the_data_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SEARCHLOOP_MODEL_CACHE", raising=False)
    monkeypatch.setenv("SEARCHLOOP_HOME", str(tmp_path / "home"))
    cache = Settings().model_cache
    assert cache == tmp_path / "home" / "models"
    assert REPO_ROOT not in cache.parents


def test_model_cache_can_be_shared(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SEARCHLOOP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SEARCHLOOP_MODEL_CACHE", str(tmp_path / "shared"))
    assert Settings().model_cache == tmp_path / "shared"


def test_cli_in_a_terminal_prints_no_prefect_telemetry_notice(tmp_path: Path) -> None:
    """The first ``import prefect`` of a data home in a terminal printed "Prefect collects anonymous usage data";
    the embedded environment opts the client out (DO_NOT_TRACK), so a CLI command that imports Prefect prints none.
    The same import without the opt-out shows the notice, so this test sees a terminal the way Prefect does."""
    import os
    import pty
    import subprocess
    import sys

    def in_terminal(argv: list[str], env: dict[str, str]) -> str:
        master, slave = pty.openpty()
        subprocess.run(argv, stdin=slave, stdout=slave, stderr=slave, env=env, timeout=300, cwd=REPO_ROOT)
        os.close(slave)
        out = b""
        try:
            while chunk := os.read(master, 65536):
                out += chunk
        except OSError:  # the pty's other end is closed: all read
            pass
        os.close(master)
        return out.decode(errors="replace")

    ci = {"CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "BUILDKITE", "PYTEST_CURRENT_TEST", "DO_NOT_TRACK"}
    env = {k: v for k, v in os.environ.items() if k not in ci and not k.startswith(("PREFECT_", "SEARCHLOOP_"))}
    env |= {"PYTHONPATH": str(REPO_ROOT), "SEARCHLOOP_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    notice = "collects anonymous usage data"
    control = in_terminal([sys.executable, "-c", "import prefect"], {**env, "PREFECT_HOME": str(tmp_path / "p")})
    assert notice in control  # Prefect shows it here, in a pty, for a new home
    out = in_terminal([sys.executable, "-m", "flows.cli", "deploy", "run", "retrain", "config.name=x", "--dry-run"],
                      env)
    assert "'name': 'x'" in out and notice not in out
