"""Progress of an SFT engine subprocess reaches the Prefect run log on a timer (issue 25 item 5): a deployment run
on a worker has no terminal, and the warm-up SFT left the worker's log and the UI's run log silent for minutes."""

from __future__ import annotations

import os
import sys

import pytest

from infra import progress

# a fake LLaMA-Factory: appends trainer_log.jsonl rows (LogCallback's layout) while it "trains", exits 0
ENGINE = ("import json, os, time\n"
          "os.chdir({root!r})\n"
          "time.sleep(0.4)\n"  # model loading: no step yet, so no line
          "for i in range(1, 4):\n"
          "    row = json.dumps({{'current_steps': i, 'total_steps': 3, 'loss': 2.5 - i / 2}})\n"
          "    open('engine/trainer_log.jsonl', 'a').write(row + '\\n')\n"
          "    time.sleep(0.5)\n")


class FakeRunLogger:
    """Stands in for ``get_run_logger()``: keeps the lines it is given."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str, *args: object) -> None:
        self.lines.append(msg % args if args else msg)


@pytest.fixture
def only_these_sinks(monkeypatch):
    """No sink from another test (e.g. a CLI test's TerminalSink) takes part."""
    monkeypatch.setattr(progress, "_SINKS", [])


def run_fake_engine(tmp_path, monkeypatch) -> None:
    from training.sft import launcher

    (tmp_path / "engine").mkdir()
    monkeypatch.setattr(launcher, "PROGRESS_POLL_S", 0.1)
    launcher._run_engine([sys.executable, "-c", ENGINE.format(root=str(tmp_path))], dict(os.environ), tmp_path,
                         timeout_s=60, name="sft warmup")


def test_sft_engine_steps_reach_the_run_logger_on_a_timer(tmp_path, monkeypatch, only_these_sinks) -> None:
    """Steps, total, loss and ETA of the engine's trainer_log.jsonl become timer lines in the run's logger; no
    line before the first step, whole numbers whole, a last ``done in`` line."""
    from tasks.progress import RunLogSink

    logger = FakeRunLogger()
    sink = RunLogSink(line_interval_s=0.2, run_logger=lambda: logger)
    progress.register_sink(sink, 0.0)
    try:
        run_fake_engine(tmp_path, monkeypatch)
    finally:
        sink.close()
    lines = logger.lines
    assert lines and all(x.startswith("progress sft warmup: ") for x in lines), lines
    assert not [x for x in lines if ": 0 step" in x or ": 0/" in x]  # never a zero-work line
    running = [x for x in lines if "ETA" in x]
    assert running and all("/3 step (" in x and "; loss " in x for x in running), lines
    assert "e+" not in "".join(lines) and "-:--:--" not in "".join(lines)
    assert lines[-1].startswith("progress sft warmup: 3/3 step (100%)") and "done in" in lines[-1]
    assert lines[-1].endswith("; loss 1")


def test_no_run_no_lines(tmp_path, monkeypatch, only_these_sinks) -> None:
    """Outside a Prefect run (no run logger) the sink stays quiet and the engine still runs."""
    from tasks.progress import RunLogSink

    sink = RunLogSink(line_interval_s=0.1)  # the real current_run_logger: None here
    progress.register_sink(sink, 0.0)
    try:
        run_fake_engine(tmp_path, monkeypatch)
    finally:
        sink.close()
    assert sink._live == {} and sink._printed == set()


@pytest.mark.parametrize("terminal", [False, True], ids=["worker", "cli"])
def test_sft_progress_is_in_the_flow_run_log(prefect_harness, tmp_path, monkeypatch, terminal: bool) -> None:
    """Inside a real flow and task run, the installed sink writes the SFT's progress lines into the task run's log
    on the Prefect server: through the run logger on a worker (no terminal sink), to the API only when the CLI's
    terminal sink already shows them."""
    import io

    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker
    from rich.console import Console

    import tasks.progress as tp

    monkeypatch.setattr(progress, "_SINKS", [])
    # a fresh sink: the shared one may still have a timer thread of an earlier test waiting out its 30 s interval
    # (test_progress_artifacts runs a loop through it), which a changed interval would not wake
    monkeypatch.setattr(tp, "RUN_LOG_SINK", tp.RunLogSink(line_interval_s=0.2))
    monkeypatch.setattr(tp, "LOG_UPDATE_INTERVAL_S", 0.0)
    tp.install()
    buf = io.StringIO()
    if terminal:
        progress.register_sink(progress.TerminalSink(Console(file=buf, force_terminal=False, width=200), 0.2), 0.0)

    @task(name="rl-warmup")
    def warmup() -> None:
        run_fake_engine(tmp_path, monkeypatch)

    @flow(name="progress-log-probe")
    def probe() -> None:
        warmup()

    import logging

    seen: list[str] = []  # what the run logger's own handlers get (Prefect's console handler: the worker's log)
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("prefect.task_runs").addHandler(handler)
    try:
        state = probe(return_state=True)
    finally:
        logging.getLogger("prefect.task_runs").removeHandler(handler)
    assert state.is_completed()
    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(
            flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    lines = [x.message for x in logs if x.message.startswith("progress ")]
    assert any(x.startswith("progress sft warmup: ") and "/3 step" in x and "ETA" in x for x in lines), lines
    assert all(x.task_run_id is not None for x in logs if x.message.startswith("progress "))
    assert not [x for x in lines if ": 0/" in x]
    assert ("progress sft warmup: " in buf.getvalue()) == terminal
    # the run logger's handlers (Prefect's console handler: the worker's log) get them, unless the terminal sink
    # already shows them (then they go to the API only)
    assert any(x.startswith("progress sft warmup: ") for x in seen) == (not terminal)


def test_trl_progress_callback_puts_loss_and_reward_in_the_line(only_these_sinks) -> None:
    """A TRL (GRPO) stage's steps carry its latest logged loss and reward; the summary log after the end adds no
    event (a loop that never finishes would print forever)."""
    from types import SimpleNamespace

    from training.rl.trl_engine import progress_callback

    events: list[progress.ProgressEvent] = []
    progress.register_sink(events.append, 0.0)
    cb = progress_callback("train grpo")
    state = SimpleNamespace(max_steps=2, global_step=0)
    cb.on_train_begin(None, state, None)
    state.global_step = 1
    cb.on_step_end(None, state, None)
    cb.on_log(None, state, None, logs={"loss": 0.0125, "reward": 0.5, "learning_rate": 1e-5})
    state.global_step = 2
    cb.on_step_end(None, state, None)
    cb.on_train_end(None, state, None)
    cb.on_log(None, state, None, logs={"train_loss": 0.01, "loss": 0.01})
    assert events[-1].finished and events[-1].describe().startswith("train grpo: 2/2 step (100%)")
    assert events[-1].describe().endswith("; loss 0.0125, reward 0.5")
