"""Rebuild ``data/demo/``: the self-contained data of the demo's closing training stage (``searchr1_learn_demo``).

Run from the repository root with the project's shared data folder at hand (only this builder needs it; the demo
reads the files it writes)::

    python data/demo/build.py --shared ../shared/data

Writes, by fixed row ranges (no randomness) and byte-for-byte copies of the source lines:

- ``<dataset>_train_demo.jsonl``: rows ``TRAIN_ROWS`` of each shared training file (past every shipped training mini
  in ``data/train``, which hold the first 40/40/60 rows), all fields kept;
- ``corpus_train_demo.jsonl``: every ``corpus/train_wiki.jsonl`` paragraph in those rows' ``context_doc_ids``;
- ``<dataset>_heldout_demo.jsonl``: rows ``HELDOUT_ROWS`` of each shared dev file (after the 50-row eval minis:
  the held-out questions the preset evaluated before it read from here);
- ``corpus_heldout_demo.jsonl``: every ``corpus/multihop_wiki.jsonl`` paragraph in those rows' ``context_doc_ids``.

Corpus rows keep the source file's order. Standard library only; it checks that every context id was found.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable
from pathlib import Path

TRAIN_ROWS = range(60, 76)  # 16 rows per training file, 0-based
HELDOUT_ROWS = range(50, 70)  # 20 rows per dev file, 0-based
TRAIN_FILES = {  # output name -> shared source
    "hotpotqa_train_demo.jsonl": "train/hotpotqa_train_hipporag.jsonl",
    "2wikimultihopqa_train_demo.jsonl": "train/2wikimultihopqa_train_migres.jsonl",
    "musique_train_demo.jsonl": "train/musique_train_hipporag.jsonl",
}
HELDOUT_FILES = {
    "hotpotqa_heldout_demo.jsonl": "eval/hotpotqa_dev.jsonl",
    "2wikimultihopqa_heldout_demo.jsonl": "eval/2wikimultihopqa_dev.jsonl",
    "musique_heldout_demo.jsonl": "eval/musique_dev.jsonl",
}
TRAIN_CORPUS = ("corpus/train_wiki.jsonl", "corpus_train_demo.jsonl")
HELDOUT_CORPUS = ("corpus/multihop_wiki.jsonl", "corpus_heldout_demo.jsonl")


def _lines(path: Path) -> list[bytes]:
    """The non-empty lines of a JSON Lines file, each without its newline."""
    if not path.is_file():
        sys.exit(f"error: {path} does not exist; pass --shared <the shared data folder>")
    return [line for line in path.read_bytes().split(b"\n") if line.strip()]


def _pick(src: Path, rows: range) -> list[bytes]:
    lines = _lines(src)
    if len(lines) < rows.stop:
        sys.exit(f"error: {src} has {len(lines)} rows; rows {rows.start}..{rows.stop - 1} are needed")
    return lines[rows.start:rows.stop]


def _write(path: Path, lines: Iterable[bytes]) -> tuple[int, str]:
    data = b"".join(line + b"\n" for line in lines)
    path.write_bytes(data)
    return data.count(b"\n"), hashlib.sha256(data).hexdigest()


def _corpus(src: Path, questions: list[bytes]) -> list[bytes]:
    """The corpus lines whose id is a ``context_doc_ids`` entry of ``questions``, in corpus order."""
    wanted = {doc for q in questions for doc in json.loads(q)["context_doc_ids"]}
    picked = [line for line in _lines(src) if json.loads(line)["id"] in wanted]
    found = {json.loads(line)["id"] for line in picked}
    if found != wanted:
        sys.exit(f"error: {len(wanted - found)} context ids missing from {src}, e.g. {sorted(wanted - found)[:3]}")
    return picked


def build(shared: Path, out: Path) -> dict[str, tuple[int, str]]:
    """Write every demo file into ``out``; returns file name -> (rows, sha256)."""
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, tuple[int, str]] = {}
    for files, rows, (corpus_src, corpus_name) in ((TRAIN_FILES, TRAIN_ROWS, TRAIN_CORPUS),
                                                   (HELDOUT_FILES, HELDOUT_ROWS, HELDOUT_CORPUS)):
        questions: list[bytes] = []
        for name, src in files.items():
            picked = _pick(shared / src, rows)
            written[name] = _write(out / name, picked)
            questions += picked
        written[corpus_name] = _write(out / corpus_name, _corpus(shared / corpus_src, questions))
    return written


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--shared`` (source folder), ``--out`` (default: this folder)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from build_cli import run

    return run(build, __doc__.splitlines()[0], Path(__file__).resolve().parent, argv)


if __name__ == "__main__":
    raise SystemExit(main())
