"""Label ``data/hops/2wiki_hops_rl.jsonl`` with R1-Searcher's two training stages: ``2wiki_hops_rl_staged.jsonl``.

R1-Searcher trains stage 1 (learn to call the retriever: answer +-1, retrieve +0.5, format +0.5) on "medium"
questions and stage 2 (answer F1, a penalty for any format violation) on "medium and difficult" ones, where the
seed measured difficulty as the number of rollouts a stronger model needed (``../shared/notes/seeds.md`` 1.3). No
stronger model runs here, and rolling out the policy itself on every question costs more than the learning run's
hour, so difficulty comes from the retriever the rollouts use, fixed before any run of the preset that reads it:

- ``metadata.stage = 1`` ("medium": one search with the question's own words finds the answer's paragraph) when the
  top-1 BM25 hit of the question text over ``corpus/train_wiki.jsonl`` (the training retriever of the single-hop
  presets) is one of the row's ``supporting_doc_ids``;
- ``metadata.stage = 2`` ("difficult": the agent must read a weaker passage or search in other words) otherwise.

The R1-Searcher single-hop preset trains stage 1 on the stage-1 rows and stage 2 on every row (medium and
difficult, as the seed's stage 2). Rows, their order and every other field are unchanged. Run from the repository
root with the shared data folder at hand (uses the project's BM25 backend)::

    python data/hops/stages.py --shared ../shared/data
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = "2wiki_hops_rl.jsonl"
TARGET = "2wiki_hops_rl_staged.jsonl"
CORPUS = "corpus/train_wiki.jsonl"


def label(rows: list[dict], corpus: Path) -> list[dict]:
    """``rows`` with ``metadata.stage`` set by the top-1 BM25 rule of the module docstring."""
    from retrieval.open import bm25_over

    searcher = bm25_over((str(corpus.resolve()),))
    hits = searcher.search([r["question"] for r in rows], k=1)
    out = []
    for row, top in zip(rows, hits, strict=True):
        found = bool(top) and top[0].id in set(row["supporting_doc_ids"])
        out.append({**row, "metadata": {**row["metadata"], "stage": 1 if found else 2}})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", required=True, help="the shared data folder (holds corpus/train_wiki.jsonl)")
    parser.add_argument("--out", default=str(HERE), help="folder to write the labelled file into")
    args = parser.parse_args(argv)
    corpus = Path(args.shared) / CORPUS
    if not corpus.is_file():
        sys.exit(f"error: {corpus} not found: pass --shared <the shared data folder> (it holds {CORPUS})")
    rows = [json.loads(line) for line in (HERE / SOURCE).read_text(encoding="utf-8").splitlines() if line.strip()]
    labelled = label(rows, corpus)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in labelled)
    from infra import artifacts

    target = Path(args.out) / TARGET
    artifacts.write_text(str(target), text)  # temporary file, then rename
    stages = [r["metadata"]["stage"] for r in labelled]
    print(f"{target.name}: {len(rows)} rows, stage 1 {stages.count(1)}, stage 2 {stages.count(2)}, "
          f"sha256 {hashlib.sha256(text.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
