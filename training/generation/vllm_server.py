"""vLLM's own OpenAI-compatible server, started from ``.venv-vllm`` (``searchloop serve generator --engine vllm``).

:class:`VLLMServer` runs ``python -m vllm.entrypoints.openai.api_server`` with ``.venv-vllm``'s interpreter on
127.0.0.1 (another address only with a token, which vLLM checks as ``--api-key``, passed by environment so it
never shows in a process list or a record), waits until ``GET /health`` and ``GET /v1/models`` answer, and stops
it cleanly (SIGTERM to its process group, SIGKILL after a grace period). Our ``openai`` backend
(``training.generation.openai_client``) then drives it for eval, ``ask``, the judge and EM sampling: vLLM returns
the generated token ids (``return_token_ids``) and per-token logprobs, used for loss masks and best-of-n scores.
CPU defaults as for the offline engine (``training.generation.vllm_offline``): eager mode, bf16, a small
host-memory share, ``VLLM_CPU_KVCACHE_SPACE`` GiB of KV cache.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from infra.config import StrictModel
from infra.errors import SearchloopError

log = logging.getLogger(__name__)


class VLLMServerError(SearchloopError):
    """vLLM's server did not come up, or died; the message carries its log's tail."""


class VLLMServerConfig(StrictModel):
    """Settings of ``vllm serve`` as we launch it."""

    host: str = Field(default="127.0.0.1", description="Bind address; loopback unless a token is set.")
    port: int = Field(default=8001, ge=0, le=65535, description="TCP port (0 = a free one, picked at start).")
    served_name: str = Field(default="smollm2", description="Model name clients send.")
    token: str | None = Field(default=None, description="Bearer token clients must send (vLLM's --api-key).")
    dtype: str = Field(default="auto", description="Weights/activations dtype; auto = bf16 where the CPU has native "
                       "bf16 matmuls, else fp32 (emulated bf16 ran ~19x slower on an AVX2 CPU).")
    max_model_len: int | None = Field(default=None, ge=16, description="Context length (None = the model's).")
    gpu_memory_utilization: float = Field(
        default=0.1, gt=0, le=1, description="Share of device memory; on CPU a share of host memory (0.92 fails).")
    kv_cache_gib: float = Field(default=2.0, gt=0, description="VLLM_CPU_KVCACHE_SPACE on CPU (GiB).")
    enforce_eager: bool = Field(default=True, description="No graph capture/compilation (no triton-cpu here).")
    startup_timeout_s: float = Field(default=900.0, gt=0, description="Wait this long for /health.")
    extra_args: list[str] = Field(default_factory=list, description="More `vllm serve` arguments, verbatim.")

    @model_validator(mode="after")
    def _loopback_or_token(self) -> VLLMServerConfig:
        try:
            loopback = ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            loopback = self.host == "localhost"
        if not loopback and not self.token:
            raise ValueError(f"host {self.host!r} is not loopback: set a token (--token) or bind 127.0.0.1")
        return self


def _dtype(dtype: str) -> str:
    from training.generation.base import cpu_dtype

    return cpu_dtype() if dtype == "auto" else dtype


def serve_command(cfg: VLLMServerConfig, model_path: str, python: str) -> list[str]:
    """The ``api_server`` command line for ``model_path`` (the token goes by environment, not here)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--host", cfg.host,
           "--port", str(cfg.port), "--served-model-name", cfg.served_name, "--dtype", _dtype(cfg.dtype),
           "--gpu-memory-utilization", str(cfg.gpu_memory_utilization), "--disable-uvicorn-access-log"]
    if cfg.enforce_eager:  # CPU: also whole prefills (see vllm_offline.cpu_defaults: seeded requests crash
        # vLLM 0.32's CPU runner when a prefill is split across steps)
        cmd += ["--enforce-eager", "--no-enable-chunked-prefill",
                "--max-num-batched-tokens", str(max(cfg.max_model_len or 8192, 8192))]
    if cfg.max_model_len:
        cmd += ["--max-model-len", str(cfg.max_model_len)]
    return cmd + list(cfg.extra_args)


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class VLLMServer:
    """A running (or startable) vLLM server; a context manager that starts and stops it.

    Args:
        model: 'smollm2', an HF folder or a .gguf (resolved and converted like every engine's model).
        cfg: server settings. python: interpreter with vLLM (default: ``.venv-vllm``'s).
        log_path: where the server's output goes (default: a temporary file).
    """

    def __init__(self, model: str, cfg: VLLMServerConfig | None = None, python: str | None = None,
                 log_path: Path | None = None) -> None:
        self.model, self.cfg = model, cfg or VLLMServerConfig()
        self.python, self.log_path = python, log_path
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``."""
        return f"http://{self.cfg.host}:{self.cfg.port}/v1"

    def start(self) -> VLLMServer:
        """Launch the server and wait until it answers (raises :class:`VLLMServerError` with its log otherwise)."""
        from infra.engine_envs import engine_env, require_engine_python
        from training.generation.models import resolve_model

        python = self.python or str(require_engine_python("vllm"))
        if self.cfg.port == 0:
            self.cfg = self.cfg.model_copy(update={"port": _free_port(self.cfg.host)})
        path = str(resolve_model(self.model))
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        extra = {"VLLM_CPU_KVCACHE_SPACE": f"{self.cfg.kv_cache_gib:g}"}
        if self.cfg.token:
            extra["VLLM_API_KEY"] = self.cfg.token
        with open(self.log_path, "ab") as fh:
            self.proc = subprocess.Popen(serve_command(self.cfg, path, python), env=engine_env(extra), stdout=fh,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.cfg.token}"} if self.cfg.token else {}

    def wait_healthy(self) -> None:
        """Poll ``/health`` then ``/v1/models`` until both answer 200 (or the process dies / time runs out)."""
        import httpx

        root = f"http://{self.cfg.host}:{self.cfg.port}"
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        t0 = time.monotonic()
        with httpx.Client(timeout=5.0, headers=self._headers()) as http:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    code = None if self.proc is None else self.proc.returncode
                    raise VLLMServerError(f"vLLM server exited with status {code} while starting; "
                                          f"log {self.log_path}:\n{self.log_tail()}")
                try:
                    if (http.get(f"{root}/health").status_code == 200
                            and http.get(f"{root}/v1/models").status_code == 200):
                        log.info("vLLM server healthy after %.1f s at %s", time.monotonic() - t0, self.base_url)
                        return
                except httpx.TransportError:
                    pass
                time.sleep(1.0)
        raise VLLMServerError(f"vLLM server not healthy after {self.cfg.startup_timeout_s:.0f} s; "
                              f"log {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        """The last ``n`` characters of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-n:] if self.log_path else ""
        except OSError:
            return ""

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM the server's process group (engine workers included); SIGKILL after ``grace_s``."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):  # workers left in the group
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.returncode

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

