"""MLflow model registry for HF checkpoints: log a folder as an MLflow model, load ``models:/…`` back as a folder.

A checkpoint is logged as an MLflow pyfunc model whose artifact ``hf_model`` is the whole HF folder (config,
tokenizer, weights), so a registered version is portable: ``models:/<name>@champion`` or ``models:/<name>/<v>``
downloads to the model cache on any machine that reaches the tracking server and its artifact store. The pyfunc
flavour also serves text generation with transformers: ``mlflow.pyfunc.load_model(uri).predict(["Who wrote
Hamlet?"])`` returns one string per input, the model's answer to it as a user turn of its chat template (the new
text only, stripped; greedy, 128 new tokens). It is the bare model, not the search agent: no retrieval happens
(``searchloop ask`` / ``searchloop eval`` with ``agent.generator.model=models:/...`` run the agent).

:func:`download_model` resolves the alias to a version first and caches per version under
``<model_cache>/registry/<name>-v<version>``; a version registered before this module existed (its source a
local folder) resolves to that folder when it still exists. mlflow is imported inside functions.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infra.errors import ConfigError

log = logging.getLogger(__name__)

HF_ARTIFACT = "hf_model"
PATH_TAG = "searchloop.checkpoint_path"
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")


class RegisteredCheckpoint(BaseModel):
    """A registered model version holding an HF checkpoint."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Registered model name.")
    version: str = Field(description="Model version.")
    model_uri: str = Field(description="Portable URI of the version: models:/<name>/<version>.")
    source: str = Field(description="Where the version's files live (MLflow's source, e.g. models:/m-...).")


def is_model_uri(value: str | os.PathLike[str]) -> bool:
    """True for ``models:/…`` URIs."""
    return str(value).startswith("models:/")


def _python_model() -> Any:
    """A pyfunc wrapper generating text with the HF folder (defined here so cloudpickle stores it by value)."""
    import mlflow.pyfunc

    class HFCheckpoint(mlflow.pyfunc.PythonModel):
        """Text generation with the logged HF folder: one string in, the model's answer (new text only) out.

        Each input string is one user turn: when the tokenizer has a chat template it is rendered as
        ``[{"role": "user", "content": text}]`` with the generation prompt (an instruct model given bare text may
        answer nothing at all). Greedy, 128 new tokens (the model is logged without a params schema, so MLflow
        ignores ``params``).
        """

        def load_context(self, context: Any) -> None:
            from transformers import pipeline

            self.pipe = pipeline("text-generation", model=context.artifacts[HF_ARTIFACT])

        def predict(self, context, model_input, params=None):  # noqa: ANN001, ANN202 - MLflow reads hints
            prompts = [str(p) for p in (list(model_input.iloc[:, 0]) if hasattr(model_input, "iloc")
                                        else list(model_input))]
            kw = {"max_new_tokens": 128, "do_sample": False, "return_full_text": False, **(params or {})}
            tok = self.pipe.tokenizer
            if getattr(tok, "chat_template", None):
                prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                   add_generation_prompt=True) for p in prompts]
            return [out[0]["generated_text"].strip() for out in self.pipe(prompts, **kw)]

    return HFCheckpoint()


def log_checkpoint(folder: str | os.PathLike[str], name: str, run_id: str | None = None,
                   tags: Mapping[str, str] | None = None) -> RegisteredCheckpoint:
    """Log ``folder`` as an MLflow model under run ``run_id`` (default: the active run) and register it as a new
    version of ``name`` (source ``runs:/<run>/checkpoint-<hash>``).

    Uses explicit run ids only (no fluent run is started or ended), so it is safe from Prefect task threads.
    Idempotent per (folder, run): a version already registered from the same folder and run is returned.

    Raises:
        ConfigError: when ``folder`` is not an HF folder (no ``config.json``) or no run is given or active.
    """
    import hashlib
    import tempfile

    import mlflow
    from mlflow.exceptions import MlflowException

    path = Path(folder).resolve()
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} is not an HF model folder (no config.json); register a trained checkpoint")
    active = mlflow.active_run()
    run_id = run_id or (active.info.run_id if active else None)
    if run_id is None:
        raise ConfigError("log_checkpoint needs an MLflow run (pass run_id or start one)")
    client = mlflow.MlflowClient()
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description="searchloop checkpoints (HF folders as MLflow models)")
    for v in client.search_model_versions(f"name = '{name}'"):
        if v.tags.get(PATH_TAG) == str(path) and v.run_id == run_id:
            return RegisteredCheckpoint(name=name, version=str(v.version), model_uri=f"models:/{name}/{v.version}",
                                        source=v.source)
    artifact_path = f"checkpoint-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    with tempfile.TemporaryDirectory(prefix="searchloop-model-") as tmp:
        local = Path(tmp) / "model"
        mlflow.pyfunc.save_model(str(local), python_model=_python_model(), artifacts={HF_ARTIFACT: str(path)},
                                 pip_requirements=_requirements())
        client.log_artifacts(run_id, str(local), artifact_path)
    source = f"runs:/{run_id}/{artifact_path}"
    mv = client.create_model_version(name, source, run_id=run_id, tags={**(tags or {}), PATH_TAG: str(path)})
    log.info("registered %s as models:/%s/%s", path, name, mv.version)
    return RegisteredCheckpoint(name=name, version=str(mv.version), model_uri=f"models:/{name}/{mv.version}",
                                source=source)


