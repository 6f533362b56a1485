"""Where a held-out evaluation's memory goes (issue 26 item 4): anonymous memory during and after an RL preset's
held-out evaluation of ``--limit`` questions in a fresh process, the live tensors left afterwards, and glibc's view of
its heaps (``malloc_info``: free chunks, heap size) after the evaluation's own trim.

It answers "live or free?": memory that the trim gives back was free chunks (fragmentation of the heap the
generation phase ran on); memory that stays is live. ``--no-growth-trim`` turns ``infra.memory.trim_on_growth`` off
(the engine until session 23). Memory is not a timing, so this may run beside other work (its seconds then mean
nothing). Example::

    PYTHONPATH=. python benchmarks/eval_heap.py --preset r1searcher_hops_learn_cpu --model <warm-up> --limit 200
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import re
import tempfile
import threading
import time


def anon_mib() -> int:
    """RssAnon of this process in MiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) // 1024
    return -1


def heap_report(tag: str) -> str:
    """One line: anonymous memory, arenas, free chunks and the heaps' size from glibc's ``malloc_info``."""
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(suffix=".xml", delete=False) as tmp:
        path = tmp.name
    fh = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, fh)
    libc.fclose(fh)
    with open(path) as f:
        xml = f.read()
    os.remove(path)
    tail = xml[xml.rfind("</heap>"):]  # the process-wide totals follow the last arena
    rest = re.search(r'<total type="rest" count="\d+" size="(\d+)"/>', tail)
    current = re.search(r'<system type="current" size="(\d+)"/>', tail)
    free = int(rest.group(1)) >> 20 if rest else -1
    heaps = int(current.group(1)) >> 20 if current else -1
    arenas = xml.count('<heap nr=')
    return f"{tag}: anon {anon_mib()} MiB | arenas {arenas} | free chunks {free} MiB | heaps {heaps} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="r1searcher_hops_learn_cpu")
    parser.add_argument("--model", required=True, help="policy to evaluate (a warm-up checkpoint)")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--no-growth-trim", action="store_true", help="infra.memory.trim_on_growth off")
    parser.add_argument("overrides", nargs="*", help="preset overrides, key=value")
    args = parser.parse_args()

    peak = [0]

    def sample() -> None:
        t0, last = time.time(), 0.0
        while True:
            peak[0] = max(peak[0], anon_mib())
            if time.time() - last > 60:
                last = time.time()
                print(f"  t={last - t0:.0f}s anon {anon_mib()} MiB", flush=True)
            time.sleep(1)

    threading.Thread(target=sample, daemon=True).start()
    import infra.memory
    from flows.specs import resolve
    from training.rl.heldout import evaluate_heldout

    if args.no_growth_trim:
        infra.memory.GROWTH_TRIM_BYTES = 0
    cfg = resolve("rl-finetune", args.preset, [f"eval.limit={args.limit}", *args.overrides])
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        evaluate_heldout(cfg, args.model, os.path.join(tmp, "eval"))
        print(f"evaluation of {args.limit} questions: {time.time() - t0:.0f} s", flush=True)
    gc.collect()
    print(f"peak anon during the evaluation: {peak[0]} MiB", flush=True)
    print(heap_report("after the evaluation (its own trim done)"), flush=True)
    import torch

    live = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    print(f"live tensors: {len(live)}, {sum(t.untyped_storage().nbytes() for t in live) >> 20} MiB", flush=True)


if __name__ == "__main__":
    main()
