"""Process-wide settings with embedded defaults: data home, shipped data, MLflow and Prefect locations.

Everything has a local default so the main job runs with no server: MLflow uses a sqlite store under the data
home and Prefect an ephemeral API with its own home. Environment variables override (``SEARCHLOOP_HOME``,
``MLFLOW_TRACKING_URI``, ``PREFECT_API_URL``...).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent
SHIPPED_DATA = REPO_ROOT / "data"


class Settings(BaseSettings):
    """searchloop settings, read from ``SEARCHLOOP_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="SEARCHLOOP_", frozen=True)

    home: Path = Field(
        default=REPO_ROOT / ".searchloop",
        description="Data home: indexes, runs, model cache, MLflow sqlite store, Prefect home.",
    )
    data_dir: Path = Field(default=SHIPPED_DATA, description="Where the shipped mini datasets live.")
    shared_data_dir: Path = Field(
        default=REPO_ROOT.parent / "shared" / "data",
        description="Optional directory with the full benchmark sets and corpora (used when present).",
    )

    @property
    def tracking_uri(self) -> str:
        """MLflow tracking URI: ``MLFLOW_TRACKING_URI`` or a sqlite store in the data home."""
        return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{self.home / 'mlflow' / 'mlflow.db'}"

    @property
    def artifact_root(self) -> str:
        """Default MLflow artifact root for experiments created by searchloop."""
        return os.environ.get("SEARCHLOOP_ARTIFACT_ROOT") or str(self.home / "mlflow" / "artifacts")

    @property
    def runs_dir(self) -> Path:
        """Default root for stage artifact directories (indexes, trajectories, checkpoints)."""
        return self.home / "runs"

    model_cache: Path = Field(
        default_factory=lambda data: data["home"] / "models",
        description="Where converted and downloaded models (GGUF -> HF folders, models:/ URIs) are cached; "
        "default <home>/models. Set SEARCHLOOP_MODEL_CACHE to share one cache across data homes.",
    )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Return the process settings (cached; call ``get_settings.cache_clear()`` after changing env vars)."""
    return Settings()


def prefect_results_dir(settings: Settings | None = None) -> Path:
    """Where Prefect persists task results and cache records for this data home."""
    return (settings or get_settings()).home / "prefect" / "storage"


def embedded_environment(settings: Settings | None = None) -> dict[str, str]:
    """Environment defaults for running flows with no external servers (ephemeral Prefect, local MLflow).

    Existing environment variables win; the returned mapping holds only what should be set.
    """
    s = settings or get_settings()
    defaults = {
        "PREFECT_HOME": str(s.home / "prefect"),
        # Prefect's results default to ~/.prefect/storage whatever PREFECT_HOME says: keep task caches (embedded
        # shards, EM selections) with the data home they describe, so a fresh home never hits a stale cache
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(prefect_results_dir(s)),
        # Prefect keeps its block-registration memo in ~/.prefect whatever PREFECT_HOME says: one file shared by every
        # data home and every concurrent temporary server, rewritten (and read half-written: a warning) on each run
        "PREFECT_SERVER_MEMO_STORE_PATH": str(s.home / "prefect" / "memo_store.toml"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # the (ephemeral) server's telemetry
        # the client's: without it, the first `import prefect` of a data home in a terminal prints Prefect's
        # "collects anonymous usage data" notice (prefect._internal.analytics; DO_NOT_TRACK is the client opt-out)
        "DO_NOT_TRACK": "1",
        "PREFECT_LOGGING_LEVEL": "INFO",
        "MLFLOW_TRACKING_URI": s.tracking_uri,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TORCH_EXTENSIONS_DIR": str(s.home / "torch_extensions"),
    }
    return {k: v for k, v in defaults.items() if k not in os.environ}


EMBEDDED_KEYS: set[str] = set()
"""Variables this process set from the embedded defaults (not the user's): a running stack may replace them."""


def apply_embedded_environment(settings: Settings | None = None) -> None:
    """Set the embedded defaults in ``os.environ`` (only keys that are not already set)."""
    s = settings or get_settings()
    EMBEDDED_KEYS.update(embedded_environment(s))
    s.home.mkdir(parents=True, exist_ok=True)
    for sub in ("mlflow", "prefect"):
        (s.home / sub).mkdir(parents=True, exist_ok=True)
    os.environ.update(embedded_environment(s))
