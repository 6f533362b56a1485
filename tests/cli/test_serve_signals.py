"""``searchloop serve generator --engine vllm`` stops on SIGTERM while vLLM is still starting.

vLLM on CPU takes minutes to become healthy; session 8 found that SIGTERM in that window was ignored (the handler
only set a flag the serving loop reads after startup), so the command had to be killed and its vLLM process group
was left behind. Here a stand-in interpreter for ``.venv-vllm`` starts a process that never answers ``/health``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_while_vllm_starts_stops_the_command_and_its_server(tmp_path: Path) -> None:
    pidfile = tmp_path / "vllm.pid"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 600\n")  # a vLLM that never gets healthy
    fake.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    env = {**os.environ, "SEARCHLOOP_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO),
           "SEARCHLOOP_VLLM_PYTHON": str(fake), "COLUMNS": "400"}
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "generator", "--engine", "vllm",
                             "--model", str(model), "--port", str(_free_port())], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the stand-in vLLM never started"
            time.sleep(0.2)
        vllm_pid = int(pidfile.read_text())
        time.sleep(1.0)  # the command is now polling /health
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=45)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopped before vLLM was ready" in out, out
    assert "vLLM server stopped" in out
    deadline = time.monotonic() + 10
    while _alive(vllm_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(vllm_pid), "the vLLM process group outlived the command"
