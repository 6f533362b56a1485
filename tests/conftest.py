"""Test harness: an isolated searchloop home, MLflow store and Prefect home per session; shared fixtures."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="searchloop-test-"))
os.environ["SEARCHLOOP_HOME"] = str(_SESSION_HOME)
os.environ.setdefault("SEARCHLOOP_MODEL_CACHE", str(Path(__file__).resolve().parent.parent / ".searchloop" / "models"))
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_SESSION_HOME / 'mlflow.db'}"
os.environ["PREFECT_HOME"] = str(_SESSION_HOME / "prefect")
# Prefect keeps results in ~/.prefect/storage whatever PREFECT_HOME says: a cache hit from an earlier session would
# point at files that session's tmp dirs no longer hold
os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = str(_SESSION_HOME / "prefect" / "storage")
os.environ["PREFECT_SERVER_MEMO_STORE_PATH"] = str(_SESSION_HOME / "prefect" / "memo_store.toml")  # not ~/.prefect
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "searchloop-torch-extensions"))

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Create the session's MLflow store with its artifact root inside the session home: MLflow's default root for a
    sqlite store is ``./mlruns`` under the working directory, so a test logging to the Default experiment wrote
    artifacts into the repository (one was committed)."""
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    except ImportError:  # an interpreter without mlflow (an engine environment) records nothing
        return
    SqlAlchemyStore(os.environ["MLFLOW_TRACKING_URI"], str(_SESSION_HOME / "mlflow-artifacts"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the session home (MLflow store, run folders, Prefect home: GBs after the slow tests) unless
    ``SEARCHLOOP_KEEP_TEST_HOME=1`` asks to keep it for a post-mortem."""
    if os.environ.get("SEARCHLOOP_KEEP_TEST_HOME") == "1":
        print(f"\nsearchloop test home kept: {_SESSION_HOME}")
        return
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests cleanly when CUDA is absent."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on a GPU worker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shipped data directory."""
    return DATA


@pytest.fixture(scope="session")
def mini_corpus_path() -> Path:
    """The shipped mini corpus (1,861 passages)."""
    return DATA / "corpus" / "mini.jsonl"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The full shared data directory; tests using it skip when it is absent."""
    if not SHARED_DATA.exists():
        pytest.skip("../shared/data not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def prefect_harness():
    """A session-scoped Prefect test harness (temporary API + DB); cold start takes ~20-30 s on 2 cores."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield
