"""CLI: ``searchloop serve retriever`` starts the retriever server; ``serve generator`` an OpenAI-compatible model
server (ours over transformers, or vLLM's own with ``--engine vllm``); ``searchloop search`` queries a retriever.

Heavy imports (the index backends, uvicorn) happen inside the commands so ``searchloop --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

ENV_TOKEN = "SEARCHLOOP_RETRIEVER_TOKEN"
ENV_URL = "SEARCHLOOP_RETRIEVER_URL"


def open_searcher(index: Path | None, corpus: Path | None,  # noqa: ANN201 - returns a retrieval Searcher
                  query_backend: str | None = None, query_model: Path | None = None):
    """Load a built index directory or build BM25 over a corpus (``retrieval.open.open_searcher``)."""
    from retrieval.server import open_source

    return open_source(None if index is None else str(index), None if corpus is None else str(corpus),
                       query_backend, None if query_model is None else str(query_model))


def serve_retriever(
    index: Path | None = typer.Option(None, help="Built index directory (any backend; see `searchloop index build`)."),
    corpus: Path | None = typer.Option(None, help="Corpus jsonl: build a BM25 index in memory and serve it."),
    host: str = typer.Option("127.0.0.1", help="Bind address (keep loopback unless a token is set)."),
    port: int = typer.Option(8000, help="TCP port."),
    token: str | None = typer.Option(None, envvar=ENV_TOKEN, help="Require this bearer token on search endpoints."),
    max_k: int = typer.Option(100, help="Largest k a request may ask for (422 above)."),
    cache_mb: int = typer.Option(256, help="Query cache bound in MiB of cached hits (0 disables)."),
    max_wait_ms: float = typer.Option(10.0, help="Adaptive micro-batch wait: a batch smaller than the recent "
                                                "ones waits up to this long for more (0 = never; a lone request "
                                                "never waits)."),
    max_batch_queries: int = typer.Option(256, help="Close a micro-batch once this many queries wait."),
    workers: int = typer.Option(1, help="Micro-batches that may run at once (threads, per process)."),
    processes: int = typer.Option(1, help="Server processes on the same port, each loading the index (uvicorn "
                                          "workers; scales HTTP handling past one process's GIL)."),
    batching: bool = typer.Option(True, "--batching/--no-batching",
                                  help="Micro-batch concurrent requests; --no-batching: one search per request in a "
                                       "thread pool (the seeds' baseline)."),
    query_backend: str | None = typer.Option(None, help="What encodes a dense index's queries: torch, torch-int8 "
                                                      "(int8 products, retrieval.int8_bert), onnx or onnx-int8 (ONNX "
                                                      "Runtime, int8 weights); default: the index's setting "
                                                      "(EncoderConfig.query_backend)."),
    query_model: Path | None = typer.Option(None, help="A query encoder distilled for this dense index "
                                                       "(`searchloop index distill-queries`): queries are encoded "
                                                       "by it, under --query-backend (EncoderConfig.query_model)."),
) -> None:
    """Serve an index over HTTP in every seed's wire format (FlashRAG, Search-R1, R1-Searcher, ExSearch)."""
    from rich.console import Console

    from infra.config import build_config
    from retrieval.config import QUERY_BACKENDS
    from retrieval.server import ServerConfig, serve, serve_processes

    if query_backend is not None and query_backend not in QUERY_BACKENDS:
        raise typer.BadParameter(f"{query_backend!r} is not one of {', '.join(QUERY_BACKENDS)}",
                                 param_hint="--query-backend")
    for given, hint in ((query_backend, "--query-backend"), (query_model, "--query-model")):
        if given is not None and corpus is not None:
            raise typer.BadParameter("encodes a dense index's queries; BM25 over --corpus has no query encoder: drop "
                                     f"{hint} or pass --index <dense or hybrid index dir>", param_hint=hint)

    cfg = build_config(ServerConfig, {
        "host": host, "port": port, "token": token, "cache_bytes": cache_mb * 2**20, "limits": {"max_k": max_k},
        "processes": processes,
        "batching": {"enabled": batching, "max_wait_ms": max_wait_ms, "max_batch_queries": max_batch_queries,
                     "workers": workers},
    }, "command line")
    searcher = open_searcher(index, corpus, query_backend, query_model)
    Console(stderr=True).print(
        f"[green]serving[/] {searcher.name} on http://{host}:{port} "
        f"(docs: /docs, health: /health, batching: {batching}, token: {token is not None}, "
        f"processes: {processes})"
    )
    if processes > 1:  # the check above loaded the index once: bad input fails here, not in every worker
        del searcher
        serve_processes(None if index is None else str(index), None if corpus is None else str(corpus), cfg,
                        query_backend, None if query_model is None else str(query_model))
    else:
        serve(searcher, cfg)


