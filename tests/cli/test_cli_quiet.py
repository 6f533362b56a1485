"""The CLI entry drops the library notices of its named list (flows/commands/_quiet.py) and nothing else."""

from __future__ import annotations

import logging
import warnings

import pytest

from flows.commands import _quiet


@pytest.fixture()
def quiet():
    with warnings.catch_warnings():
        _quiet.install()
        yield
        _quiet.uninstall()


def test_bm25s_debug_lines_are_dropped_though_bm25s_sets_debug_at_import(quiet, caplog) -> None:
    import bm25s

    caplog.set_level(logging.DEBUG)
    assert logging.getLogger("bm25s").level == logging.DEBUG  # what bm25s does to its logger on import
    bm25s.BM25().index(bm25s.tokenize(["who wrote hamlet", "shakespeare wrote hamlet"], show_progress=False),
                       show_progress=False)
    assert not [r for r in caplog.records if r.name == "bm25s"]
    logging.getLogger("bm25s").warning("a real problem")
    assert [r.getMessage() for r in caplog.records if r.name == "bm25s"] == ["a real problem"]


def test_transformers_and_mlflow_notices_are_dropped_and_others_kept(quiet, caplog) -> None:
    caplog.set_level(logging.INFO)
    tok = logging.getLogger("transformers.models.llama.tokenization_llama_fast")
    tok.warning("You are using the default legacy behaviour of the <class 'LlamaTokenizerFast'>. This is expected")
    tok.warning("Special tokens have been added")
    logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
    logging.getLogger("mlflow.tracing.export.async_export_queue").info("Flushing the async trace logging queue")
    assert [r.getMessage() for r in caplog.records] == ["Special tokens have been added"]


def test_the_mlflow_dataset_source_warning_is_dropped_only_from_mlflow() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _quiet.install()
        try:
            for module in ("mlflow.data.dataset_source_registry", "searchloop_user_code"):
                warnings.warn_explicit("The specified dataset source can be interpreted in multiple ways: A, A.",
                                       UserWarning, f"{module}.py", 1, module=module)
        finally:
            _quiet.uninstall()
    assert [w.filename for w in seen] == ["searchloop_user_code.py"]


def test_the_list_names_why_for_every_rule() -> None:
    assert all(len(rule.why) > 20 and (rule.logger or rule.module) for rule in _quiet.QUIET)


def test_the_cli_entry_installs_the_list(monkeypatch) -> None:
    import flows.cli as cli

    calls = []
    monkeypatch.setattr(_quiet, "install", lambda: calls.append("installed"))
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert calls == ["installed"]
