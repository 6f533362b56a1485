"""Progress of long library loops (embedding, rollouts, scoring, training) with counts, rates and ETA.

Library code reports progress without knowing who shows it::

    with progress.track("embedding", total=n_shards, unit="shard") as bar:
        for shard in shards:
            ...
            bar.advance()

Each update goes to the registered sinks as a :class:`ProgressEvent`. The CLI registers :class:`TerminalSink`
(a rich progress bar on a terminal, timer lines otherwise); the task layer registers a sink that keeps one
Prefect progress artifact per tracked loop up to date and one that writes the same timer lines into the flow run's
log (``tasks/progress.py``: a deployment run on a worker has no terminal). Timer lines come from :class:`LineSink`.
With no sink registered, updates only cost a clock read. Sinks are throttled (``min_interval_s``) except for the
first and last event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)


class ProgressEvent(BaseModel):
    """One progress update of a tracked loop."""

    model_config = ConfigDict(frozen=True)

    key: str = Field(description="Unique id of the tracked loop (name + counter).")
    name: str = Field(description="What is being done (embedding, rollouts exsearch, scoring...).")
    done: float = Field(description="Units done.")
    total: float | None = Field(description="Units in all (None = unknown).")
    unit: str = Field(description="Unit name (shard, trajectory, step...).")
    elapsed_s: float = Field(description="Seconds since the loop started.")
    finished: bool = Field(default=False, description="Last event of the loop.")
    note: str | None = Field(default=None, description="Latest extra figure of the loop (e.g. ``loss 1.23``).")

    @property
    def rate(self) -> float | None:
        """Units per second so far."""
        return self.done / self.elapsed_s if self.elapsed_s > 0 and self.done > 0 else None

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate (None when unknown)."""
        if self.total is None or self.rate is None:
            return None
        return max(0.0, (self.total - self.done) / self.rate)

    @property
    def fraction(self) -> float | None:
        """Done / total in [0, 1] (None when the total is unknown)."""
        return None if not self.total else min(1.0, self.done / self.total)

    def describe(self) -> str:
        """``embedding: 3/10 shard (30%) 0.52 shard/s ETA 13s`` (whole numbers whole: 1048576, not 1.04858e+06),
        then ``; <note>`` when the loop gave one (``sft warmup: 3/8 step (38%) 0.04 step/s ETA 2m05s; loss 1.79``)."""
        total = f"/{format_count(self.total)}" if self.total is not None else ""
        pct = f" ({100 * self.fraction:.0f}%)" if self.fraction is not None else ""
        rate = f" {format_rate(self.rate)} {self.unit}/s" if self.rate is not None else ""
        eta = f" ETA {format_seconds(self.eta_s)}" if self.eta_s is not None and not self.finished else ""
        end = f" done in {format_seconds(self.elapsed_s)}" if self.finished else ""
        note = f"; {self.note}" if self.note else ""
        return f"{self.name}: {format_count(self.done)}{total} {self.unit}{pct}{rate}{eta}{end}{note}"

    def at(self, now_elapsed_s: float) -> ProgressEvent:
        """The same state seen ``now_elapsed_s`` after the loop started (a timer line between updates)."""
        return self.model_copy(update={"elapsed_s": max(self.elapsed_s, now_elapsed_s)})


def format_rate(x: float) -> str:
    """``886012.3`` -> ``886012``, ``0.5234`` -> ``0.523`` (no exponent)."""
    return str(int(round(x))) if x >= 100 else f"{x:.3g}"


def format_count(x: float) -> str:
    """``3.0`` -> ``3``, ``1048576.0`` -> ``1048576``, ``2.5`` -> ``2.5``."""
    return str(int(x)) if float(x).is_integer() else f"{x:.4g}"