def serve_generator(
    model: str = typer.Option("smollm2", help="'smollm2', an HF folder or a .gguf file (transformers backend)."),
    host: str = typer.Option("127.0.0.1", help="Bind address (keep loopback unless a token is set)."),
    port: int = typer.Option(8001, help="TCP port."),
    served_name: str | None = typer.Option(None, help="Model name clients send (default: --model)."),
    token: str | None = typer.Option(None, envvar="SEARCHLOOP_GENERATOR_TOKEN", help="Require this bearer token."),
    batch_size: int = typer.Option(64, help="Rows per forward batch (and per generate call)."),
    max_wait_ms: float = typer.Option(5.0, help="Wait after the first request for others to batch with it."),
    device: str = typer.Option("auto", help="cpu, cuda or auto."),
    engine: str = typer.Option("transformers", help="transformers (our server) or vllm (vLLM's own server, run "
                               "from .venv-vllm: make vllm-env)."),
    max_model_len: int | None = typer.Option(None, help="vLLM: context length (default: the model's)."),
) -> None:
    """Serve a local model over the OpenAI completions/chat API (what vLLM serve is on a GPU worker)."""
    from rich.console import Console

    from infra.config import build_config

    if engine == "vllm":
        _serve_vllm(model, host, port, served_name, token, max_model_len)
        return
    if engine != "transformers":
        from infra.errors import ConfigError

        raise ConfigError(f"unknown engine {engine!r}; choose transformers or vllm")
    from training.generation.hf import TransformersGenerator
    from training.generation.server import GenerationServerConfig
    from training.generation.server import serve_generator as run

    cfg = build_config(GenerationServerConfig, {
        "host": host, "port": port, "served_name": served_name or model, "token": token,
        "max_wait_ms": max_wait_ms, "max_batch_rows": batch_size,
    }, "command line")
    generator = TransformersGenerator.from_model(model, device=device, batch_size=batch_size)
    Console(stderr=True).print(f"[green]serving[/] {model} as {cfg.served_name!r} on http://{host}:{port}/v1 "
                               f"(completions, chat/completions, models; token: {token is not None})")
    run(generator, cfg)


def _serve_vllm(model: str, host: str, port: int, served_name: str | None, token: str | None,
                max_model_len: int | None) -> None:
    """Run vLLM's OpenAI-compatible server in the foreground until Ctrl-C / SIGTERM, then stop it cleanly.

    SIGTERM interrupts the wait for health too (vLLM on CPU takes minutes to start): it raises
    :class:`KeyboardInterrupt` once, which ``VLLMServer.start`` answers by stopping the server's process group."""
    import signal
    import threading

    from rich.console import Console

    from infra.config import build_config
    from training.generation.vllm_server import VLLMServer, VLLMServerConfig

    cfg = build_config(VLLMServerConfig, {"host": host, "port": port, "served_name": served_name or model,
                                          "token": token, "max_model_len": max_model_len}, "command line")
    console = Console(stderr=True)
    server = VLLMServer(model, cfg)
    console.print(f"starting vLLM for {model} (log: {server.log_path or 'a temporary file'}) ...")
    stop = threading.Event()

    def _on_sigterm(*_: Any) -> None:
        if not stop.is_set():  # once: a second SIGTERM must not interrupt the shutdown itself
            stop.set()
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with server:
            console.print(f"[green]serving[/] {model} with vLLM as {cfg.served_name!r} on {server.base_url} "
                          f"(completions, chat/completions, models; token: {token is not None}; "
                          f"log {server.log_path})")
            try:
                while not stop.is_set() and server.proc is not None and server.proc.poll() is None:
                    stop.wait(1.0)
            except KeyboardInterrupt:
                pass
            if server.proc is not None and server.proc.poll() is not None:
                console.print(f"[red]vLLM exited[/] with status {server.proc.returncode}:\n{server.log_tail()}")
    except KeyboardInterrupt:  # raised while vLLM was still starting; start() already stopped it
        console.print("stopped before vLLM was ready")
    console.print("vLLM server stopped")


def search(
    question: str = typer.Argument(..., help="The query."),
    url: str = typer.Option("http://127.0.0.1:8000", envvar=ENV_URL, help="Retriever server URL."),
    top_k: int = typer.Option(5, "--top-k", "-k", min=1, help="Hits to show (the agents' rollout.top_k)."),
    token: str | None = typer.Option(None, envvar=ENV_TOKEN, help="Bearer token if the server needs one."),
    timeout: float = typer.Option(10.0, help="Seconds per attempt."),
    retries: int = typer.Option(2, help="Retries on connection errors and 5xx."),
) -> None:
    """Query a running retriever server and print the hits as a table."""
    from rich.console import Console
    from rich.table import Table

    from retrieval.client import RetrieverClient

    with RetrieverClient(url, timeout=timeout, retries=retries, token=token) as client:
        hits = client.search([question], top_k)[0]
    table = Table(title=f"{question}  ({len(hits)} hits from {url})", show_lines=True)
    for col, kw in (("#", {"justify": "right"}), ("score", {"justify": "right"}), ("id", {}), ("title", {}),
                    ("text", {"overflow": "fold", "ratio": 1})):
        table.add_column(col, **kw)
    for rank, h in enumerate(hits, 1):
        text = h.text if len(h.text) <= 300 else h.text[:297] + "..."
        table.add_row(str(rank), f"{h.score:.3f}", h.id, h.title, text)
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add ``serve retriever`` and ``search`` to the root CLI."""
    serve_app = typer.Typer(help="Run searchloop services.", no_args_is_help=True)
    serve_app.command("retriever")(serve_retriever)
    serve_app.command("generator")(serve_generator)
    app.add_typer(serve_app, name="serve")
    app.command("search")(search)