def _requirements() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("transformers", "torch", "mlflow"):
        try:
            out.append(f"{pkg}=={version(pkg)}")
        except PackageNotFoundError:
            continue
    return out


def _version(name: str, alias: str | None, version: str | None) -> Any:
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient()
    try:
        return client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
    except MlflowException as exc:
        which = f"alias {alias!r}" if alias else f"version {version}"
        raise ConfigError(f"models:/{name}: no {which} in the registry at {mlflow.get_tracking_uri()} ({exc}); "
                          "check the name/alias, or point MLFLOW_TRACKING_URI at the registry that holds it") from exc


def check_model_uri(uri: str) -> str | None:
    """The problem with a ``models:/`` reference, or None when the registry has that name and alias (or version).

    Called when a config loads (``flows.specs.check_inputs``), so a wrong name is one line before anything runs;
    the message names the registry, suggests the closest registered name and lists the aliases a name has.
    """
    import difflib

    import mlflow
    from mlflow.exceptions import MlflowException

    from infra.tracking import configure

    match = _URI.match(uri)
    if match is None:
        return f"{uri!r} is not a model URI; use models:/<name>@<alias> or models:/<name>/<version>"
    configure()
    client = mlflow.MlflowClient()
    where = mlflow.get_tracking_uri()
    name = match["name"]
    try:
        model = client.get_registered_model(name)
    except MlflowException:
        names = sorted(m.name for m in client.search_registered_models(max_results=1000))
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        hint = f" (did you mean models:/{close[0]}@champion?)" if close else ""
        known = f"registered: {', '.join(names)}" if names else "it has none yet (a training flow registers one)"
        return f"models:/{name}: no registered model {name!r} in the registry at {where}{hint}; {known}"
    if match["alias"]:
        aliases = dict(getattr(model, "aliases", None) or {})
        if match["alias"] not in aliases:
            have = ", ".join(f"@{a} (v{v})" for a, v in sorted(aliases.items())) or "none"
            return f"models:/{name}: no alias {match['alias']!r} in the registry at {where}; its aliases: {have}"
        return None
    try:
        client.get_model_version(name, match["version"])
    except MlflowException:
        return f"models:/{name}: no version {match['version']} in the registry at {where}"
    return None


def _hf_folder(model_dir: Path) -> Path | None:
    """The ``hf_model`` artifact folder of a downloaded pyfunc model (its path is recorded in ``MLmodel``)."""
    import yaml

    mlmodel = model_dir / "MLmodel"
    if not mlmodel.is_file():
        return None
    flavor = (yaml.safe_load(mlmodel.read_text()).get("flavors") or {}).get("python_function") or {}
    rel = ((flavor.get("artifacts") or {}).get(HF_ARTIFACT) or {}).get("path")
    folder = model_dir / rel if rel else None
    return folder if folder is not None and (folder / "config.json").is_file() else None


def download_model(uri: str, cache_dir: str | os.PathLike[str]) -> Path:
    """The local HF folder of a ``models:/name@alias`` or ``models:/name/version`` URI (downloaded once).

    Raises:
        ConfigError: for a malformed URI, an unknown name/alias/version, or a version without an HF folder.
    """
    import mlflow

    from infra.tracking import configure

    match = _URI.match(uri)
    if match is None:
        raise ConfigError(f"{uri!r} is not a model URI; use models:/<name>@<alias> or models:/<name>/<version>")
    configure()
    mv = _version(match["name"], match["alias"], match["version"])
    legacy = Path(mv.source)
    if not str(mv.source).startswith(("models:/", "runs:/")) and (legacy / "config.json").is_file():
        return legacy  # registered as a bare folder (before checkpoints were logged as MLflow models)
    target = Path(cache_dir) / "registry" / f"{match['name']}-v{mv.version}"
    if not (target / "config.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{target.name}-{uuid.uuid4().hex[:8]}"
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{match['name']}/{mv.version}",
                                                             dst_path=str(tmp)))
            hf = _hf_folder(local)
            if hf is None:
                raise ConfigError(f"{uri} (version {mv.version}) holds no {HF_ARTIFACT}/ folder; it was not "
                                  "registered by searchloop's log_checkpoint")
            try:
                os.rename(hf, target)
            except OSError:
                if not (target / "config.json").is_file():
                    raise
                log.info("another process downloaded %s first; using it", target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s -> version %s at %s", uri, mv.version, target)
    return target
