"""Progress tracking: counts, rates and ETA reach the registered sinks, throttled, with a final event."""

from __future__ import annotations

import io
import time

import pytest

from infra import progress


@pytest.fixture
def events():
    got: list[progress.ProgressEvent] = []
    progress.register_sink(got.append, min_interval_s=0.0)
    yield got
    progress.unregister_sink(got.append)


def test_track_reports_counts_rate_eta_and_finish(events) -> None:
    with progress.track("embedding shard 0", total=4, unit="passage") as bar:
        for _ in range(4):
            time.sleep(0.01)
            bar.advance()
    assert [e.done for e in events] == [0, 1, 2, 3, 4, 4] and events[-1].finished
    mid = events[2]
    assert mid.total == 4 and mid.fraction == 0.5 and mid.rate > 0 and mid.eta_s == pytest.approx(2 / mid.rate)
    assert mid.describe().startswith("embedding shard 0: 2/4 passage (50%)") and "ETA" in mid.describe()
    assert "done in" in events[-1].describe() and len({e.key for e in events}) == 1


def test_sinks_are_throttled_but_get_the_last_event() -> None:
    got: list[progress.ProgressEvent] = []
    progress.register_sink(got.append, min_interval_s=60.0)
    try:
        with progress.track("scoring", total=100, unit="trajectory") as bar:
            for _ in range(100):
                bar.advance()
    finally:
        progress.unregister_sink(got.append)
    assert [e.done for e in got] == [0, 100] and got[-1].finished


def test_a_failing_sink_never_breaks_the_loop(events) -> None:
    def boom(_event):
        raise RuntimeError("sink down")

    progress.register_sink(boom, 0.0)
    try:
        with progress.track("x", total=1) as bar:
            bar.advance()
    finally:
        progress.unregister_sink(boom)
    assert events[-1].done == 1


def test_terminal_sink_prints_on_a_timer_when_not_a_tty() -> None:
    """Not a terminal: a line per running loop on a timer even with no new update, no zero-work line, whole
    numbers whole, the last line only for a loop that printed before (a short loop prints nothing)."""
    from rich.console import Console

    buf = io.StringIO()
    sink = progress.TerminalSink(Console(file=buf, force_terminal=False, width=200), line_interval_s=0.2)
    progress.register_sink(sink, 0.0)
    try:
        with progress.track("quick", total=2, unit="question") as bar:
            bar.advance(2)  # ends before the first timer line: silent
        with progress.track("rollouts searchr1 (1 trajectories)", total=1048576, unit="token") as bar:
            time.sleep(0.5)  # no work yet: no line
            assert buf.getvalue() == ""
            bar.update(524288)
            time.sleep(0.7)  # no new update: the timer still prints, with a growing elapsed time
    finally:
        progress.unregister_sink(sink)
    lines = buf.getvalue().splitlines()
    assert len(lines) >= 3 and not [x for x in lines if "quick" in x or ": 0/" in x]
    assert lines[0].startswith("progress rollouts searchr1 (1 trajectories): 524288/1048576 token (50%)")
    assert "e+" not in buf.getvalue() and "ETA" in lines[0]
    assert lines[-1].startswith("progress rollouts searchr1 (1 trajectories): 524288/1048576 token (50%)")
    assert "done in" in lines[-1]


def test_format_seconds() -> None:
    assert [progress.format_seconds(s) for s in (5, 75, 4000)] == ["5s", "1m15s", "1h06m"]


def test_line_sink_lines_on_a_fake_clock() -> None:
    """A timer line carries the elapsed time of the clock, not of the last update: the ETA grows with a stalled
    step rather than freezing; no line before work is done; the loop's note (its loss) ends the line."""
    now = [100.0]
    got: list[str] = []

    class ListSink(progress.LineSink):
        def _write(self, event, target):
            got.append(event.describe())

    def event(done: float, elapsed: float, finished: bool = False) -> progress.ProgressEvent:
        return progress.ProgressEvent(key="k", name="sft warmup", done=done, total=8, unit="step",
                                      elapsed_s=elapsed, finished=finished, note="loss 2.25")

    sink = ListSink(line_interval_s=3600.0, clock=lambda: now[0])
    try:
        sink(event(0, 0.0))
        now[0] += 30
        sink.tick()
        assert got == []  # no zero-work line
        sink(event(2, 60.0))  # the update came 60 s into the loop, at clock 130
        now[0] += 60
        sink.tick()  # 120 s into the loop, no new update
        sink(event(8, 200.0, finished=True))
    finally:
        sink.close()
    assert got == ["sft warmup: 2/8 step (25%) 0.0167 step/s ETA 6m00s; loss 2.25",
                   "sft warmup: 8/8 step (100%) 0.04 step/s done in 3m20s; loss 2.25"]
