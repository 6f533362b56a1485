"""Scheduled-retraining logic as real flow runs on the test stack: no change -> no-op; a change -> diff, index
rebuild and a gate decision (promoted or rejected, with the reason in MLflow); the artifact store and the corpus
source on a moto S3 server through s3fs with the same code as local paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.retrain import RetrainConfig, retrain
from infra import artifacts
from retrieval import sync
from tests.ops.helpers import edit_corpus, gold_ids, mlflow_runs

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus" / "mini.jsonl"


def test_corpus_change_rebuilds_and_gates_no_change_is_noop(ops_stack, corpus_copy: Path, tmp_path: Path):
    cfg = RetrainConfig(trainer="none", corpus=str(corpus_copy), state_root=str(tmp_path / "state"), name="gate")
    state_dir = tmp_path / "state" / "gate"
    with ops_stack.client_env():
        first = retrain(cfg)
        assert first.status == "promoted" and "no incumbent yet" in first.message
        n_runs = len(mlflow_runs(ops_stack.cfg.mlflow_url))

        noop = retrain(cfg)
        assert noop.status == "no-op" and "unchanged" in noop.message and noop.mlflow_run_id is None
        assert len(mlflow_runs(ops_stack.cfg.mlflow_url)) == n_runs  # the no-op touched nothing

        gold = gold_ids(50)
        spare = sorted(p.id for p in sync.iter_corpus(corpus_copy) if p.id not in gold)
        edit_corpus(corpus_copy, drop={spare[0]}, change={spare[1]},
                    add=[{"id": "new-1", "title": "Searchloop", "text": "A new passage added by the test."}])
        small = retrain(cfg)
        assert small.status == "promoted" and "passes the gate" in small.message
        assert sync.read_state(state_dir)["champion_index"] == small.index_dir

        edit_corpus(corpus_copy, drop=gold_ids(25))  # lose the gold passages of half the questions
        bad = retrain(cfg)
        assert bad.status == "rejected" and "fails the gate" in bad.message

    state = sync.read_state(state_dir)
    assert state["champion_index"] == small.index_dir  # rejected candidate did not replace the champion
    assert state["sha256"] == bad.corpus_sha256  # but the corpus counts as processed (next run is a no-op)
    small_run = mlflow_runs(ops_stack.cfg.mlflow_url, filter_string=f"attributes.run_id = '{small.mlflow_run_id}'")
    m = small_run[0].data.metrics
    assert (m["diff_added"], m["diff_changed"], m["diff_deleted"], m["diff_unchanged"]) == (1, 1, 1, 1859)
    # BM25 (the default backend) is refreshed incrementally from the previous index: a cheap full re-index
    assert first.refresh["method"] == "full" and first.refresh["reason"] == "no previous index"
    assert small.refresh["method"] == "incremental" and "bm25: rebuilt" in small.refresh["how"]
    assert (m["refresh_added"], m["refresh_changed"], m["refresh_deleted"], m["refresh_encoded"]) == (1, 1, 1, 0)
    assert small_run[0].data.tags["refresh"] == "incremental"
    bad_run = mlflow_runs(ops_stack.cfg.mlflow_url, filter_string=f"attributes.run_id = '{bad.mlflow_run_id}'")[0]
    assert bad_run.data.tags["decision"] == "rejected" and "fails the gate" in bad_run.data.tags["reason"]
    assert bad_run.data.metrics["candidate_recall"] < bad_run.data.metrics["incumbent_recall"]


def test_artifacts_on_moto_s3_same_code_as_local(moto_s3: str):
    fs, _ = artifacts.url_to_fs("s3://searchloop-test")
    fs.mkdir("searchloop-test")
    run = "s3://searchloop-test/runs/r1"
    artifacts.write_json(artifacts.join(run, "config.json"), {"k": 5})
    assert artifacts.read_manifest(run) is None  # no manifest yet: incomplete
    assert artifacts.write_jsonl(artifacts.join(run, "rows.jsonl"), [{"i": i} for i in range(3)]) == 3
    manifest = artifacts.write_manifest(run, kind="test")
    assert artifacts.read_manifest(run)["files"] == manifest["files"] == ["config.json", "rows.jsonl"]
    assert artifacts.read_json(artifacts.join(run, "config.json")) == {"k": 5}
    assert artifacts.read_jsonl(artifacts.join(run, "rows.jsonl"))[2] == {"i": 2}
    assert not [p for p in fs.ls("searchloop-test/runs/r1") if ".tmp-" in p]  # atomic writes left no temp files


def test_s3_corpus_source_change_detection(ops_stack, moto_s3: str, tmp_path: Path):
    fs, _ = artifacts.url_to_fs("s3://searchloop-corpus")
    fs.mkdir("searchloop-corpus")
    uri = "s3://searchloop-corpus/mini.jsonl"
    artifacts.write_bytes(uri, CORPUS.read_bytes())
    cfg = RetrainConfig(trainer="none", corpus=uri, state_root=str(tmp_path / "state"), name="s3")
    with ops_stack.client_env():
        assert retrain(cfg).status == "promoted"
        assert retrain(cfg).status == "no-op"
        artifacts.write_bytes(uri, CORPUS.read_bytes() + b'{"id": "s3-new", "title": "S3", "text": "Added."}\n')
        again = retrain(cfg)
    assert again.status == "promoted"
    assert sync.read_state(tmp_path / "state" / "s3")["sha256"] == artifacts.file_sha256(uri)


def test_s3_options_from_env_or_explicit_never_show_secrets(moto_s3: str, monkeypatch):
    from pydantic import SecretStr

    from infra import s3

    env_opts = s3.options_from_env()
    assert env_opts.endpoint_url == moto_s3 and "testing" not in s3.describe(env_opts) + repr(env_opts)
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # without fsspec config, s3fs would now go to AWS
    try:
        s3.configure(s3.S3Options(endpoint_url=moto_s3, key=SecretStr("testing"), secret=SecretStr("testing")))
        fs, _ = artifacts.url_to_fs("s3://searchloop-explicit")
        fs.mkdir("searchloop-explicit")
        artifacts.write_json("s3://searchloop-explicit/x.json", {"ok": True})
        assert artifacts.read_json("s3://searchloop-explicit/x.json") == {"ok": True}
    finally:
        import fsspec

        fsspec.config.conf.pop("s3", None)


def test_s3_credentials_from_a_prefect_secret_block(ops_stack, moto_s3: str, monkeypatch):
    import fsspec
    from prefect.blocks.system import Secret

    from tasks.ops import configure_s3_from_block

    with ops_stack.client_env():
        Secret(value={"endpoint_url": moto_s3, "key": "testing", "secret": "testing"}).save("searchloop-s3",
                                                                                             overwrite=True)
        monkeypatch.delenv("AWS_ENDPOINT_URL")
        try:
            described = configure_s3_from_block("searchloop-s3")
            fs, _ = artifacts.url_to_fs("s3://searchloop-block")
            fs.mkdir("searchloop-block")
            artifacts.write_text("s3://searchloop-block/ok.txt", "ok")
            assert artifacts.read_bytes("s3://searchloop-block/ok.txt") == b"ok"
        finally:
            fsspec.config.conf.pop("s3", None)
    assert moto_s3 in described and "testing" not in described


def _markdown_artifact(key: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return max(found, key=lambda a: a.created).data


def test_dense_refresh_is_incremental_encodes_only_changes_full_on_request(ops_stack, tmp_path: Path):
    """Real MiniLM over a 60-passage slice: the second run encodes only the 3 new/changed passages and says so in
    MLflow and the flow-run markdown; refresh=full rebuilds everything."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b"\n".join(CORPUS.read_bytes().splitlines()[:60]) + b"\n")
    index = {"corpus": str(corpus), "backend": "dense", "shard_size": 32}
    cfg = RetrainConfig(trainer="none", corpus=str(corpus), state_root=str(tmp_path / "state"), name="dense",
                        index=index)
    ids = [p.id for p in sync.iter_corpus(corpus)]
    with ops_stack.client_env():
        first = retrain(cfg)
        assert first.refresh["method"] == "full" and first.refresh["counts"]["encoded"] == 60
        edit_corpus(corpus, drop={ids[3]}, change={ids[30], ids[50]},
                    add=[{"id": "new-1", "title": "Searchloop", "text": "A new passage added by the test."}])
        second = retrain(cfg)
        markdown = _markdown_artifact("retrain-dense")
        edit_corpus(corpus, add=[{"id": "new-2", "title": "Full", "text": "Rebuilt from scratch on request."}])
        third = retrain(cfg.model_copy(update={"refresh": "full"}))
    r = second.refresh
    assert r["method"] == "incremental" and "faiss flat: in place" in r["how"]
    assert (r["counts"]["added"], r["counts"]["changed"], r["counts"]["deleted"]) == (1, 2, 1)
    assert (r["counts"]["encoded"], r["counts"]["reused"], r["counts"]["total"]) == (3, 57, 60)
    run = mlflow_runs(ops_stack.cfg.mlflow_url, filter_string=f"attributes.run_id = '{second.mlflow_run_id}'")[0]
    assert (run.data.metrics["refresh_encoded"], run.data.metrics["refresh_reused"]) == (3, 57)
    assert run.data.metrics["refresh_incremental"] == 1 and run.data.tags["refresh"] == "incremental"
    assert "Index refresh: incremental" in markdown and "| 60 | 57 | 3 |" in markdown
    assert artifacts.read_manifest(second.index_dir)["update"]["counts"]["encoded"] == 3
    assert third.refresh["method"] == "full" and third.refresh["reason"] == "refresh=full"
    assert third.refresh["counts"]["encoded"] == 61
