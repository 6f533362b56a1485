"""The offline vLLM engine in its own environment, driven from ours: a worker process and its client generator.

vLLM needs transformers>=5.16 and lives in ``.venv-vllm`` (``make vllm-env``); flows, eval and the EM loop run in
the main environment. :meth:`VLLMWorkerGenerator.start` runs ``python -m training.generation.vllm_worker`` with
``.venv-vllm``'s interpreter; the worker builds ``VLLMGenerator`` (the real ``vllm.LLM``) and answers ``generate``
calls over a ``multiprocessing.connection`` on 127.0.0.1, authenticated by a random key passed in its
environment. Messages are plain dicts (prompts, sampling fields, budgets / completion fields), so the two
interpreters share no objects. The worker's logs go to a file; a dead worker or a failed call raises
:class:`VLLMWorkerError` with the log's tail. The client loads the model's tokenizer locally (chat templates,
masks): the converted folders read the same ids in both transformers versions (``training.generation.models``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from infra.errors import SearchloopError
from training.generation.base import Completion, SamplingParams

log = logging.getLogger(__name__)
KEY_ENV = "SEARCHLOOP_VLLM_WORKER_KEY"


class VLLMWorkerError(SearchloopError):
    """The vLLM worker process failed to start or to answer."""


class VLLMWorkerGenerator:
    """Generator whose ``generate`` runs in a vLLM worker process (see the module docstring).

    Args:
        proc: the worker process. conn: its connection. tokenizer: the model's HF tokenizer. log_path: its log.
    """

    def __init__(self, proc: subprocess.Popen, conn: Any, tokenizer: Any, log_path: Path) -> None:
        self.proc, self.conn, self.tokenizer, self.log_path = proc, conn, tokenizer, log_path
        self.eos_token: str | None = tokenizer.eos_token

    @classmethod
    def from_model(cls, model: str, gpu_memory_utilization: float | None = None, **kwargs: Any) -> Any:
        """The ``vllm`` backend: ``VLLMGenerator`` in-process where vLLM is importable, else a worker in
        ``.venv-vllm`` (``kwargs`` are ``vllm.LLM`` arguments either way)."""
        import importlib.util

        from training.generation.models import resolve_model
        from training.generation.vllm_offline import VLLMGenerator

        if importlib.util.find_spec("vllm") is not None:
            return VLLMGenerator.from_model(model, gpu_memory_utilization=gpu_memory_utilization, **kwargs)
        return cls.start(str(resolve_model(model)), {"gpu_memory_utilization": gpu_memory_utilization, **kwargs})

    @classmethod
    def start(cls, model_path: str, llm_kwargs: dict[str, Any], timeout: float = 900.0,
              python: str | None = None) -> VLLMWorkerGenerator:
        """Start the worker for an HF folder; wait (up to ``timeout`` s) until its engine is loaded."""
        from multiprocessing.connection import Listener

        from infra.engine_envs import engine_env, require_engine_python
        from training.generation.models import load_tokenizer

        exe = python or str(require_engine_python("vllm"))
        key = secrets.token_bytes(32)
        listener = Listener(("127.0.0.1", 0), authkey=key)
        fd, name = tempfile.mkstemp(prefix="vllm-worker-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
        env = engine_env({KEY_ENV: key.hex()})
        host, port = listener.address
        args = [exe, "-m", "training.generation.vllm_worker", f"{host}:{port}", model_path, _dumps(llm_kwargs)]
        with open(log_path, "ab") as fh:
            # its own process group: vLLM's EngineCore and its workers are the worker's children, and a killed worker
            # left them running (3.5 GB each, reparented to init); close() and the worker's exit kill the group
            proc = subprocess.Popen(args, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        t0 = time.perf_counter()
        conn = _accept(listener, proc, timeout, log_path)
        try:
            ready = conn.recv()  # sent once the engine is loaded; EOF when the worker dies loading it
        except (EOFError, OSError) as exc:
            raise VLLMWorkerError(f"vLLM worker died loading {model_path} (exit {proc.wait(timeout=60)}); "
                                  f"log {log_path}:\n{_tail(log_path)}") from exc
        if not ready.get("ok"):
            proc.wait(timeout=30)
            raise VLLMWorkerError(f"vLLM worker failed to load {model_path}: {ready.get('error')}\n{_tail(log_path)}")
        log.info("vLLM worker ready in %.1f s (pid %d, log %s)", time.perf_counter() - t0, proc.pid, log_path)
        return cls(proc, conn, load_tokenizer(model_path), log_path)

    def generate(
        self, prompts: list[str], sampling: SamplingParams, max_tokens: list[int] | None = None
    ) -> list[Completion]:
        """Generate in the worker (same semantics as ``VLLMGenerator.generate``)."""
        if not prompts:
            return []
        try:
            self.conn.send({"prompts": list(prompts), "sampling": sampling.model_dump(),
                            "max_tokens": list(max_tokens) if max_tokens else None})
            reply = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise VLLMWorkerError(f"vLLM worker died (exit {self.proc.poll()}): {_tail(self.log_path)}") from exc
        if "error" in reply:
            raise VLLMWorkerError(f"vLLM worker: {reply['error']}")
        return [Completion(**c) for c in reply["completions"]]

    def close(self) -> None:
        """Stop the worker (asks it to exit, then terminates it)."""
        if self.proc.poll() is None:
            try:
                self.conn.send({"close": True})
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
        _kill_group(self.proc.pid)  # whatever of vLLM's engine processes outlived the worker
        self.conn.close()

    def __del__(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()


def _accept(listener: Any, proc: subprocess.Popen, timeout: float, log_path: Path) -> Any:
    """Accept the worker's connection in a thread; give up when the worker exits or ``timeout`` passes."""
    import threading

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["conn"] = listener.accept()
        except Exception as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive() and proc.poll() is None and time.monotonic() < deadline:
        thread.join(0.5)
    if "conn" in box:
        listener.close()
        return box["conn"]
    listener.close()  # unblocks accept()
    if proc.poll() is None:
        proc.kill()
    if "error" in box:
        why = f"connection failed: {box['error']}"
    elif proc.returncode is not None and time.monotonic() < deadline:
        why = f"exited with status {proc.returncode}"
    else:
        why = f"did not connect within {timeout:.0f} s"
    raise VLLMWorkerError(f"vLLM worker {why}; log {log_path}:\n{_tail(log_path)}")


