"""What every user-facing flow takes, checked before anything starts: config models, presets, input paths, plans.

One :class:`FlowSpec` per flow (``build-index``, ``evaluate``, ``em-loop``, ``rl-finetune``, ``demo``) names its
config model (imported on use; the flows' own models are in ``flows.flow_configs``), its default preset and its
stage plan. The CLI (``searchloop <verb> --preset P key=value``), the
deployments (a preset chosen from a list + overrides) and ``searchloop presets`` all read this table. Nothing here
imports Prefect, so a bad preset, override or input path is reported in well under two seconds, before a Prefect
server or a flow run exists (:func:`resolve`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import WithJsonSchema

from infra.config import PRESET_DIR, StrictModel, load_config, problem_list, read_yaml
from infra.errors import ConfigError, SearchloopError

# ---- stage plans (what --dry-run prints) -------------------------------------------------------------------------

def _plan_build_index(cfg: Any) -> list[str]:
    from retrieval.backends import get_backend
    from retrieval.index import index_parts

    idx = cfg.index
    composite = index_parts(idx)
    steps = [f"validate-corpus {idx.corpus}" + (f" (first {idx.limit} passages)" if idx.limit else "")]
    for part in composite or [idx.backend]:
        where = f" into <out>/{part}" if composite else ""
        if get_backend(part).embeds_shards:
            steps.append(f"embed-shard x N ({idx.shard_size} passages each, {cfg.parallel.task_runner}; "
                         f"encoder {idx.encoder.model}){where}")
        steps.append(f"finalize-index {part}{where}" + (" (reuse an identical complete index)" if not cfg.force
                                                         else " (force: rebuild)"))
    if composite:
        steps.append(f"finalize-hybrid ({idx.backend} of {' + '.join(composite)})")
    if cfg.evaluate:
        steps.append(f"evaluate-recall at k={cfg.evaluation.ks} on {len(cfg.evaluation.files)} file(s)")
    steps.append(f"log-index-run (MLflow run {cfg.name!r})")
    return steps


def _plan_evaluate(cfg: Any) -> list[str]:
    n = len(cfg.protocols) * len(cfg.datasets)
    limit = f", first {cfg.agent.limit} questions each" if cfg.agent.limit else ""
    return [f"evaluate-dataset x {n}: protocols {cfg.protocols} x datasets {cfg.datasets}{limit} "
            f"({cfg.agent.generator.backend} {cfg.agent.generator.model}, {cfg.parallel.task_runner})",
            "summarize-evaluation (report.md, scores.png)", f"log-evaluation (MLflow run {cfg.run_name!r})"]


def _plan_em_loop(cfg: Any) -> list[str]:
    steps = ["open-run (parent MLflow run)", "warmup-data", f"warmup-sft of {cfg.base_model}",
             "evaluate (warm-up checkpoint)", "promote"]
    steps.append(f"em-iteration x up to {cfg.iterations} (early stop after {cfg.early_stop_drops} drops): sample "
                 f"({cfg.sampling.rollout.n} rollouts/question) -> score -> select ({cfg.selection.method}) -> "
                 "align -> evaluate -> promote")
    return steps


def _plan_rl(cfg: Any) -> list[str]:
    steps = ["rl-open-run", "rl-prepare-data"]
    if cfg.init.warmup is not None:
        steps.append(f"rl-warmup (SFT of {cfg.model} on {cfg.protocol} trajectories)")
    if cfg.difficulty is not None:
        steps.append(f"rl-difficulty ({cfg.difficulty_rollouts} rollouts/question)")
    steps += [f"rl-train-stage {s.name} ({cfg.engine})" for s in cfg.stages]
    if cfg.eval.benchmarks:
        steps.append(f"rl-evaluate on {cfg.eval.benchmarks}")
    if cfg.register_model:
        steps.append(f"rl-register (MLflow model {cfg.name!r})")
    return steps


def _plan_smartsearch(cfg: Any) -> list[str]:
    steps = ["smartsearch-open-run"]
    if not cfg.endpoint.base_url:
        steps.append("smartsearch-start-endpoint (judge/refiner: our generation server)")
    if cfg.eval.benchmarks:
        steps.append(f"smartsearch-evaluate initial {cfg.model} on {cfg.eval.benchmarks}")
    for name in ("stage1-sft (screened)", "stage2-dpo (refined vs original pairs)", "stage3-grpo (query-aware)"):
        steps.append(f"smartsearch-{name} -> evaluate -> register")
    return steps


def _plan_demo(cfg: Any) -> list[str]:
    steps = [f"build-index {p} (subflow)" for p in cfg.index_presets]
    if cfg.run_agent:
        steps += [f"start-retriever on {cfg.index_presets[cfg.serve]}", f"evaluate {cfg.eval_preset} (subflow)",
                  "stop-retriever"]
    if cfg.train_preset:
        steps.append(f"rl-finetune {cfg.train_preset} (subflow; held-out start vs trained)")
    return steps


def _check_rl(cfg: Any) -> None:
    """What the RL config's own validation cannot see without importing the rewards: each stage's reward_options
    against its score function (a typo fails at load, in ``--dry-run`` too, not inside the run)."""
    from training.rewards.adapters import check_reward_options

    for stage in cfg.stages:
        check_reward_options(stage.reward, stage.reward_options)


@dataclass(frozen=True)
class FlowSpec:
    """A user-facing flow: its name (CLI, Prefect, deployment), config model, default preset and plan."""

    name: str
    config: str  # "module:Class", imported on use
    default_preset: str
    plan: Callable[[Any], list[str]]
    summary: str
    check: Callable[[Any], None] | None = None  # further checks of a loaded config (raise ConfigError)

    def model(self) -> type[StrictModel]:
        """The flow's config model class."""
        from infra.lazy import load_object

        return load_object(self.config)


