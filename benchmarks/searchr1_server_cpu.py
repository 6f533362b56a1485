"""Run Search-R1's own dense retrieval server (``search_r1/search/retrieval_server.py``) on CPU, unmodified.

Issue 26 item 7 measures our retriever server against Search-R1's. Their file is not copied into this repository:
this launcher runs *their* file (a checkout of PeterGriffinJin/Search-R1 given by ``--upstream``) with the few
device lines that make it CPU-only applied from outside, before their module runs:

- ``torch.nn.Module.cuda`` / ``torch.Tensor.cuda`` return the object unchanged (their ``model.cuda()`` and
  ``v.cuda()`` for the query batch);
- ``torch.nn.Module.half`` returns the module unchanged (their ``__main__`` sets ``retrieval_use_fp16=True``, which
  on CPU would run the encoder in float16, slower than float32 and not what the GPU path means);
- ``uvicorn.run`` binds ``127.0.0.1:--port`` (their ``__main__`` binds ``0.0.0.0:8000``).

Everything else is their code: FastAPI ``POST /retrieve`` with ``{"queries": [...], "topk": k}``, one
``batch_search`` per request, faiss ``index.search``, ``datasets`` corpus rows. ``--index-dir`` is one of our
dense index folders (``index.faiss`` + ``passages.jsonl`` in faiss row order), exported here to the two files their
server reads (``--index_path`` and ``--corpus_path``, rows ``{"id", "contents"}``).

Usage (``benchmarks/server_throughput.py --searchr1 <checkout>`` starts it itself)::

    python benchmarks/searchr1_server_cpu.py --upstream <Search-R1 checkout> --index-dir <dense index> --port 8123
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import tempfile
from pathlib import Path

SERVER = Path("search_r1") / "search" / "retrieval_server.py"


def export_corpus(index_dir: Path, out: Path) -> Path:
    """Write ``passages.jsonl`` of our index as their corpus file (``contents`` = title + newline + text)."""
    rows = [json.loads(line) for line in (index_dir / "passages.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()]
    with out.open("w", encoding="utf-8") as f:
        for r in rows:
            contents = r.get("contents") or f"{r.get('title', '')}\n{r.get('text', '')}"
            f.write(json.dumps({"id": r["id"], "contents": contents}, ensure_ascii=False) + "\n")
    return out


def patch_for_cpu(port: int) -> None:
    """Apply the device lines (see the module docstring) before their module is executed."""
    import torch
    import uvicorn

    torch.nn.Module.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.nn.Module.half = lambda self, *a, **k: self  # type: ignore[method-assign]
    run = uvicorn.run

    def run_local(app, **kwargs):  # noqa: ANN001, ANN003
        kwargs.update(host="127.0.0.1", port=port, log_level="warning")
        return run(app, **kwargs)

    uvicorn.run = run_local  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    """Export the corpus, patch the device lines, then run their server file as ``__main__``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", type=Path, required=True, help="a checkout of PeterGriffinJin/Search-R1")
    ap.add_argument("--index-dir", type=Path, required=True, help="one of our dense index folders (MiniLM)")
    ap.add_argument("--model", default="minilm", help="encoder folder (default: the shipped all-MiniLM-L6-v2)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--topk", type=int, default=5)
    args = ap.parse_args(argv)
    server = args.upstream / SERVER
    if not server.is_file():
        sys.exit(f"error: {server} does not exist; pass --upstream <a checkout of PeterGriffinJin/Search-R1>")
    if not (args.index_dir / "index.faiss").is_file():
        sys.exit(f"error: {args.index_dir} has no index.faiss; pass a dense index folder (searchloop run build-index)")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from retrieval.encoders import resolve_model_path

    model = resolve_model_path(args.model)
    with tempfile.TemporaryDirectory(prefix="searchr1-server-") as work:  # removed when uvicorn returns (SIGTERM)
        corpus = export_corpus(args.index_dir, Path(work) / "corpus.jsonl")
        patch_for_cpu(args.port)
        # their argparse; retriever_name "minilm": no e5/bge query prefix, mean pooling + L2 normalisation (as ours)
        sys.argv = [str(server), "--index_path", str(args.index_dir / "index.faiss"), "--corpus_path", str(corpus),
                    "--topk", str(args.topk), "--retriever_name", "minilm", "--retriever_model", model]
        runpy.run_path(str(server), run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