def _kill_group(pgid: int) -> None:
    from infra.proc import signal_group

    signal_group(pgid, signal.SIGKILL)


def _dumps(obj: Any) -> str:
    import orjson

    return orjson.dumps(obj).decode()


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def serve(address: str, model_path: str, llm_kwargs: dict[str, Any]) -> None:
    """Worker side: build the engine, then answer ``generate`` messages until told to close."""
    from multiprocessing.connection import Client

    from training.generation.vllm_offline import VLLMGenerator

    host, port = address.rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ.pop(KEY_ENV)))
    try:
        gen = VLLMGenerator.from_model(model_path, **llm_kwargs)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it with the log
        conn.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    conn.send({"ok": True})
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg.get("close"):
            return
        try:
            t0 = time.perf_counter()
            comps = gen.generate(msg["prompts"], SamplingParams(**msg["sampling"]), msg.get("max_tokens"))
            # one line per call in the worker log: what a slow or stuck call was doing is then on record
            print(f"searchloop-vllm-worker: generate {len(msg['prompts'])} prompts, "
                  f"{sum(len(c.token_ids) for c in comps)} tokens out in {time.perf_counter() - t0:.2f} s",
                  flush=True)
            conn.send({"completions": [dataclasses.asdict(c) for c in comps]})
        except Exception as exc:  # noqa: BLE001 - one bad call must not kill the engine; the parent raises it
            conn.send({"error": f"{type(exc).__name__}: {exc}"})


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds to the group kill below instead of dying with the engine still up


if __name__ == "__main__":  # spawned vLLM workers re-import the main module: the guard is required
    import orjson

    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        serve(sys.argv[1], sys.argv[2], orjson.loads(sys.argv[3]))  # returns on close or when the parent is gone
    finally:
        if os.getpgrp() == os.getpid():  # started as a group leader (start_new_session): take vLLM's processes along
            sys.stdout.flush()
            _kill_group(os.getpid())
