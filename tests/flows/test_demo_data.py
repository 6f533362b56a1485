"""The main job (``searchloop demo``) reads only the repository's data/: every preset it runs resolves inside data/
with no shared data folder, the closing training stage's held-out questions are disjoint from its training
questions and from every shipped mini, and ``data/demo/build.py`` reproduces the committed ``data/demo`` files."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from infra.settings import REPO_ROOT, get_settings

DATA = REPO_ROOT / "data"
DEMO = DATA / "demo"


@pytest.fixture
def no_shared(monkeypatch, tmp_path) -> Path:
    """A shared data folder that does not exist: anything that reads ``shared:`` or a shared benchmark fails."""
    missing = tmp_path / "no-shared-data"
    monkeypatch.setenv("SEARCHLOOP_SHARED_DATA_DIR", str(missing))
    get_settings.cache_clear()
    yield missing
    get_settings.cache_clear()


def _data_refs(node: Any, keys: frozenset[str], key: str = "") -> list[str]:
    """Every string under a data-path key (corpus, train, benchmarks, datasets, files, ...) of a dumped config."""
    if isinstance(node, dict):
        return [r for k, v in node.items() for r in _data_refs(v, keys, str(k))]
    if isinstance(node, list):
        return [r for v in node for r in _data_refs(v, keys, key)]
    return [node] if key in keys and isinstance(node, str) and node else []


def _ids(path: Path) -> set[str]:
    return {str(json.loads(line)["id"]) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}


def test_demo_reads_only_repository_data(no_shared) -> None:
    from flows.specs import BENCHMARK_KEYS, FILE_KEYS, resolve
    from infra.paths import resolve_benchmark_path, resolve_path

    demo = resolve("demo", "demo", [])  # checks every input path of the demo and of its sub-presets
    configs = [demo, *(resolve("build-index", p, []) for p in demo.index_presets),
               resolve("evaluate", demo.eval_preset, []), resolve("rl-finetune", demo.train_preset, [])]
    refs = [r for c in configs for r in _data_refs(c.model_dump(mode="json"), frozenset(FILE_KEYS))]
    assert "data/demo/corpus_heldout_demo.jsonl" in refs and "data/demo/musique_train_demo.jsonl" in refs
    for ref in refs:
        assert not ref.startswith("shared:"), ref
        path = Path(resolve_path(ref))
        if not path.exists() and Path(ref).suffix == "":  # a benchmark name (hotpotqa_mini)
            path = resolve_benchmark_path(ref)
        assert path.is_file(), ref
        assert path.resolve().is_relative_to(DATA), f"{ref} -> {path} is outside the repository's data/"
    assert BENCHMARK_KEYS <= FILE_KEYS  # so benchmark names were walked too


def test_heldout_disjoint_from_training_and_minis_and_corpora_cover_them(no_shared) -> None:
    from evaluation.benchmarks import load_benchmark
    from infra.config import load_config
    from training.rl.config import RLConfig
    from training.rl.heldout import heldout_questions

    cfg = load_config(RLConfig, "searchr1_learn_demo")
    heldout = heldout_questions(cfg)
    held = {q.id for q in heldout}
    assert len(heldout) == len(held) == 24  # eval.limit 8 of each shipped 20-row file
    shipped = [q for b in cfg.eval.benchmarks for q in load_benchmark(b)]
    assert len(shipped) == 60 and held <= {q.id for q in shipped}
    train = {q.id for src in cfg.data.train for q in load_benchmark(src)}
    warmup = {q.id for f in cfg.init.warmup.decomposition_files for q in load_benchmark(f.path)}
    eval_minis = set().union(*(_ids(p) for p in (DATA / "eval").glob("*_mini.jsonl")))
    train_minis = set().union(*(_ids(p) for p in (DATA / "train").glob("*_train_mini.jsonl")
                                if not p.name.startswith("corpus")))
    assert len(train) == 48 and len(eval_minis) == 200 and len(train_minis) == 140
    assert not {q.id for q in shipped} & (train | warmup | eval_minis | train_minis)
    assert not train & (eval_minis | train_minis)  # GRPO questions differ from the warm-up's and the minis
    for questions, corpus in ((shipped, cfg.eval.corpus), ([q for s in cfg.data.train for q in load_benchmark(s)],
                                                          cfg.retrieval.corpus[0])):
        have = _ids(REPO_ROOT / corpus)
        need = {d for q in questions for d in q.metadata["context_doc_ids"]}
        assert need == have, f"{corpus}: {len(need - have)} missing, {len(have - need)} extra"


def test_builder_reproduces_the_committed_files(shared_data, tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("demo_build", DEMO / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    written = build.build(shared_data, tmp_path)
    readme = (DEMO / "README.md").read_text(encoding="utf-8")
    assert set(written) == {p.name for p in DEMO.glob("*.jsonl")}
    for name, (rows, digest) in written.items():
        committed = (DEMO / name).read_bytes()
        assert (tmp_path / name).read_bytes() == committed, name
        assert hashlib.sha256(committed).hexdigest() == digest and f"| {name} | {rows} |" in readme
        assert f"`{digest}`" in readme, f"data/demo/README.md lacks the sha256 of {name}"
