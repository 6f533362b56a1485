"""CLI: ``searchloop ask "question" [--preset P] [key=value ...]`` runs one question through a search-agent protocol
and shows the trajectory turn by turn (generated text, query, retrieved documents, final answer, format check).

The settings are the agent section of the evaluate flow (``training.agent.evaluate.AgentEvalConfig``: protocol,
generator, retrieval, rollout), so every setting has the same name here as in ``eval`` presets; ``--preset`` starts
from an evaluate preset's ``agent:`` section. Defaults: the ExSearch protocol (the one SmolLM2-135M follows: it
searches and answers), SmolLM2 on transformers, BM25 over the shipped mini corpus, or the retriever server in
``SEARCHLOOP_RETRIEVER_URL``. Heavy imports happen inside the command.
"""

from __future__ import annotations

import os
from typing import Any

import typer

from infra.errors import ConfigError

ENV_URL = "SEARCHLOOP_RETRIEVER_URL"
ASK_DEFAULTS: dict[str, Any] = {
    "protocol": "exsearch",  # SmolLM2-135M (the default model) follows ExSearch's chat turns; not ReSearch's tags
    "rollout": {"max_tokens_per_turn": 256, "max_total_tokens": 1024},
}


def ask_config(preset: str | None, overrides: list[str]) -> Any:  # noqa: ANN401 - AgentEvalConfig
    """The agent config for ``ask``: defaults, then the preset's ``agent:`` section, then the overrides."""
    import copy

    from infra.config import apply_overrides, build_config, read_yaml, resolve_preset
    from training.agent.evaluate import AgentEvalConfig

    data: dict[str, Any] = copy.deepcopy(ASK_DEFAULTS)
    source = "ask defaults"
    if preset is not None:
        path = resolve_preset(preset)
        section = read_yaml(path).get("agent") or {}
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: `agent` must be a mapping; --preset takes an evaluate preset (eval_mini)")
        data = {**data, **section, "rollout": {**data["rollout"], **section.get("rollout", {})}}
        source = f"{path} (agent section)"
    if os.environ.get(ENV_URL) and not any(o.startswith("retrieval.") for o in overrides):
        data["retrieval"] = {"url": os.environ[ENV_URL]}
    if overrides:
        data = apply_overrides(data, overrides)
        source += " + overrides"
    cfg = build_config(AgentEvalConfig, data, source)
    from flows.specs import check_inputs

    problems = check_inputs(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    return cfg


def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    overrides: list[str] | None = typer.Argument(
        None, show_default=False,
        help="key.sub=value agent settings, e.g. protocol=research generator.model=<HF folder> "
             "retrieval.url=http://127.0.0.1:8000 rollout.top_k=3 (see `--dry-run` for every key)."),
    preset: str | None = typer.Option(None, "--preset", "-p",
                                      help="Start from an evaluate preset's agent section (e.g. eval_mini)."),
    show_prompt: bool = typer.Option(False, "--show-prompt/--hide-prompt", help="Also print the prompt."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved agent config; start nothing."),
) -> None:
    """Answer one question with a search agent and show every turn."""
    from rich.console import Console

    cfg = ask_config(preset, overrides or [])
    console = Console()
    if dry_run:
        import yaml

        console.print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False).rstrip(), markup=False)
        return
    from evaluation.benchmarks import Question
    from training.agent.evaluate import open_generator, open_searcher
    from training.agent.rollout import run_rollouts

    searcher = open_searcher(cfg.retrieval)
    with console.status(f"loading {cfg.generator.model} ({cfg.generator.backend})"):
        generator = open_generator(cfg.generator, items=1)  # one question: backend auto takes the quick start
    with console.status(f"running the agent ({cfg.protocol})"):
        traj = run_rollouts([Question(id="ask", question=question)], cfg.protocol, generator, searcher,
                            cfg.rollout)[0]
    show_trajectory(console, traj, show_prompt)


def show_trajectory(console, traj, show_prompt: bool = False) -> None:  # noqa: ANN001 - rich Console, Trajectory
    """Print a trajectory turn by turn with rich panels."""
    from rich.markup import escape
    from rich.panel import Panel

    if show_prompt:
        console.print(Panel(escape(traj.prompt), title="prompt", border_style="dim"))
    for i, turn in enumerate(traj.turns, 1):
        console.print(Panel(escape(turn.generated) or "[dim](empty)[/]", border_style="cyan",
                            title=f"turn {i}: model ({turn.tokens} tokens, {turn.finish_reason}"
                                  f"{', stop ' + repr(turn.stop) if turn.stop else ''})"))
        if turn.query is not None:
            lines = [f"[bold]query:[/] {escape(turn.query) or '[dim](empty)[/]'}"]
            docs = zip(turn.doc_ids, turn.doc_texts, turn.scores, strict=True)
            for rank, (doc_id, text, score) in enumerate(docs, 1):
                short = text.replace("\n", " ")
                lines.append(f"{rank}. [green]{escape(doc_id)}[/] ({score:.2f}) {escape(short[:160])}")
            console.print(Panel("\n".join(lines), title="search", border_style="green"))
        elif turn.inserted:
            console.print(Panel(escape(turn.inserted[:500]), title="inserted", border_style="yellow"))
    verdict = "[green]ok[/]" if traj.format_ok else f"[red]failed[/] ({escape('; '.join(traj.format_reasons))})"
    console.print(f"[bold]answer:[/] {escape(str(traj.final_answer))}   [bold]finish:[/] {traj.finish_reason}   "
                  f"[bold]searches:[/] {traj.n_searches}   [bold]format:[/] {verdict}   "
                  f"[bold]time:[/] {traj.timings.get('total', 0):.1f} s")


def register(app: typer.Typer) -> None:
    """Add ``ask`` to the root CLI."""
    app.command("ask")(ask)
