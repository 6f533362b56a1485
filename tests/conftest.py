"""Test harness: an isolated searchloop home, MLflow store and Prefect home per session; shared fixtures."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
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


@pytest.fixture(scope="module", autouse=True)
def _drop_module_checkpoints() -> Iterator[None]:
    """After each test module, remove the run folders and MLflow artifacts it left in the session home: a flow test
    writes full checkpoints of the 135M model (0.5 GB each) and MLflow registration copies them, so a whole session
    kept 11 GB and CI's disk ran out. The MLflow database, Prefect home and the ops stack stay (session-scoped)."""
    yield
    for sub in ("runs", "mlflow/artifacts"):
        shutil.rmtree(_SESSION_HOME / sub, ignore_errors=True)


def _tree_bytes(root: Path) -> int:
    """Bytes held by the files under ``root`` (0 when it is gone)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """With ``SEARCHLOOP_TEST_DISK_LOG=<file>``, append the bytes left in the temp dir after each test (tab-separated:
    test id, bytes): CI's disk is small, and a test that leaves checkpoints behind shows up here."""
    log = os.environ.get("SEARCHLOOP_TEST_DISK_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{item.nodeid}\t{_tree_bytes(Path(tempfile.gettempdir()))}\n")


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
