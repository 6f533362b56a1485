"""Process memory settings for long CPU training runs: a fixed glibc mmap threshold.

glibc raises its mmap threshold every time a large block is freed (up to 32 MiB), after which tensors of up to that
size are carved from the ``brk`` heap, which can only shrink from its top. A PyTorch training loop that allocates
and frees activations of many sizes then grows its heap without bound: a SmolLM2-135M GRPO run measured 9.9 GB of
``[heap]`` after one step and was OOM-killed at 18.2 GB RSS. Setting the threshold explicitly disables the dynamic
adjustment (``mallopt(3)``), so tensors above it go back to the OS when freed; the heap below it is bounded by
trimming (:func:`trim_on_growth`). No-op off glibc.

The price is speed: every tensor above the threshold is a fresh ``mmap`` whose pages fault in on first touch. With
the threshold fixed at 128 KiB for the whole CLI process (sessions 12-14), the held-out evaluation of the demo
preset took 68.6 s instead of 36.3 s (15.1 M minor page faults, 41 s of system time, against 0.5 M and 3 s), and
large bf16 matmuls ran 1.1-1.45x slower. In a GRPO step of ``research_hops_learn_cpu`` the 128 KiB threshold cost
12.3 M minor faults and 28.8 s of system CPU in a 66 s step; fixed at 32 MiB (:data:`TRAINING_THRESHOLD`), with the
heap trimmed after each optimizer step when it grew by more than :data:`GROWTH_TRIM_BYTES`, the step took 52 s
(1.26x the trajectories per minute; 2.9 M faults, 9.6 s system CPU) with a peak 1 GB higher (5.19 against 4.15 GB;
``docs/results/engines/session26/``). Fixing it at all still matters: it stops glibc from re-tuning the threshold
and the trim threshold as blocks are freed. Only the TRL training loop fixes it (``training.rl.trl_engine``, where
the growth was measured); everything else keeps glibc's dynamic threshold and calls :func:`trim_heap` after a
large phase. Once fixed, the threshold stays fixed for the process, so the generation phases that follow training
in the same process (each GRPO step's rollouts, the final held-out evaluation) paid the page faults too: they run
inside :func:`inference_heap`, which raises the threshold to glibc's dynamic maximum for the phase, then trims the
heap and restores the training threshold.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import sys
from collections.abc import Iterator

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers from glibc's malloc.h
DEFAULT_THRESHOLD = 128 * 1024  # glibc's own starting value
INFERENCE_THRESHOLD = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: where the dynamic one stops
#: the threshold :func:`fix_mmap_threshold` fixes for a training loop when not given one; with
#: :func:`trim_on_growth` after every optimizer step (``training.rl.trl_engine``) that bounds the heap. The switch for
#: ``benchmarks/grpo_step.py``'s variants ``mmap128k`` / ``mmap4m`` (sessions 12-25 trained at 128 KiB)
TRAINING_THRESHOLD = INFERENCE_THRESHOLD
_applied: int | None = None
#: switch for benchmarks (``benchmarks/grpo_step.py`` variant ``fixed_heap``, ``benchmarks/heldout_eval.py`` variant
#: ``trained``): False runs generation phases on the training threshold, as before :func:`inference_heap`
INFERENCE_HEAP = True


def _libc() -> ctypes.CDLL | None:
    """glibc (or the C library) of this Linux process; None elsewhere or when it cannot be found."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def fix_mmap_threshold(threshold: int | None = None) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes (default :data:`TRAINING_THRESHOLD`) for this process; True
    when applied (Linux glibc only)."""
    global _applied
    threshold = TRAINING_THRESHOLD if threshold is None else threshold
    if _applied == threshold:
        return True
    libc = _libc()
    try:
        ok = libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except AttributeError:  # musl and other libcs have no mallopt
        return False
    if ok:
        _applied = threshold
        log.debug("glibc mmap threshold fixed at %d bytes", threshold)
    return ok


def fixed_threshold() -> int | None:
    """The mmap threshold :func:`fix_mmap_threshold` fixed in this process (None: glibc's dynamic threshold)."""
    return _applied


@contextlib.contextmanager
def inference_heap(threshold: int = INFERENCE_THRESHOLD, force: bool = False) -> Iterator[bool]:
    """A generation phase inside a process whose threshold is fixed for training: blocks up to ``threshold`` bytes
    come from the heap and are reused (as with glibc's dynamic threshold at its maximum; the trim threshold twice
    that, as glibc sets it), then the heap is trimmed and the training threshold restored. The trim threshold stays
    raised, as a dynamic phase before the fix (a start evaluation) leaves it; the trims after each phase and each
    training step (:func:`trim_on_growth`) give back what it would hold. Yields True when it changed anything; a
    process on the dynamic threshold (or off glibc) is left as it is, unless ``force``: then the phase runs at
    ``threshold`` from its first block (glibc's dynamic threshold only climbs there block by block: a 60-question
    evaluation ran 1.21x faster, docs/results/engines/cpu_session22.md) and the process leaves it with the training
    threshold fixed (:data:`TRAINING_THRESHOLD`), for callers that train next or end (an RL flow's start evaluation)."""
    global _applied
    previous = _applied if _applied is not None else (TRAINING_THRESHOLD if force else None)
    libc = _libc() if previous is not None and INFERENCE_HEAP else None
    changed = False
    if libc is not None:
        try:
            changed = bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
            if changed:
                libc.mallopt(M_TRIM_THRESHOLD, 2 * int(threshold))
        except AttributeError:  # musl and other libcs have no mallopt
            changed = False
    try:
        yield changed
    finally:
        if changed and libc is not None and previous is not None:
            libc.mallopt(M_MMAP_THRESHOLD, int(previous))
            _applied = previous
            trim_heap()


def trim_heap() -> bool:
    """Return the heap's free pages to the OS now (glibc ``malloc_trim(0)``: free chunks anywhere in the heap, not
    only at its top); True when called. For processes that keep glibc's dynamic threshold (fast: tensors are reused
    from the heap) between phases that allocate a lot, e.g. after a held-out evaluation. No-op off glibc."""
    libc = _libc()
    if libc is None:
        return False
    try:
        libc.malloc_trim(0)
    except AttributeError:  # musl and other libcs have no malloc_trim
        return False
    return True


#: anonymous memory (bytes) after the last :func:`trim_on_growth` trim, None before the first call
_anon_after_trim: int | None = None
#: how much anonymous memory may grow over its level after the last trim before :func:`trim_on_growth` trims again
#: (the switch for ``benchmarks/heldout_eval.py``'s variant ``no_growth_trim``: 0 disables it)
GROWTH_TRIM_BYTES = 512 * 1024 * 1024


def anon_bytes() -> int | None:
    """This process's anonymous resident memory (``RssAnon``), in bytes; None off Linux."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def trim_on_growth(step: int | None = None) -> bool:
    """Trim the heap when anonymous memory grew by more than ``step`` bytes (default :data:`GROWTH_TRIM_BYTES`) since
    the last trim here; True when it trimmed. Called after each generation call.

    Why: with blocks up to 32 MiB served from the heap (glibc's dynamic threshold at its maximum, or
    :func:`inference_heap`), a generation phase's KV caches, which grow by one column per decode step and are freed
    row by row, leave free chunks too small for the next, larger requests. A 200-question held-out evaluation of
    SmolLM2-135M grew to 4.4 GB of anonymous memory, of which 3.4 GB were free chunks that only the trim at its end
    gave back. Trimming as it grows kept it at about 2.2 GB through three quarters of that evaluation, but the peak
    hardly moved (4.2 GB): by the end the growth is live (the prefix KV store fills up). On 120 questions the peak
    went 3.68 -> 3.62 GB (3.77 -> 3.54 GB on an RL flow's path) at 0.95-1.03x the speed, identical answers
    (``docs/results/engines/cpu_session23.md``). The price is the page faults of re-touching what was returned.
    """
    global _anon_after_trim
    step = GROWTH_TRIM_BYTES if step is None else step
    now = anon_bytes()
    if step <= 0 or now is None:
        return False
    if _anon_after_trim is None or now < _anon_after_trim:
        _anon_after_trim = now  # first call, or memory went down since (freed to the OS by mmap or a trim elsewhere)
        return False
    if now - _anon_after_trim <= step:
        return False
    trimmed = trim_heap()
    _anon_after_trim = anon_bytes() or now
    return trimmed


def peak_rss() -> dict[str, float]:
    """Peak resident memory so far, in GB: this process (``self``) and its largest waited-for child (``children``:
    LLaMA-Factory, a verl or vLLM worker). Linux reports ``ru_maxrss`` in KiB."""
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale
    return {"self": own / 1e9, "children": kids / 1e9}


def peak_rss_line() -> str:
    """One line for the end of a flow: ``peak RSS: 4.21 GB (largest child process 2.03 GB)``."""
    peak = peak_rss()
    child = f" (largest child process {peak['children']:.2f} GB)" if peak["children"] > 0.01 else ""
    return f"peak RSS: {peak['self']:.2f} GB{child}"