FLOWS: dict[str, FlowSpec] = {s.name: s for s in (
    FlowSpec("build-index", "flows.flow_configs:BuildIndexFlowConfig", "index_mini_bm25", _plan_build_index,
             "corpus -> shards -> index -> recall -> MLflow"),
    FlowSpec("evaluate", "flows.flow_configs:EvaluateConfig", "eval_demo", _plan_evaluate,
             "search agents x benchmarks -> report -> MLflow"),
    FlowSpec("em-loop", "training.em.config:EMLoopConfig", "exsearch_cpu_demo", _plan_em_loop,
             "ExSearch EM: warm-up SFT, then sample/score/select/train/evaluate"),
    FlowSpec("rl-finetune", "training.rl.config:RLConfig", "research_grpo_cpu_demo", _plan_rl,
             "RL fine-tuning with search in the loop (TRL or verl)", _check_rl),
    FlowSpec("smartsearch-curriculum", "training.smartsearch.config:SmartSearchConfig", "smartsearch_cpu_demo",
             _plan_smartsearch, "SmartSearch: screened SFT -> DPO -> query-aware GRPO"),
    FlowSpec("demo", "flows.flow_configs:DemoConfig", "demo", _plan_demo,
             "indexes -> live retriever -> agent evaluation"),
)}


def flow_spec(name: str) -> FlowSpec:
    """The spec of flow ``name``; ConfigError listing the flows otherwise."""
    if name not in FLOWS:
        raise ConfigError(f"no flow named {name!r}; flows: {', '.join(FLOWS)}")
    return FLOWS[name]


# ---- presets -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PresetInfo:
    """One YAML preset: its name, the first line of its leading comment, and the flows it configures."""

    name: str
    path: Path
    description: str
    flows: tuple[str, ...]


def preset_description(path: Path) -> str:
    """The first sentence of the preset file's leading ``#`` comment (its one-line description)."""
    words = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        words += line.lstrip("#").split()
    text = " ".join(words)
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


def _fits(model: type[StrictModel], data: dict[str, Any]) -> bool:
    try:
        model.model_validate(data)
    except Exception:  # noqa: BLE001 - any validation failure means "not this flow's preset"
        return False
    return True


@lru_cache(maxsize=1)
def list_presets() -> tuple[PresetInfo, ...]:
    """Every preset in ``flows/configs``, with the flows whose config model validates it."""
    out = []
    models = {name: spec.model() for name, spec in FLOWS.items()}
    for path in sorted(PRESET_DIR.glob("*.yaml")):
        data = read_yaml(path)
        fits = tuple(name for name, model in models.items() if set(data) <= set(model.model_fields)
                     and _fits(model, data))
        out.append(PresetInfo(path.stem, path, preset_description(path), fits))
    return tuple(out)


def presets_for(flow: str) -> list[str]:
    """Names of the presets that configure ``flow`` (the choices of its deployment form)."""
    return [p.name for p in list_presets() if flow in p.flows]


def preset_choice(flow: str) -> Any:
    """The type of a flow's ``preset`` parameter: a string whose JSON schema lists the flow's presets, so the
    deployment form shows a drop-down (the server enforces it); local calls may also pass a YAML path."""
    return Annotated[str, WithJsonSchema({"type": "string", "enum": presets_for(flow), "title": "preset"})]


Overrides = Annotated[tuple[str, ...], WithJsonSchema({
    "type": "array", "items": {"type": "string"}, "title": "overrides",
    "description": "key.sub=value settings applied on top of the preset, merged into nested sections "
                   "(e.g. index.backend=dense)"})]
"""The type of a flow's ``overrides`` parameter: ``key.sub=value`` strings (an immutable default of ``()``)."""


SECRET_NAMES = ("token", "api_key", "apikey", "secret", "password")


