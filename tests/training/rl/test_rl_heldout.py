"""RL learning evidence: per-question rows carry the recipe's own reward (the TRL reward function), the learning
curve joins training health and held-out points across chained stages, the learn presets hold out dev questions
beyond the minis, and the held-out curve callback scores the live policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.config import load_config
from training.agent.records import Trajectory
from training.rl.config import RLConfig
from training.rl.heldout import heldout_rows


class _Tok:
    eos_token_id = 2


def _traj(qid: str, response: str, answer: str | None, golds: list[str], ok: bool, searches: int) -> Trajectory:
    return Trajectory(question_id=qid, question=f"q {qid}?", golden_answers=golds, protocol="searchr1", prompt="P",
                      response=response, final_answer=answer, finish_reason="answer", n_searches=searches,
                      token_ids=[5, 6], format_ok=ok)


def test_rows_score_with_the_recipes_own_reward() -> None:
    cfg = load_config(RLConfig, "searchr1_learn_cpu")
    valid = "<think> a </think>\n<search> x </search>\n\n<information>d</information>\n\n<think> b </think>\n"
    trajs = [_traj("1", valid + "<answer> Paris </answer>", "Paris", ["Paris"], True, 1),
             _traj("2", valid + "<answer> Rome </answer>", "Rome", ["Paris"], True, 1),
             _traj("3", "<answer> Rome </answer>", "Rome", ["Paris"], False, 0),
             _traj("4", "nothing", None, ["Paris"], False, 0)]
    rows = heldout_rows(cfg, trajs, _Tok())
    assert [r["reward"] for r in rows] == [1.0, 0.2, 0.1, 0.0]  # Search-R1 qa_em_format
    assert set(rows[0]) >= {"id", "question", "golden_answers", "pred", "reward", "format_ok", "n_searches"}
    assert rows[0]["em"] == rows[0]["cover_em"] == 1.0 and rows[3]["pred"] is None and rows[1]["n_searches"] == 1


def test_learning_curve_joins_health_and_heldout_points_across_stages(tmp_path) -> None:
    from types import SimpleNamespace

    from training.rl.heldout import learning_curve

    s1, s2 = tmp_path / "stage1", tmp_path / "stage2"
    s1.mkdir()
    s2.mkdir()
    (s1 / "health.json").write_text(json.dumps([{"step": 1.0, "health/reward": 0.1, "health/kl": 0.0},
                                                {"step": 2.0, "health/reward": 0.3, "health/kl": 0.01}]))
    (s1 / "curve.json").write_text(json.dumps([{"step": 0.0, "reward": 0.05}, {"step": 2.0, "reward": 0.2}]))
    (s2 / "health.json").write_text(json.dumps([{"step": 1.0, "health/reward": -0.5}]))
    ckpts = [SimpleNamespace(stage_dir=str(s1), stage="stage1", steps=2),
             SimpleNamespace(stage_dir=str(s2), stage="stage2", steps=1)]
    curve = learning_curve(ckpts)
    assert [r["step"] for r in curve] == [0.0, 1.0, 2.0, 3.0]
    assert curve[2] == {"step": 2.0, "stage": "stage1", "reward": 0.3, "kl": 0.01, "heldout_reward": 0.2}
    assert curve[3] == {"step": 3.0, "stage": "stage2", "reward": -0.5}


def test_learn_presets_hold_out_dev_questions_beyond_the_minis() -> None:
    from training.rl.heldout import heldout_questions

    cfg = load_config(RLConfig, "searchr1_learn_cpu")
    qs = heldout_questions(cfg)
    minis = {q.id for name in ("hotpotqa_mini", "2wikimultihopqa_mini", "musique_mini")
             for q in __import__("evaluation.benchmarks", fromlist=["x"]).load_benchmark(name)}
    assert len(qs) >= 200 and not {q.id for q in qs} & minis
    assert all("train" in t for t in cfg.data.train) and cfg.eval.compare_start


@pytest.mark.slow
def test_curve_callback_scores_the_live_policy(tmp_path, smol_path) -> None:
    """Step 0 and every curve_every steps: greedy held-out rows of the live model -> curve.json/png."""
    from types import SimpleNamespace

    from training.generation.models import load_model
    from training.rl.heldout import heldout_curve_callback

    cfg = load_config(RLConfig, "searchr1_learn_cpu", [
        "eval.benchmarks=[hotpotqa_mini]", "eval.offset=0", "eval.corpus=data/corpus/mini.jsonl",
        "eval.curve_every=2", "eval.curve_questions=2", "eval.max_new_tokens=12"])
    model, tok = load_model(str(smol_path), dtype="float32")
    model.train()
    cb = heldout_curve_callback(cfg, str(tmp_path))
    cb.on_train_begin(None, SimpleNamespace(global_step=0), None, model=model, processing_class=tok)
    cb.on_step_end(None, SimpleNamespace(global_step=1), None, model=model, processing_class=tok)
    cb.on_step_end(None, SimpleNamespace(global_step=2), None, model=model, processing_class=tok)
    points = json.loads((tmp_path / "curve.json").read_text())
    assert [p["step"] for p in points] == [0.0, 2.0] and model.training
    assert points[0] == {**points[1], "step": 0.0}, "same weights, greedy -> the same held-out scores"
    assert (tmp_path / "curve.png").stat().st_size > 0


def test_learning_report_writes_the_evidence_folder(tmp_path) -> None:
    """Rows of both policies + stage health -> summary with paired intervals, train ids, curve, plots; a held-out id
    that was trained on is refused."""
    from types import SimpleNamespace

    from training.rl import stages as rl
    from training.rl.heldout import write_learning_report

    cfg = load_config(RLConfig, "searchr1_learn_cpu", [f"eval.evidence_dir={tmp_path / 'committed'}",
                                                       "data.train=[data/train/hotpotqa_train_mini.jsonl]"])
    data = rl.prepare_data(cfg, str(tmp_path / "data"))
    start = [{"id": f"dev{i}", "question": "q", "golden_answers": ["a"], "pred": None, "reward": 0.0, "f1": 0.0,
              "em": 0.0, "cover_em": 0.0, "format_ok": False, "n_searches": 0} for i in range(40)]
    final = [{**r, "reward": 0.2, "format_ok": True, "n_searches": 1} for r in start]
    for name, rows in (("start", start), ("final", final)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stage = tmp_path / "grpo"
    stage.mkdir()
    (stage / "health.json").write_text(json.dumps([{"step": 1.0, "health/reward": 0.1, "health/kl": 0.0}]))
    alarm = {"name": "search_collapse", "where": "training", "step": 6.0, "value": 0.2, "threshold": 0.47,
             "message": "search collapse (training): stopped searching"}
    (stage / "alarms.json").write_text(json.dumps([alarm]))  # what the health callback wrote during training
    ckpts = [SimpleNamespace(stage_dir=str(stage), stage="grpo", steps=1, uri=str(stage / "model"))]
    ref = write_learning_report(cfg, str(tmp_path / "start" / "heldout.jsonl"),
                                str(tmp_path / "final" / "heldout.jsonl"), ckpts, data, str(tmp_path / "evidence"))
    assert ref.n == 40 and ref.improved["reward"] and ref.improved["format_ok"] and "| reward |" in ref.table
    assert "| search_collapse | training | 6 | 0.2 | 0.47 |" in ref.table  # the CLI's closing table shows it
    assert json.loads((tmp_path / "committed" / "summary.json").read_text())["alarms"] == [alarm]
    for folder in (tmp_path / "evidence", tmp_path / "committed"):
        names = {p.name for p in folder.iterdir()}
        assert {"heldout_start.jsonl", "heldout_final.jsonl", "train_ids.txt", "summary.json",
                "heldout_paired.png", "learning_curves.png"} <= names
    ids = (tmp_path / "evidence" / "train_ids.txt").read_text().split()
    mini = Path("data/train/hotpotqa_train_mini.jsonl").read_text().splitlines()
    assert len(ids) == 40 and ids[0] in {json.loads(line)["id"] for line in mini}
    leaked = [{**r, "id": ids[0]} if i == 0 else r for i, r in enumerate(final)]
    (tmp_path / "final" / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in leaked))
    (tmp_path / "start" / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in leaked))
    with pytest.raises(Exception, match="used for training"):
        write_learning_report(cfg, str(tmp_path / "start" / "heldout.jsonl"),
                              str(tmp_path / "final" / "heldout.jsonl"), ckpts, data, str(tmp_path / "ev2"))


def test_warmup_keeps_only_trajectories_a_rollout_can_produce(smol_tokenizer) -> None:
    """A warm-up step longer than the rollout's per-step budget (or a trajectory over the total) is one the RL
    rollouts cut off; such rows are dropped, and the budget is part of the warm-up's directory key."""
    from training.rl.warmup import fit_rollout_budget, rollout_budget, warmup_root

    words = " ".join(["word"] * 30)
    rows = [{"segments": [["short step", True], [words, False], ["short answer", True]]},  # long part is inserted
            {"segments": [[words, True]]},                                                 # one step too long
            {"segments": [["a b c d e", True]] * 8}]                                       # total too long
    kept, dropped = fit_rollout_budget(rows, smol_tokenizer, per_step=20, total=30)
    assert kept == rows[:1] and dropped == 2
    cfg = load_config(RLConfig, "searchr1_learn_cpu")
    assert rollout_budget(cfg) == (192, 192)  # (per-step, per-trajectory) of its GRPO stage: no per-step cap of ours
    off = load_config(RLConfig, "searchr1_learn_cpu", ["init.fit_rollout_budget=false"])
    assert rollout_budget(off) is None and warmup_root(off) != warmup_root(cfg)


