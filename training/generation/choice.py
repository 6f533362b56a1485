"""``backend: auto``: the generation engine picked by a measurement made on this machine (issue 26 item 3).

Which engine is faster depends on the machine and the workload: on this project's 2-core AVX512-BF16 CPU our batched
transformers engine ran search rollouts 2.6-2.7x faster than vLLM's CPU backend (``docs/results/engines/README.md``),
while vLLM is built for GPUs. So no engine is the default by decree. ``benchmarks/heldout_eval.py --record`` times
the transformers engine and the offline vLLM engine (``.venv-vllm``) on the same held-out rollouts, and writes the
faster one, with the ratio and the machine it was measured on, to ``<home>/engine_choice.json``;
``backend: auto`` (the default of :class:`~training.generation.config.GeneratorSpec`) then opens that engine on a
machine with the same key (:func:`machine_key`: device, CPU model, core count, native bf16).

The documented rule where nothing was measured on this machine: ``transformers`` (it runs everywhere, in process,
and was the faster engine on every CPU measurement made here), with a log line naming the command that measures.
A recorded ``vllm`` falls back to ``transformers`` when ``.venv-vllm`` is gone.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FILE = "engine_choice.json"
#: the engines a measurement chooses between (per-request engines: ``openai`` needs a server the user runs)
CHOICES = ("transformers", "vllm")
DEFAULT = "transformers"
MEASURE = "PYTHONPATH=. python benchmarks/heldout_eval.py --variants today,vllm --record"


def choice_path() -> Path:
    """``<home>/engine_choice.json``."""
    from infra.settings import get_settings

    return get_settings().home / FILE


def machine_key() -> str:
    """What a measurement holds for: the device (a GPU's name, else ``cpu``), the CPU model, its core count and
    whether it has native bf16."""
    from infra.machine import cpu_native_bf16

    device = "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            device = f"cuda:{torch.cuda.get_device_name(0)}"
    except ImportError:  # pragma: no cover - torch is a core dependency
        pass
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{device} | {model} | {os.cpu_count()} cores | native bf16 {cpu_native_bf16()}"


def record_choice(winner: str, seconds: dict[str, float], note: str = "", path: Path | None = None) -> Path:
    """Record ``winner`` (one of :data:`CHOICES`) for this machine with each engine's measured ``seconds``; the file
    is rewritten through a temporary file and a rename, other machines' entries kept."""
    if winner not in CHOICES:
        raise ValueError(f"winner must be one of {CHOICES}, got {winner!r}")
    path = path or choice_path()
    data = _read(path)
    data[machine_key()] = {"backend": winner, "seconds": seconds, "note": note,
                           "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return path


def pick_backend(path: Path | None = None) -> str:
    """The engine ``backend: auto`` opens on this machine (see the module docstring)."""
    path = path or choice_path()
    entry = _read(path).get(machine_key())
    if entry is None:
        log.info("backend auto: no engine measurement for this machine in %s, using %s (measure: %s)", path,
                 DEFAULT, MEASURE)
        return DEFAULT
    backend = entry.get("backend", DEFAULT)
    if backend == "vllm" and not _vllm_available():
        log.warning("backend auto: vllm was measured faster here but .venv-vllm is missing (make vllm-env); "
                    "using %s", DEFAULT)
        return DEFAULT
    log.info("backend auto: %s (measured %s: %s)", backend, entry.get("measured", "?"), entry.get("seconds", {}))
    return backend if backend in CHOICES else DEFAULT


def _vllm_available() -> bool:
    try:
        import vllm  # noqa: F401

        return True
    except ImportError:
        from infra.settings import REPO_ROOT

        return (REPO_ROOT / ".venv-vllm" / "bin" / "python").exists()


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("backend auto: ignoring unreadable %s (%s); delete it or measure again: %s", path, exc, MEASURE)
        return {}
    return data if isinstance(data, dict) else {}
