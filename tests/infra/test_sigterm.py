"""A CLI process stopped by SIGTERM runs its cleanup (``infra.proc.exit_on_sigterm``): the services it started
stop with it. Before, `kill` on `searchloop run ...` left Prefect's temporary API server running (two orphans
were found on this machine in session 12)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time


def test_sigterm_runs_cleanup_and_stops_the_child(tmp_path) -> None:
    marker, child_pid = tmp_path / "cleaned", tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import atexit, pathlib, subprocess, sys, time
        sys.path.insert(0, {str(__import__("pathlib").Path.cwd())!r})
        from infra.proc import exit_on_sigterm
        exit_on_sigterm()
        atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text("atexit"))
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        pathlib.Path({str(child_pid)!r}).write_text(str(child.pid))
        try:
            time.sleep(120)
        finally:
            child.terminate()
            child.wait()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    while not child_pid.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert child_pid.exists(), "the script did not start its child"
    proc.terminate()
    assert proc.wait(timeout=30) == 143
    assert marker.read_text() == "atexit"
    pid = int(child_pid.read_text())
    alive = subprocess.run(["ps", "-p", str(pid), "-o", "stat="], capture_output=True, text=True).stdout.strip()
    assert alive in ("", "Z"), f"child {pid} still running: {alive!r}"