@pytest.mark.slow
def test_evaluate_heldout_writes_rows_once(tmp_path, monkeypatch) -> None:
    """Greedy rollouts of a policy on the held-out questions -> rows with the recipe's reward; a re-run reuses them.
    The generator is freed before the heap is trimmed (issue 26 item 4: the training that follows starts small)."""
    import weakref

    import infra.memory
    import training.generation.spec as gen_spec
    from infra import artifacts
    from training.rl.heldout import evaluate_heldout

    opened: list[weakref.ref] = []
    alive_at_trim: list[bool] = []
    real_load, real_trim = gen_spec._load, infra.memory.trim_heap

    def tracked_load(*args, **kwargs):
        gen = real_load(*args, **kwargs)
        opened.append(weakref.ref(gen))
        return gen

    def tracked_trim() -> bool:
        alive_at_trim.append(any(ref() is not None for ref in opened))
        return real_trim()

    monkeypatch.setattr(gen_spec, "_load", tracked_load)
    monkeypatch.setattr(infra.memory, "trim_heap", tracked_trim)
    cfg = load_config(RLConfig, "searchr1_learn_cpu", [
        "eval.benchmarks=[hotpotqa_mini]", "eval.offset=48", "eval.corpus=data/corpus/mini.jsonl",
        "eval.max_new_tokens=12"])
    path = evaluate_heldout(cfg, "smollm2", str(tmp_path / "start"))
    # the trim on leaving inference_heap comes after the generator is gone (trim_on_growth may trim earlier,
    # between generation batches, while it lives)
    assert opened and alive_at_trim and not alive_at_trim[-1]
    rows = artifacts.read_jsonl(path)
    assert [r["id"] for r in rows] == [q["id"] for q in map(json.loads,
                                                             Path("data/eval/hotpotqa_mini.jsonl").read_text()
                                                             .splitlines()[48:])]
    assert all(r["reward"] in (0.0, 0.1, 0.2, 0.8, 1.0) for r in rows)
    assert artifacts.read_manifest(str(tmp_path / "start"))["count"] == 2
    mtime = Path(path).stat().st_mtime_ns
    assert evaluate_heldout(cfg, "smollm2", str(tmp_path / "start")) == path and Path(path).stat().st_mtime_ns == mtime


