"""One CLI shape: presets listed from their files, deployments that take a preset from a drop-down plus overrides,
input errors never retried, the running stack discovered (and not after ``down``)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from flows.cli import app
from infra.config import PRESET_DIR


def test_version_and_presets_list_every_file_with_its_flow() -> None:
    out = CliRunner().invoke(app, ["--version"])
    assert out.exit_code == 0 and out.output.startswith("searchloop ")
    out = CliRunner().invoke(app, ["presets"], terminal_width=250)
    assert out.exit_code == 0, out.output
    lines = {line.split()[0]: line.split()[1] for line in out.output.splitlines()[1:] if line[:1].strip()}
    assert set(lines) == {p.stem for p in PRESET_DIR.glob("*.yaml")}
    assert lines["index_mini_dense"] == "build-index" and lines["eval_mini"] == "evaluate"
    assert lines["exsearch_cpu_demo"] == "em-loop" and lines["research_grpo"] == "rl-finetune"
    assert "(invalid)" not in out.output
    assert "Dense all-MiniLM-L6-v2" in out.output  # the description comes from the YAML's leading comment
    out = CliRunner().invoke(app, ["presets", "--flow", "em-loop"], terminal_width=250)
    rows = [line.split() for line in out.output.splitlines()[1:] if line[:1].strip()]
    assert {r[0] for r in rows} >= {"exsearch_cpu_demo", "exsearch_paper"} and {r[1] for r in rows} == {"em-loop"}


def test_80_columns_presets_whole_descriptions_status_paths_version_flag(monkeypatch, tmp_path) -> None:
    from flows.specs import list_presets
    from infra import stack

    out = CliRunner().invoke(app, ["presets"], terminal_width=80)
    assert out.exit_code == 0 and max(len(line) for line in out.output.splitlines()) <= 80
    text = " ".join(out.output.split())
    for p in list_presets():  # never cut: every description whole (wrapped)
        assert " ".join(p.description.split()) in text, p.name
    assert "…" not in out.output
    out = CliRunner().invoke(app, ["--help"], terminal_width=80)
    assert "--version" in out.output and not [line for line in out.output.splitlines()
                                              if "--version" in line and "<bool>" in line]
    logs = [f"{tmp_path}/{'a-long-folder-name-' * 4}/run/{n}.log" for n in ("prefect-server", "worker-cpu")]
    monkeypatch.setattr(stack, "status", lambda cfg: [{"name": f"svc{i}", "pid": 1, "running": True,
                                                      "healthy": True, "url": None, "log": log}
                                                     for i, log in enumerate(logs)])
    monkeypatch.setattr(stack, "live_state", lambda home=None, timeout=0.5: None)
    out = CliRunner().invoke(app, ["status"], terminal_width=80)
    assert out.exit_code == 0 and all(log in out.output for log in logs)  # whole paths, copyable


def test_every_user_flow_takes_a_preset_from_a_list_and_overrides() -> None:
    from prefect.utilities.callables import parameter_schema

    from flows.deployments import default_parameters, discover_flows
    from flows.specs import FLOWS, presets_for

    found = discover_flows()
    assert "em-iteration" not in found  # a subflow: not deployed on its own
    assert all("_" not in name for name in found)  # one naming style: kebab-case
    for name, spec in FLOWS.items():
        props = parameter_schema(found[name][0].fn).model_dump()["properties"]
        assert set(props) == {"preset", "overrides"}, name
        assert props["preset"]["enum"] == presets_for(name) and spec.default_preset in props["preset"]["enum"]
        assert props["preset"]["default"] == spec.default_preset
        assert props["overrides"]["type"] == "array" and props["overrides"]["default"] == []
        assert default_parameters(found[name][0]) == {"preset": spec.default_preset, "overrides": []}
    retrain = default_parameters(found["retrain"][0])  # a config flow: its full default config, to merge into
    assert retrain["config"]["evaluation"]["ks"] == [5] and retrain["config"]["corpus"] == "data/corpus/mini.jsonl"
    json.dumps(retrain)  # what the server stores


def test_run_parameters_check_locally_and_merge_nested_sections() -> None:
    from flows.deployments import run_parameters
    from infra.errors import ConfigError

    assert run_parameters("build-index", "index_mini_dense", ["index.faiss.type=hnsw"], None) == {
        "preset": "index_mini_dense", "overrides": ["index.faiss.type=hnsw"]}
    with pytest.raises(ConfigError, match="unknown protocol 'reseach'"):
        run_parameters("evaluate", None, ["agent.protocol=reseach"], None)
    defaults = {"config": {"name": "default", "corpus": "data/corpus/mini.jsonl", "evaluation": {"ks": [5]}}}
    merged = run_parameters("retrain", None, ["config.name=nightly", "config.evaluation.files=[a.jsonl]"], defaults)
    assert merged == {"config": {"name": "nightly", "corpus": "data/corpus/mini.jsonl",
                                 "evaluation": {"ks": [5], "files": ["a.jsonl"]}}}
    with pytest.raises(ConfigError, match="takes no preset"):
        run_parameters("retrain", "index_mini_bm25", [], defaults)


def test_input_errors_are_not_retried() -> None:
    from infra.errors import ConfigError, DataError
    from tasks.policy import retry_unless_input_error

    def failed(exc: BaseException) -> SimpleNamespace:
        return SimpleNamespace(data=exc)

    assert not retry_unless_input_error(None, None, failed(ConfigError("bad preset")))
    assert not retry_unless_input_error(None, None, failed(DataError("bad row")))
    assert not retry_unless_input_error(None, None, failed(IsADirectoryError(21, "Is a directory")))
    assert retry_unless_input_error(None, None, failed(ConnectionError("mlflow down")))


def test_every_retried_task_skips_input_errors() -> None:
    import importlib
    import pkgutil

    from prefect import Task

    import tasks

    for info in pkgutil.iter_modules(tasks.__path__):
        module = importlib.import_module(f"tasks.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, Task) and obj.retries:
                assert obj.retry_condition_fn is not None, f"{obj.name} retries input errors"


def test_stack_is_used_only_while_it_answers(monkeypatch, tmp_path) -> None:
    import os

    from flows.commands._flow import use_stack
    from infra import stack
    from infra.settings import EMBEDDED_KEYS

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///embedded-default.db")  # as apply_embedded_environment sets
    monkeypatch.setattr("infra.settings.EMBEDDED_KEYS", EMBEDDED_KEYS | {"MLFLOW_TRACKING_URI"})
    cfg = stack.StackConfig(home=tmp_path / "stack", prefect_port=9, mlflow_port=9)  # nothing listens on port 9
    stack.write_state(cfg)
    assert stack.read_state(cfg.home)["prefect_api_url"] == "http://127.0.0.1:9/api"
    assert stack.live_state(cfg.home) is None  # recorded but down: not used, not advertised
    monkeypatch.setattr(stack, "live_state", lambda home=None, timeout=0.5: {
        "prefect_api_url": "http://127.0.0.1:4200/api", "prefect_ui_url": "http://127.0.0.1:4200",
        "mlflow_url": "http://127.0.0.1:5000"})
    used = use_stack(quiet=True)
    assert used == {"PREFECT_API_URL": "http://127.0.0.1:4200/api", "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    monkeypatch.setattr("infra.settings.EMBEDDED_KEYS", set())  # a variable the user set wins over the stack
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mine:5000")
    assert use_stack(quiet=True)["MLFLOW_TRACKING_URI"] == "http://mine:5000"


def test_status_after_down_says_the_stack_is_down(monkeypatch, tmp_path) -> None:
    from infra import stack

    monkeypatch.setattr(stack, "live_state", lambda home=None, timeout=0.5: None)
    out = CliRunner().invoke(app, ["status"], terminal_width=200)
    assert out.exit_code == 0 and "stack down" in out.output and "Prefect UI" not in out.output


def test_every_dispatched_step_name_is_known() -> None:
    """The step names tasks pass to ``run_step`` are keys of ``tasks.dispatch.STEPS`` (one naming style)."""
    import re
    from pathlib import Path

    from tasks.dispatch import STEPS

    used = set()
    for path in Path(__file__).resolve().parents[2].joinpath("tasks").glob("*.py"):
        used |= set(re.findall(r'run_step\("([^"]+)"', path.read_text()))
    assert used and used <= set(STEPS), used - set(STEPS)


def test_every_preset_passes_its_own_input_check(shared_data, monkeypatch) -> None:
    """Each shipped preset resolves for each flow it configures with the shipped + shared data present (the learning
    presets' ``learning.heldout.files`` are benchmark names, which the input check once read as missing files)."""
    from flows.specs import list_presets, resolve

    monkeypatch.setenv("SEARCHLOOP_SHARED_DATA_DIR", str(shared_data))
    failures = {}
    for preset in list_presets():
        for flow in preset.flows:
            try:
                resolve(flow, preset.name, [])
            except Exception as exc:  # noqa: BLE001 - collect every failure with its preset
                failures[f"{flow}:{preset.name}"] = str(exc)
    assert not failures, failures


def test_em_loop_table_renders_typed_iteration_results() -> None:
    """The EM CLI's closing table reads the typed records (it once indexed ``h.em['mean']`` and crashed after a
    finished run)."""
    from rich.console import Console

    from evaluation.metrics import MetricSummary
    from flows.commands.train import history_table
    from training.em.records import IterationResult

    f1, em = MetricSummary(mean=0.125, low=0.0, high=0.375, n=8), MetricSummary(mean=0.25, low=0.0, high=0.5, n=8)
    rows = [IterationResult(iteration=i, checkpoint=f"/tmp/ckpt{i}", f1=f1, em=em, version=str(i + 1),
                            promoted=i == 1) for i in range(2)]
    console = Console(record=True, width=200)
    console.print(history_table(rows))
    text = console.export_text()
    assert "0.1250" in text and "[0.0000, 0.5000]" in text and "yes" in text


def test_models_uri_checked_when_the_config_loads_and_readme_example_is_what_the_demo_registers(tmp_path) -> None:
    import re

    import mlflow

    from flows.specs import resolve
    from infra.config import load_config
    from infra.errors import ConfigError
    from infra.settings import REPO_ROOT
    from infra.tracking import configure
    from training.em.config import EMLoopConfig

    demo_name = load_config(EMLoopConfig, "exsearch_cpu_demo").registered_model
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert set(re.findall(r"models:/([\w.-]+)@champion", readme)) == {demo_name}  # the CPU demo registers it
    configure("models-uri-check")
    client = mlflow.MlflowClient()
    client.create_registered_model(demo_name)
    version = client.create_model_version(demo_name, str(tmp_path), run_id=None).version
    client.set_registered_model_alias(demo_name, "champion", version)
    resolve("evaluate", "eval_demo", [f"agent.generator.model=models:/{demo_name}@champion"])  # known: passes
    with pytest.raises(ConfigError, match=rf"agent.generator.model: models:/exsearch-em: no registered model "
                                          rf"'exsearch-em' .*did you mean models:/{demo_name}@champion"):
        resolve("evaluate", "eval_demo", ["agent.generator.model=models:/exsearch-em@champion"])
    with pytest.raises(ConfigError, match=r"no alias 'best' .*its aliases: @champion \(v1\)"):
        resolve("evaluate", "eval_demo", [f"agent.generator.model=models:/{demo_name}@best"])


def test_no_help_page_shows_a_value_type_after_a_flag() -> None:
    """typer 0.29 prints ``<bool>`` after flags (``--help <bool>``); every help page of every command shows none,
    while options that take a value keep their type."""
    import typer

    def pages(command, path):
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from pages(sub, [*path, name])

    paths = list(pages(typer.main.get_command(app), []))
    assert ["deploy", "run"] in paths and ["up"] in paths
    for path in paths:
        out = CliRunner().invoke(app, [*path, "--help"], terminal_width=100)
        assert out.exit_code == 0, path
        assert "<bool>" not in out.output, (path, [ln for ln in out.output.splitlines() if "<bool>" in ln])
    out = CliRunner().invoke(app, ["up", "--help"], terminal_width=100)
    assert "<int>" in out.output and "--no-deploy" in out.output  # value types stay; the flags are listed


def test_deploy_register_sets_the_scheduled_deployments_parameters(monkeypatch) -> None:
    """``deploy register --schedule retrain=CRON config.corpus=...``: the scheduled retrain watches that corpus with
    every other default kept; bad keys and settings without exactly one schedule are refused before any server."""
    from flows import deployments
    from infra.errors import ConfigError

    calls = []
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    monkeypatch.setattr(deployments, "ensure_pools", lambda pools: [])
    monkeypatch.setattr(deployments, "register", lambda flow, pool="cpu", name="default", **kw:
                        calls.append((flow.name, name, kw)) or f"id-{flow.name}-{name}")
    out = CliRunner().invoke(app, ["deploy", "register", "--schedule", "retrain=*/5 * * * *",
                                   "config.corpus=corpus/new.jsonl", "config.name=nightly"], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "deployment retrain/scheduled (id-retrain-scheduled)" in out.output
    (kw,) = [kw for flow, name, kw in calls if (flow, name) == ("retrain", "scheduled")]
    assert kw["cron"] == "*/5 * * * *"
    config = kw["parameters"]["config"]
    assert config["corpus"] == "corpus/new.jsonl" and config["name"] == "nightly"
    assert config["trainer"] == "rl-finetune" and config["preset"] == "searchr1_learn_demo"  # defaults kept
    assert all(kw.get("parameters") is None for flow, name, kw in calls if name == "default")

    calls.clear()
    out = CliRunner().invoke(app, ["deploy", "register", "--schedule", "retrain=60", "config.corpsu=x.jsonl"])
    assert isinstance(out.exception, ConfigError) and "did you mean 'corpus'" in str(out.exception) and not calls
    out = CliRunner().invoke(app, ["deploy", "register", "--schedule", "retrain=60", "--schedule", "evaluate=60",
                                   "config.name=x"])
    assert isinstance(out.exception, ConfigError) and "exactly one" in str(out.exception) and not calls