def format_seconds(seconds: float) -> str:
    """``75`` -> ``1m15s``; ``4000`` -> ``1h06m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


Sink = Callable[[ProgressEvent], None]
_SINKS: list[tuple[Sink, float]] = []
_COUNTER = iter(range(1, 1 << 62))
_LOCK = threading.Lock()


def register_sink(sink: Sink, min_interval_s: float = 2.0) -> None:
    """Send progress events to ``sink`` at most every ``min_interval_s`` per loop (idempotent)."""
    if all(s is not sink for s, _ in _SINKS):
        _SINKS.append((sink, min_interval_s))


def unregister_sink(sink: Sink) -> None:
    """Stop sending events to ``sink``."""
    _SINKS[:] = [(s, i) for s, i in _SINKS if s is not sink]


def has_sink(kind: type) -> bool:
    """True when a sink of class ``kind`` is registered (e.g. the CLI's :class:`TerminalSink`)."""
    return any(isinstance(s, kind) for s, _ in _SINKS)


class Tracker:
    """Progress of one loop; use :func:`track` to get one."""

    def __init__(self, name: str, total: float | None, unit: str) -> None:
        with _LOCK:
            self.key = f"{name}#{next(_COUNTER)}"
        self.name, self.total, self.unit = name, total, unit
        self.done = 0.0
        self.note: str | None = None
        self.start = time.monotonic()
        self._last: dict[int, float] = {}

    def advance(self, n: float = 1) -> None:
        """Add ``n`` units done."""
        self.update(self.done + n)

    def update(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Set the units done (and the total when it becomes known, and the loop's latest note, e.g. its loss)."""
        self.done = done
        if total is not None:
            self.total = total
        if note is not None:
            self.note = note
        self._emit(finished=False)

    def _emit(self, finished: bool) -> None:
        if not _SINKS:
            return
        now = time.monotonic()
        event = ProgressEvent(key=self.key, name=self.name, done=self.done, total=self.total, unit=self.unit,
                              elapsed_s=now - self.start, finished=finished, note=self.note)
        for sink, interval in list(_SINKS):
            last = self._last.get(id(sink))
            if not finished and last is not None and now - last < interval:
                continue
            self._last[id(sink)] = now
            try:
                sink(event)
            except Exception as exc:  # noqa: BLE001 - showing progress must never break the work
                log.debug("progress sink %r failed: %s", sink, exc)


@contextmanager
def track(name: str, total: float | None = None, unit: str = "item") -> Iterator[Tracker]:
    """Track a loop (see module docstring); the final event is sent when the block exits, even on error."""
    tracker = Tracker(name, total, unit)
    tracker._emit(finished=False)
    try:
        yield tracker
    finally:
        tracker._emit(finished=True)


class LineSink:
    """A line per running loop every ``line_interval_s`` from a timer, whether or not a new update came (a long step
    still shows it is alive, with its elapsed time and an ETA from the rate so far); a loop with no work done yet
    gets no line, and a loop that ends before its first timer line prints nothing (a per-question loop does not
    print 2 lines per question); a loop that printed gets a last ``done in`` line.

    Subclasses say where a line goes (:meth:`_write`) and what a loop needs from the thread that started it
    (:meth:`_bind`, called on the loop's first event in that thread; ``None`` = show nothing for this loop).
    ``clock`` is the timer's clock (tests pass a fake one and call :meth:`tick`)."""

    def __init__(self, line_interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.line_interval_s = line_interval_s
        self.clock = clock
        self._live: dict[str, tuple[ProgressEvent, float, object]] = {}  # key -> (latest event, start, target)
        self._printed: set[str] = set()
        self._lock = threading.Lock()
        self._timer: threading.Thread | None = None
        self._stop = threading.Event()

    def _bind(self, event: ProgressEvent) -> object | None:
        """What :meth:`_write` needs for this loop (captured in the loop's own thread); None = no lines."""
        return True

    def _write(self, event: ProgressEvent, target: object) -> None:
        raise NotImplementedError

    def __call__(self, event: ProgressEvent) -> None:
        with self._lock:
            live = self._live.get(event.key)
            if event.finished:
                self._live.pop(event.key, None)
                if live is not None and event.key in self._printed and event.done > 0:
                    self._printed.discard(event.key)
                    self._write(event, live[2])
                return
            target = live[2] if live is not None else self._bind(event)
            if target is None:
                return
            self._live[event.key] = (event, self.clock() - event.elapsed_s, target)
        self._ensure_timer()

    def tick(self) -> None:
        """Write one line per running loop that has done some work (the timer calls this)."""
        now = self.clock()
        with self._lock:
            for key, (event, start, target) in list(self._live.items()):
                if event.done > 0:
                    self._printed.add(key)
                    self._write(event.at(now - start), target)

    def close(self) -> None:
        """Stop the timer thread (it also stops by itself when no loop runs)."""
        self._stop.set()

    def _ensure_timer(self) -> None:
        if self._timer is not None and self._timer.is_alive():
            return

        def run() -> None:
            while not self._stop.wait(self.line_interval_s):
                with self._lock:
                    idle = not self._live
                if idle:
                    break
                self.tick()

        self._timer = threading.Thread(target=run, name="progress-lines", daemon=True)
        self._timer.start()


class TerminalSink(LineSink):
    """Progress in the terminal (stderr): a rich bar per loop on a TTY, else :class:`LineSink` lines
    (``progress <describe>``)."""

    def __init__(self, console: object | None = None, line_interval_s: float = 30.0) -> None:
        from rich.console import Console

        super().__init__(line_interval_s)
        self.console = console or Console(stderr=True)
        self._progress = None
        self._tasks: dict[str, object] = {}

    def __call__(self, event: ProgressEvent) -> None:
        if getattr(self.console, "is_terminal", False):
            self._bar(event)
            return
        super().__call__(event)

    def _write(self, event: ProgressEvent, target: object) -> None:
        self.console.print(f"[dim]progress[/] {event.describe()}", highlight=False)  # type: ignore[attr-defined]

    def _bar(self, event: ProgressEvent) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        if self._progress is None:  # ETA from our own rate since the start: rich's windowed estimate shows
            # -:--:-- whenever updates come less often than its 30 s window (held-out rollouts, training steps)
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[eta]}"),
                                      console=self.console, transient=False)
            self._progress.start()
        rate = f"{format_rate(event.rate)} {event.unit}/s" if event.rate else ""
        eta = f"ETA {format_seconds(event.eta_s)}" if event.eta_s is not None else ""
        task = self._tasks.get(event.key)
        if task is None:
            task = self._progress.add_task(event.name, total=event.total, rate=rate, eta=eta)
            self._tasks[event.key] = task
        self._progress.update(task, completed=event.done, total=event.total, rate=rate, eta=eta)
        if event.finished:
            self._progress.stop_task(task)
            self._tasks.pop(event.key, None)
            if not self._tasks:
                self._progress.stop()
                self._progress = None