def test_r1searcher_rows_carry_token_cover_em_and_judged_accuracy(monkeypatch) -> None:
    """R1-Searcher's CEM is token cover ("France, Paris" covers "Paris France"; FlashRAG's substring acc does not),
    and with a judge endpoint configured the RL evaluation reports ACC_L (R1-Searcher's True/False prompt); both
    reach the summary's fields."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from training.rl.heldout import heldout_fields

    seen: list[dict] = []

    class Judge(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            verdict = "True" if "France, Paris" in body["messages"][-1]["content"] else "False"
            data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": verdict}}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())

    cfg = load_config(RLConfig, "r1searcher_learn_cpu")
    trajs = [_traj("1", "x", "France, Paris", ["Paris France"], True, 1),
             _traj("2", "x", "Lyon", ["Paris France"], True, 1)]
    monkeypatch.delenv("SEARCHLOOP_JUDGE_BASE_URL", raising=False)
    rows = heldout_rows(cfg, trajs, _Tok())
    assert [r["cover_em"] for r in rows] == [0.0, 0.0] and [r["cem"] for r in rows] == [1.0, 0.0]
    assert "acc_l" not in rows[0] and "cem" in heldout_fields(rows) and "acc_l" not in heldout_fields(rows)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("SEARCHLOOP_JUDGE_BASE_URL", f"http://127.0.0.1:{server.server_address[1]}/v1")
        monkeypatch.setenv("SEARCHLOOP_JUDGE_MODEL", "judge-m")
        rows = heldout_rows(cfg, trajs, _Tok())
    finally:
        server.shutdown()
        server.server_close()
    assert [r["acc_l"] for r in rows] == [1.0, 0.0] and len(seen) == 2 and seen[0]["model"] == "judge-m"
    assert heldout_fields(rows)[-1] == "acc_l"


def test_start_evaluation_is_reused_only_when_nothing_it_depends_on_changed(tmp_path, monkeypatch) -> None:
    """A run that starts from the same policy bytes with the same questions, settings and code copies the start
    rows an earlier run computed (about 10 minutes of a 2-core CPU for 600 questions); any change recomputes."""
    import training.generation.models as models
    import training.rl.heldout as rl_heldout
    from infra import artifacts

    monkeypatch.setattr(models, "resolve_policy", lambda m: m)
    computed: list[str] = []

    def fake_evaluate(cfg, model, out_uri):
        computed.append(out_uri)
        artifacts.write_jsonl(artifacts.join(out_uri, "heldout.jsonl"), [{"id": "1", "f1": float(len(computed))}])
        artifacts.write_manifest(out_uri, kind="rl_heldout", model=model, count=1)
        return artifacts.join(out_uri, "heldout.jsonl")

    monkeypatch.setattr(rl_heldout, "evaluate_heldout", fake_evaluate)
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "adapter.safetensors").write_bytes(b"weights 1")
    iso = "eval.isolate_start=false"  # the preset spawns its start evaluation; the fake lives in this process
    cfg = load_config(RLConfig, "research_hops_learn_cpu", ["eval.limit=3", iso])

    def start(run: str, config: RLConfig = cfg) -> list[dict]:
        return artifacts.read_jsonl(rl_heldout.evaluate_start(config, str(policy), str(tmp_path / run / "start")))

    first = start("a")
    assert start("b") == first and len(computed) == 1  # the second run copied the first run's rows
    assert json.loads((tmp_path / "b" / "start" / "reused.json").read_text())["model"] == str(policy)
    assert artifacts.read_manifest(str(tmp_path / "b" / "start"))["count"] == 1
    assert start("b") == first and len(computed) == 1  # a run folder with a manifest is its own answer, as before

    start("c", load_config(RLConfig, "research_hops_learn_cpu", ["eval.limit=3", "eval.max_new_tokens=64", iso]))
    assert len(computed) == 2  # another evaluation setting
    start("d", load_config(RLConfig, "research_hops_learn_cpu", ["eval.limit=4", iso]))
    assert len(computed) == 3  # other questions
    (policy / "adapter.safetensors").write_bytes(b"weights 2")
    start("e")
    assert len(computed) == 4  # other policy bytes at the same path
    monkeypatch.setattr(rl_heldout, "code_fingerprint", lambda: "changed code")
    start("f")
    assert len(computed) == 5  # other code
    start("g", load_config(RLConfig, "research_hops_learn_cpu", ["eval.limit=3", "eval.reuse_start=false", iso]))
    assert len(computed) == 6 and not (tmp_path / "g" / "start" / "reused.json").exists()


def test_code_fingerprint_follows_the_sources_only(tmp_path) -> None:
    from training.rl.heldout import code_fingerprint

    (tmp_path / "training" / "__pycache__").mkdir(parents=True)
    (tmp_path / "training" / "a.py").write_text("x = 1\n")
    before = code_fingerprint(tmp_path, ("training",))
    (tmp_path / "training" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"compiled")
    (tmp_path / "training" / "notes.md").write_text("not code")
    assert code_fingerprint(tmp_path, ("training",)) == before
    (tmp_path / "training" / "a.py").write_text("x = 2\n")
    assert code_fingerprint(tmp_path, ("training",)) != before


def test_isolated_start_evaluation_gives_the_in_process_rows(tmp_path) -> None:
    """``eval.isolate_start``: the start evaluation in a spawned process writes the rows this process would (greedy,
    same code and threads); a child that fails is an error that names the switch."""
    from infra import artifacts
    from infra.errors import SearchloopError
    from training.rl.heldout import evaluate_heldout, evaluate_start

    over = ["eval.benchmarks=[hotpotqa_mini]", "eval.offset=48", "eval.corpus=data/corpus/mini.jsonl",
            "eval.max_new_tokens=12", "eval.reuse_start=false"]
    cfg = load_config(RLConfig, "searchr1_learn_cpu", [*over, "eval.isolate_start=true"])
    assert cfg.key() == load_config(RLConfig, "searchr1_learn_cpu", over).key()  # runtime only: same run folder
    iso = artifacts.read_jsonl(evaluate_start(cfg, "smollm2", str(tmp_path / "iso")))
    here = artifacts.read_jsonl(evaluate_heldout(cfg, "smollm2", str(tmp_path / "here")))
    assert len(iso) == 2 and iso == here
    with pytest.raises(SearchloopError, match="isolate_start=false"):
        evaluate_start(cfg, str(tmp_path / "no-such-model"), str(tmp_path / "bad"))


def test_eval_chunk_and_cache_bound_reach_the_rollout_and_are_part_of_the_key() -> None:
    """``eval.chunk`` and ``eval.generator.prefix_cache_tokens`` (the evaluation's memory bound) reach the held-out
    rollout config and the engine; set, they change the run's key (answers may move in bf16)."""
    from training.rl.heldout import eval_config

    base = load_config(RLConfig, "searchr1_learn_cpu", [])
    cfg = load_config(RLConfig, "searchr1_learn_cpu", ["eval.chunk=48", "eval.generator.prefix_cache_tokens=8192"])
    ecfg = eval_config(cfg, "smollm2")
    assert ecfg.rollout.chunk == 48 and eval_config(base, "smollm2").rollout.chunk is None
    assert ecfg.generator.engine_kwargs()["prefix_cache_tokens"] == 8192
    assert "prefix_cache_tokens" not in eval_config(base, "smollm2").generator.engine_kwargs()
    assert cfg.key() != base.key()
    # measured with them: sessions 30 (ReSearch, Search-R1) and 32 (R1-Searcher, both stages)
    for preset in ("research_hops_learn_cpu", "searchr1_hops_learn_cpu", "r1searcher_hops_learn_cpu"):
        hops = load_config(RLConfig, preset, [])
        assert hops.eval.chunk == 64 and hops.eval.generator.prefix_cache_tokens == 16_384
        assert all(stage.trl.loss_token_budget == 1024 for stage in hops.stages), preset