def refuse_secret_overrides(overrides: Iterable[str]) -> None:
    """Refuse ``*.token=...``-style overrides: a flow run's parameters (its overrides) are stored in Prefect's
    database in plain text. Secrets come from the environment (the configs read them there when unset).

    Raises:
        ConfigError: naming the key and the environment variables to use instead.
    """
    for text in overrides:
        key = text.partition("=")[0].strip()
        last = key.rsplit(".", 1)[-1].lower()
        if last in SECRET_NAMES or last.endswith(tuple(f"_{n}" for n in SECRET_NAMES)):
            raise ConfigError(f"{key} is a secret and a flow run's overrides are stored in Prefect's database: drop "
                              "it and set it in the environment instead (SEARCHLOOP_RETRIEVER_TOKEN, "
                              "SEARCHLOOP_GENERATOR_TOKEN, SEARCHLOOP_JUDGE_API_KEY)")


# ---- input paths -------------------------------------------------------------------------------------------------

FILE_KEYS = {"corpus", "files", "fireact_file", "path", "train", "val", "benchmarks", "datasets"}
DIR_KEYS = {"index"}
BENCHMARK_KEYS = {"path", "files", "train", "val", "benchmarks", "datasets"}  # may also hold a benchmark name


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _walk(node: Any, prefix: str) -> Iterable[tuple[str, str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{prefix}{key}.") if isinstance(value, dict | list) else ()
            yield f"{prefix}{key}", str(key), value
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, dict):
                yield from _walk(value, f"{prefix.rstrip('.')}[{i}].")


def _check_path(key: str, leaf: str, value: str) -> str | None:
    from evaluation.formats import is_hf_dataset_dir
    from infra.paths import is_uri, resolve_benchmark_path, resolve_path

    if is_uri(value) or not value:
        return None
    path = Path(resolve_path(value))
    if leaf in DIR_KEYS:
        if not path.exists():
            return f"{key}: index directory {value!r} does not exist; build one with `searchloop index build`"
        if not path.is_dir():
            return f"{key}: {value!r} is a file, not an index directory (a corpus goes in retrieval.corpus)"
        return None
    if path.is_dir() and not is_hf_dataset_dir(path):
        return f"{key}: {value!r} is a directory; give the .jsonl (or .parquet) file inside it"
    if path.exists():
        return None
    # a benchmark name (hotpotqa_mini, r1searcher/hotpotqa_500) rather than a file
    if leaf in BENCHMARK_KEYS and Path(value).suffix not in {".jsonl", ".json", ".parquet"}:
        try:
            resolve_benchmark_path(value)
            return None
        except SearchloopError as exc:
            return f"{key}: {exc}"
    return f"{key}: file {value!r} does not exist (relative paths resolve from here, then the repository; " \
           f"'shared:<rel>' under the shared data dir)"


def check_inputs(cfg: StrictModel) -> list[str]:
    """Every input path of ``cfg`` (corpora, question files, benchmarks, index dirs) that cannot be read, and every
    ``models:/`` reference the registry does not hold."""
    problems = []
    for key, leaf, value in _walk(cfg.model_dump(mode="json"), ""):
        if leaf in FILE_KEYS | DIR_KEYS:
            problems += [p for v in _strings(value) if (p := _check_path(key, leaf, v))]
        for v in _strings(value):
            if v.startswith("models:/"):  # registered model: name and alias checked now, not 10 s into a run
                from infra.registry import check_model_uri

                problem = check_model_uri(v)
                problems += [f"{key}: {problem}"] if problem else []
    return problems


def resolve(flow: str, preset: str | None, overrides: Iterable[str]) -> StrictModel:
    """Load ``flow``'s config from a preset and overrides, then check every input path; one ConfigError lists all.

    Raises:
        ConfigError: an unknown preset, a bad override, a validation error or an unreadable input path.
    """
    spec = flow_spec(flow)
    name = preset or spec.default_preset
    try:
        cfg = load_config(spec.model(), name, list(overrides))
    except ConfigError as exc:
        other = next((p for p in list_presets() if p.name == name and flow not in p.flows and p.flows), None)
        if other is not None:  # a preset of another flow: say so rather than list every missing key
            raise ConfigError(f"preset {name!r} is a {', '.join(other.flows)} preset; {flow} presets: "
                              f"{', '.join(presets_for(flow))}") from exc
        raise
    problems = check_inputs(cfg)
    if problems:
        raise ConfigError(problem_list(problems, "input path error"))
    if spec.check is not None:
        spec.check(cfg)
    if flow == "demo":  # the demo's presets are other flows' presets: check them the same way
        for p in cfg.index_presets:  # type: ignore[attr-defined]
            resolve("build-index", p, [])
        resolve("evaluate", cfg.eval_preset, [])  # type: ignore[attr-defined]
        if cfg.train_preset:  # type: ignore[attr-defined]
            resolve("rl-finetune", cfg.train_preset, cfg.train_overrides)  # type: ignore[attr-defined]
    return cfg

