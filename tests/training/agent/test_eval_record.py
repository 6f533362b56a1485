"""One evaluation record for every loop: EM, RL and SmartSearch evaluation of a checkpoint all return an
``evaluation.metrics.ScoreTable`` (EM's ``EvalRef`` is one that also names its stage directory), and an EM evaluation
manifest written before that (no rows, only the pooled ``metrics`` and the table file) still loads on resume.

The rollouts are replaced by a fake ``evaluate_dataset`` that writes fixed per-example metrics (unit-test fake);
everything after it (aggregation, manifests, records) is the real code."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from evaluation.metrics import ScoreTable
from evaluation.report import render_table
from infra import artifacts
from infra.config import load_config
from training.agent import evaluate as agent_eval
from training.em import stages as em
from training.em.config import EMLoopConfig
from training.em.records import EvalRef
from training.rl.config import RLConfig
from training.rl.stages import evaluate_rl_checkpoint
from training.smartsearch.config import SmartSearchConfig
from training.smartsearch.stages import evaluate_model


def _fake_evaluate_dataset(cfg, dataset, out_dir, generator=None, searcher=None):  # noqa: ANN001, ANN202
    stem = Path(dataset).name.removesuffix(".jsonl")
    rows = [{"id": f"{stem}-{i}", "dataset": stem, "em": float(i % 2), "f1": 0.25 * i, "acc": float(i % 2),
             "format_ok": 1.0, "searches": float(i)} for i in range(4)]
    artifacts.write_jsonl(artifacts.join(str(out_dir), "examples.jsonl"), rows)
    return agent_eval.DatasetEvalRef(dataset=dataset, uri=str(out_dir), n=len(rows),
                                     means={"f1": sum(r["f1"] for r in rows) / len(rows)}, seconds=0.0)


@pytest.fixture
def fake_rollouts(monkeypatch):  # noqa: ANN001, ANN201
    from contextlib import nullcontext

    monkeypatch.setattr(agent_eval, "evaluate_dataset", _fake_evaluate_dataset)
    monkeypatch.setattr(em, "open_searcher", lambda spec: object())
    monkeypatch.setattr(em, "generator_session", lambda spec: nullcontext(object()))


def test_em_rl_smartsearch_evaluations_return_the_same_record(tmp_path, fake_rollouts) -> None:
    em_cfg = load_config(EMLoopConfig, "exsearch_cpu_demo", ["evaluation.n_resamples=50"])
    rl_cfg = load_config(RLConfig, "searchr1_learn_cpu")
    ss_cfg = load_config(SmartSearchConfig, "smartsearch_cpu_demo")

    em_ev = em.evaluate_checkpoint(em_cfg, "ckpt", tmp_path / "em")
    rl_ev = evaluate_rl_checkpoint(rl_cfg, "ckpt", str(tmp_path / "rl"))
    ss_ev = evaluate_model(ss_cfg, "ckpt", str(tmp_path / "ss"))

    assert type(rl_ev) is ScoreTable and type(ss_ev) is ScoreTable
    assert isinstance(em_ev, EvalRef) and isinstance(em_ev, ScoreTable)
    for ev in (em_ev, rl_ev, ss_ev):  # one reader for all three: rows, pooled row, flat MLflow names, report
        assert ev.rows and ev.pooled is ev.rows[-1] and "f1" in ev.pooled.metrics
        assert ev.flat()[f"{ev.pooled.dataset}/f1"] == ev.pooled.metrics["f1"].mean
        assert "f1" in render_table(ev)
    assert em_ev.f1 == em_ev.pooled.metrics["f1"] and em_ev.n == em_ev.pooled.n
    assert em_ev.numbers()["metrics.f1.mean"] == em_ev.f1.mean and "n" in em_ev.numbers()
    # the task layer promises the same type: every loop's evaluate task is annotated with a ScoreTable (subclass)
    import tasks.em
    import tasks.rl
    import tasks.smartsearch

    for mod in (tasks.em, tasks.rl, tasks.smartsearch):
        hint = typing.get_type_hints(mod.evaluate_task.fn)["return"]
        assert issubclass(hint, ScoreTable), (mod.__name__, hint)


def test_em_eval_record_resumes_from_new_and_old_manifests(tmp_path, fake_rollouts) -> None:
    cfg = load_config(EMLoopConfig, "exsearch_cpu_demo", ["evaluation.n_resamples=50"])
    first = em.evaluate_checkpoint(cfg, "ckpt", tmp_path / "eval")
    again = em.evaluate_checkpoint(cfg, "ckpt", tmp_path / "eval")  # complete: read back from the manifest
    assert again == first

    # a manifest as written before EvalRef was a ScoreTable: n, pooled metrics, table path, no rows
    manifest = tmp_path / "eval" / "manifest.json"
    doc = json.loads(manifest.read_text())
    old = {k: doc["data"][k] for k in ("n", "metrics", "table")}
    manifest.write_text(json.dumps({**doc, "data": old}))
    legacy = em.evaluate_checkpoint(cfg, "ckpt", tmp_path / "eval")
    assert legacy == first and legacy.f1.mean == old["metrics"]["f1"]["mean"]

    Path(old["table"]).unlink()
    with pytest.raises(ValueError, match="delete that stage directory"):
        em.evaluate_checkpoint(cfg, "ckpt", tmp_path / "eval")
