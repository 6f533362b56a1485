"""Bad input on the command line: exit 2, one line naming the fix, no traceback, before any flow or server starts.

Each case runs the real CLI in a subprocess with a fresh data home and prints its time to the message (the number
the issue asks for; run with ``-s`` to see them). The check that nothing started: no Prefect database appears in the
data home.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# name -> (argv, expected error text); a data file, so benchmarks/cli_errors.py reads the same cases without
# importing this test module
CASES = {name: (case["argv"], case["expect"])
         for name, case in json.loads((Path(__file__).parent / "cli_error_cases.json").read_text()).items()}


def _run(args: list[str], home: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "SEARCHLOOP_HOME": str(home), "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    env.pop("PREFECT_API_URL", None)
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    return out, time.monotonic() - start


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    args, expected = CASES[case]
    out, seconds = _run(args, tmp_path)
    print(f"\n{case}: exit {out.returncode} in {seconds:.2f} s: {out.stderr.strip()[:160]}")
    text = " ".join(out.stderr.split())
    assert out.returncode == 2, out.stdout + out.stderr
    assert expected in text
    assert "Traceback" not in out.stderr + out.stdout
    assert out.stderr.count("error:") == 1
    assert not list(tmp_path.rglob("prefect.db")), "a Prefect server started before the error"


def test_old_spellings_are_gone(tmp_path: Path) -> None:
    for args in (["run", "rl", "-o", "name=x"], ["run", "em-loop", "--override", "iterations=1"],
                 ["deploy", "run", "retrain", "--param", "config.name=x"], ["search", "q", "--k", "3"]):
        out, _ = _run(args, tmp_path)
        assert out.returncode == 2 and "No such option" in out.stderr, args


def test_dry_run_prints_config_and_plan_and_starts_nothing(tmp_path: Path) -> None:
    out, seconds = _run(["index", "build", "--preset", "index_mini_hybrid", "index.hybrid.rrf_k=30", "--dry-run"],
                        tmp_path)
    print(f"\ndry run in {seconds:.2f} s")
    assert out.returncode == 0, out.stderr
    assert "rrf_k: 30" in out.stdout and "backend: hybrid" in out.stdout
    assert "embed-shard x N" in out.stdout and "finalize-hybrid" in out.stdout and "log-index-run" in out.stdout
    assert not list(tmp_path.rglob("prefect.db")) and not list(tmp_path.rglob("mlflow.db"))
    for args in (["eval", "--dry-run", "agent.limit=2"], ["run", "em-loop", "--dry-run", "iterations=1"],
                 ["run", "rl", "--dry-run"], ["demo", "--dry-run", "run_agent=false"]):
        out, _ = _run(args, tmp_path)
        assert out.returncode == 0 and "stage plan" in out.stdout, args + [out.stderr]
    assert not list(tmp_path.rglob("prefect.db"))


def test_deploy_run_retrain_dry_run_prints_checked_parameters(tmp_path: Path) -> None:
    out, _ = _run(["deploy", "run", "retrain", "config.name=nightly", "--dry-run"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "'name': 'nightly'" in out.stdout and "'trainer'" in out.stdout
    assert not list(tmp_path.rglob("prefect.db"))


def test_server_4xx_is_one_error_line(monkeypatch) -> None:
    """A 409 from the Prefect server (a parameter its schema rejects) -> SearchloopError, one line, exit 2."""
    import httpx

    from flows.commands.ops import _server_errors
    from infra.errors import SearchloopError

    request = httpx.Request("POST", "http://127.0.0.1:4200/api/deployments/x/create_flow_run")
    response = httpx.Response(409, request=request, json={"detail": "Error creating flow run: Validation failed "
                                                                    "for field 'config'. Failure reason: 'nme' "
                                                                    "was unexpected"})
    with pytest.raises(SearchloopError, match=r"refused the request \(409 Conflict\): .*'nme'"), \
            _server_errors():
        raise httpx.HTTPStatusError("409", request=request, response=response)
    with pytest.raises(httpx.HTTPStatusError), _server_errors():  # a server fault is not the user's input
        raise httpx.HTTPStatusError("500", request=request, response=httpx.Response(500, request=request))
