"""Time to the error message for each bad-input case of the CLI (issue 11's "Must show"): exit status, seconds, line.

Runs every case of ``tests/cli/test_cli_errors.py`` (its data file ``tests/cli/cli_error_cases.json``) ``--repeats``
times in a fresh data home, as a user would (``python -m flows.cli ...``), and prints a markdown table with the
median wall time to the message. Take the numbers on an idle machine: the time is dominated by interpreter start and
imports. Example:

    PYTHONPATH=. python benchmarks/cli_errors.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the cases of tests/cli/test_cli_errors.py: name -> (argv, expected error text), read from its data file
CASES = {name: (case["argv"], case["expect"])
         for name, case in json.loads((REPO / "tests" / "cli" / "cli_error_cases.json").read_text()).items()}


def run_case(args: list[str], home: str) -> tuple[int, float, str, float]:
    """Run one CLI invocation; returns (exit status, wall seconds, first stderr line, CPU seconds)."""
    env = {**os.environ, "SEARCHLOOP_HOME": home, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    env.pop("PREFECT_API_URL", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return out.returncode, wall, (out.stderr.strip().splitlines() or [""])[0], cpu


def main() -> None:
    """Print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="Runs per case (the median is reported).")
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print("| case | command | exit | median wall s | median CPU s | message |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as home:
        for name, (argv, _) in CASES.items():
            runs = [run_case(argv, home) for _ in range(args.repeats)]
            seconds = statistics.median(r[1] for r in runs)
            cpu = statistics.median(r[3] for r in runs)
            line = runs[0][2].replace("|", "\\|")[:140]
            print(f"| {name} | `searchloop {' '.join(argv)}` | {runs[0][0]} | {seconds:.2f} | {cpu:.2f} | {line} |")
        if list(Path(home).rglob("prefect.db")):
            print("WARNING: a Prefect database appeared: something started before the error")


if __name__ == "__main__":
    main()
