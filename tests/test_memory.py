"""infra.memory: the fixed glibc mmap threshold (a training loop's heap otherwise grows without bound) and the
generation phases that run on the heap inside such a process."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

#: the C library with malloc/free/memset typed for 64-bit pointers, for the child scripts below
LIBC = textwrap.dedent("""
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
""")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc mallopt")
def test_fixed_mmap_threshold_returns_freed_blocks_to_the_os() -> None:
    # After a 16 MiB block is freed glibc raises its threshold, so the next 8 MiB blocks come from the brk heap and
    # stay in RSS when freed below a live one; with the threshold fixed they are mmapped and returned.
    script = LIBC + textwrap.dedent("""
        import sys
        from infra.memory import fix_mmap_threshold, trim_heap
        if sys.argv[1] == "fixed":
            assert fix_mmap_threshold(128 << 10)  # glibc's starting value, fixed (training's until session 26)
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096
        big = libc.malloc(16 << 20); libc.free(big)          # raises the dynamic threshold to 16 MiB
        blocks = [libc.malloc(8 << 20) for _ in range(40)]   # 320 MiB
        for b in blocks:
            libc.memset(b, 1, 8 << 20)
        pin = libc.malloc(1024); libc.memset(pin, 1, 1024)   # a live block on top of the heap
        before = rss()
        for b in blocks:
            libc.free(b)
        if sys.argv[1] == "trim":
            assert trim_heap()
        print(before - rss())
    """)
    freed = {}
    for mode in ("dynamic", "fixed", "trim"):
        out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True)
        freed[mode] = int(out.stdout.strip())
    assert freed["fixed"] > 300 << 20, freed  # all 320 MiB went back to the OS
    assert freed["dynamic"] < freed["fixed"], freed
    assert freed["trim"] > 300 << 20, freed  # dynamic threshold + malloc_trim(0): the pages go back too


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc mallopt")
def test_inference_heap_reuses_blocks_then_restores_the_training_threshold() -> None:
    # With the threshold fixed (training), every 8 MiB block is a fresh mmap: 2,048 page faults each time it is
    # touched. Inside inference_heap the blocks come from the heap and are reused; after it the threshold is back,
    # and blocks freed under a live one go back to the OS again.
    script = LIBC + textwrap.dedent("""
        import resource, sys
        import infra.memory as m
        def faults_of_rounds():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(40):
                b = libc.malloc(8 << 20); libc.memset(b, 1, 8 << 20); libc.free(b)
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096
        with m.inference_heap() as changed:
            assert not changed  # dynamic threshold: nothing to change
        assert m.fix_mmap_threshold(m.DEFAULT_THRESHOLD) and m.fixed_threshold() == m.DEFAULT_THRESHOLD
        fixed = faults_of_rounds()
        with m.inference_heap() as changed:
            assert changed
            heap = faults_of_rounds()
        blocks = [libc.malloc(8 << 20) for _ in range(20)]
        for b in blocks:
            libc.memset(b, 1, 8 << 20)
        pin = libc.malloc(1024); libc.memset(pin, 1, 1024)
        before = rss()
        for b in blocks:
            libc.free(b)
        print(fixed, heap, before - rss())
    """)
    forced = textwrap.dedent("""
        import infra.memory as m
        with m.inference_heap(force=True) as changed:
            assert changed and m.fixed_threshold() is None  # raised for the phase only
        assert m.fixed_threshold() == m.TRAINING_THRESHOLD == 32 << 20  # left as training wants it
        m.TRAINING_THRESHOLD = 4 << 20  # a training loop's threshold, when set elsewhere (benchmarks/grpo_step.py)
        assert m.fix_mmap_threshold() and m.fixed_threshold() == 4 << 20
        with m.inference_heap() as changed:
            assert changed
        assert m.fixed_threshold() == 4 << 20  # restored to the training's own threshold
        m.INFERENCE_HEAP = False
        with m.inference_heap(force=True) as changed:
            assert not changed  # the benchmarks' switch
        print("ok")
    """)
    assert subprocess.run([sys.executable, "-c", forced], capture_output=True, text=True,
                          check=True).stdout.strip() == "ok"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    fixed, heap, freed = map(int, out.stdout.split())
    assert fixed > 40 * 2000, (fixed, heap)  # a fresh mmap per block
    assert heap < fixed / 10, (fixed, heap)  # reused heap blocks
    assert freed > 150 << 20, freed  # the training threshold is back: the 160 MiB went to the OS


def test_peak_rss_reports_this_process_and_children() -> None:
    import subprocess
    import sys

    from infra.memory import peak_rss, peak_rss_line

    before = peak_rss()
    assert 0.01 < before["self"] < 64  # GB: a Python process with pytest loaded, read as GB not KiB or bytes
    subprocess.run([sys.executable, "-c", "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"],
                   check=True)
    after = peak_rss()
    assert after["children"] >= 0.3  # the child's 300 MiB touched
    assert peak_rss_line().startswith("peak RSS: ") and "largest child process" in peak_rss_line()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc_trim")
def test_trim_on_growth_returns_free_heap_pages_once_growth_passes_its_step() -> None:
    # 40 x 8 MiB heap blocks freed below a live one stay resident (free chunks); trim_on_growth gives them back only
    # once anonymous memory grew by more than its step since its last trim, and resets its baseline after trimming.
    script = LIBC + textwrap.dedent("""
        from infra import memory
        libc.mallopt(-3, 32 << 20)                           # blocks up to 32 MiB from the heap (inference_heap)
        libc.mallopt(-1, 64 << 20)
        assert memory.trim_on_growth(256 << 20) is False     # first call: the baseline
        blocks, pins = [], []
        for _ in range(40):                                  # 320 MiB, each 8 MiB block below a live 64 KiB one
            blocks.append(libc.malloc(8 << 20)); libc.memset(blocks[-1], 1, 8 << 20)
            pins.append(libc.malloc(64 << 10)); libc.memset(pins[-1], 1, 64 << 10)
        for b in blocks:
            libc.free(b)
        high = memory.anon_bytes()
        assert high > 300 << 20, high                        # the holes stay resident
        assert memory.trim_on_growth(1 << 30) is False       # grew by less than 1 GiB: kept
        assert memory.anon_bytes() > high - (64 << 20)
        assert memory.trim_on_growth(256 << 20) is True      # grew by more than 256 MiB: trimmed
        assert memory.anon_bytes() < high - (256 << 20)
        assert memory.trim_on_growth(256 << 20) is False     # the baseline is the trimmed level now
        assert memory.trim_on_growth(0) is False             # 0 disables it
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_grpo_training_runs_at_32_mib_and_trims_after_each_step(monkeypatch) -> None:
    # The GRPO loop fixes the threshold at 32 MiB (session 26: 1.26x a step against 128 KiB) and bounds the heap by
    # trimming after every optimizer step (training.rl.trl_engine.heap_callback).
    import infra.memory as m
    from training.rl import trl_engine

    assert m.TRAINING_THRESHOLD == m.INFERENCE_THRESHOLD == 32 << 20
    calls: list = []
    monkeypatch.setattr(m, "trim_on_growth", lambda step=None: calls.append(step) or False)
    callback = trl_engine.heap_callback()
    for _ in range(3):
        callback.on_step_end(None, None, None)
    assert calls == [None, None, None]
