"""``backend: auto``: the generation engine picked by a measurement made on this machine (issue 26 item 3).

Which engine is faster depends on the machine and on the workload: on this project's 2-core AVX512-BF16 CPU vLLM's
CPU backend evaluated 210 held-out questions 1.23x faster than our batched transformers engine but took 23 s longer to
start (``docs/results/engines/README.md``), so for a few questions ours wins; in session 7, on an AVX2-only CPU in
fp32, vLLM was 0.37x ours. So no engine is the default by decree. ``benchmarks/heldout_eval.py --record`` times both
engines (start and per question) on the same held-out rollouts and writes them, with the machine they were
measured on, to ``<home>/engine_choice.json``. ``backend: auto`` (the default of
:class:`~training.generation.config.GeneratorSpec`) then opens, for a caller that says how many questions it will
roll out, the engine with the lower ``start + questions x per-question`` time measured on a machine with the same
key (:func:`machine_key`: device, CPU model, core count, native bf16).

The documented rule where nothing was measured on this machine, or the caller does not say its size:
``transformers`` (it runs everywhere, in process, starts in seconds), with a log line naming the command that
measures. A recorded ``vllm`` falls back to ``transformers`` when ``.venv-vllm`` is gone.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
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
    import torch

    from infra.machine import cpu_model, cpu_native_bf16

    device = f"cuda:{torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"
    return f"{device} | {cpu_model()} | {os.cpu_count()} cores | native bf16 {cpu_native_bf16()}"


def record_choice(costs: dict[str, dict[str, float]], items: int, note: str = "", path: Path | None = None) -> Path:
    """Record each engine's measured ``{"load_s": start seconds, "per_item_s": seconds per question}`` (engines of
    :data:`CHOICES`) for this machine, measured on ``items`` questions; the file is rewritten through a temporary
    file and a rename, other machines' entries kept."""
    unknown = set(costs) - set(CHOICES)
    if unknown or not costs:
        raise ValueError(f"costs must name engines of {CHOICES}, got {sorted(costs)}")
    for name, c in costs.items():
        if set(c) != {"load_s", "per_item_s"} or min(c.values()) < 0:
            raise ValueError(f"{name}: need non-negative load_s and per_item_s, got {c}")
    from infra import artifacts

    path = path or choice_path()
    data = _read(path)
    data[machine_key()] = {"costs": costs, "items": items, "note": note,
                           "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    artifacts.write_json(str(path), data)  # temporary file, then rename
    return path


def pick_backend(items: int | None = None, path: Path | None = None) -> str:
    """The engine ``backend: auto`` opens on this machine for a workload of ``items`` questions (see the module
    docstring)."""
    path = path or choice_path()
    entry = _read(path).get(machine_key())
    costs = entry.get("costs") if isinstance(entry, dict) else None
    if not isinstance(costs, dict) or not costs:
        log.info("backend auto: no engine measurement for this machine in %s, using %s (measure: %s)", path,
                 DEFAULT, MEASURE)
        return DEFAULT
    if items is None:
        log.info("backend auto: the caller gave no workload size, using %s", DEFAULT)
        return DEFAULT
    usable = {k: v for k, v in costs.items() if k in CHOICES and _valid(v) and (k != "vllm" or _vllm_available())}
    if not usable:
        return DEFAULT
    times = {k: v["load_s"] + items * v["per_item_s"] for k, v in usable.items()}
    best = min(times, key=times.__getitem__)
    log.info("backend auto: %s for %d questions (expected s: %s; measured %s)", best, items,
             {k: round(t, 1) for k, t in times.items()}, entry.get("measured", "?"))
    return best


def _vllm_available() -> bool:
    """vLLM in this environment (found, not imported) or in ``.venv-vllm`` (the ``vllm`` backend uses either)."""
    import importlib.util

    from infra.engine_envs import engine_python

    return importlib.util.find_spec("vllm") is not None or engine_python("vllm") is not None


def _valid(cost: Any) -> bool:
    """A cost entry as :func:`record_choice` writes it (a hand-edited file may hold anything)."""
    return (isinstance(cost, dict) and all(isinstance(cost.get(k), (int, float)) and cost[k] >= 0
                                           for k in ("load_s", "per_item_s")))


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("backend auto: ignoring unreadable %s (%s); delete it or measure again: %s", path, exc, MEASURE)
        return {}
    return data if isinstance(data, dict) else {}
