"""What a measurement ran on: CPU feature flags, native bf16, threads, load — one place for every benchmark and for
the dtype choices that depend on the CPU (``training.generation.base.cpu_dtype``, TRL's ``precision: bf16`` check).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

#: the flags that decide a CPU's matmul speed per dtype (reported by every benchmark)
SPEED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_flags() -> set[str]:
    """The CPU feature flags of ``/proc/cpuinfo`` (empty where it is not readable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``platform.processor()`` where it is not readable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_native_bf16() -> bool:
    """Whether this CPU has native bf16 matmuls (AMX tiles or AVX512-BF16). Without them bf16 is emulated: vLLM
    0.32's CPU runner falls back from oneDNN to torch linears and ran ~19x slower than fp32 here (AVX2 only:
    6 ExSearch prompts x 24 tokens took 419.5 s in bf16, 21.9 s in fp32)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def native_bf16() -> bool:
    """Whether bf16 math is native on the device torch trains on: a CUDA device that supports it, else this CPU
    (:func:`cpu_native_bf16`). Decides ``precision: auto`` (TRL GRPO) and ``bf16: auto`` (SFT)."""
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    return cpu_native_bf16()


def describe(dtype: str | None = None, **workload: Any) -> dict[str, Any]:
    """The record a benchmark prints with its numbers: dtype, speed-relevant CPU flags, native bf16, torch threads,
    cores, load average (1/5/15 min), nice, versions, and the workload shape passed as keywords."""
    info: dict[str, Any] = {
        "dtype": dtype, "cpu_flags": [f for f in SPEED_FLAGS if f in cpu_flags()], "native_bf16": cpu_native_bf16(),
        "cpus": os.cpu_count(), "load_1_5_15": [round(x, 2) for x in os.getloadavg()], "nice": os.nice(0),
        "python": platform.python_version(),
    }
    try:
        import torch

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    if workload:
        info["workload"] = workload
    return info
