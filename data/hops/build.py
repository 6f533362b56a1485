"""Rebuild ``data/hops/``: single-hop questions from 2WikiMultihopQA's evidence triples (issue 27's material).

The multi-hop learning presets showed that for SmolLM2-135M a search is worth little on multi-hop questions (gold
paragraphs +0.068 F1 over closed-book, ``docs/results/learning/search_value.md``). 2WikiMultihopQA rows carry their
reasoning as (subject, relation, object) evidence triples, and the subject's paragraph is a supporting paragraph of
the row. Each triple becomes one single-hop question whose answer is written in one paragraph that a search for
the question can find: ``("Love in Pawn", "director", "Charles Saunders")`` -> "Who is the director of Love in
Pawn?", gold answer "Charles Saunders", supporting paragraph the corpus paragraph titled "Love in Pawn".

Run from the repository root with the project's shared data folder at hand::

    python data/hops/build.py --shared ../shared/data

Selection (fixed, no randomness; rows 0-based; decided before any model saw these files):

- a triple is kept when its subject is the title of one of the row's supporting paragraphs and the object string
  occurs in that paragraph's text (case-insensitive): the answer is readable in the document a search must find;
- ``2wiki_hops_warmup.jsonl``: triples of rows 0-249 of ``train/2wikimultihopqa_train_migres.jsonl`` (warm-up SFT);
- ``2wiki_hops_rl.jsonl``: triples of rows 250-499 of the same file (the RL questions; disjoint from the warm-up's);
- ``2wiki_hops_heldout.jsonl``: the first ``HELDOUT_SIZE`` triples of ``eval/2wikimultihopqa_dev.jsonl`` from row
  50 on (past the eval mini), dropping any whose question text or parent id occurs in the training files;
- ``2wiki_hops_heldout600.jsonl``: the first ``HELDOUT_LARGE_SIZE`` of the same sequence (its first 210 rows are
  ``2wiki_hops_heldout.jsonl``, byte for byte): the larger held-out set of issue 27's attempt 10, fixed before it ran.

Question texts are unique within and across the three files. Each row: ``id`` (``<parent id>#<triple index>``),
``question``, ``golden_answers`` ([object]), ``dataset`` (``2wiki_hops``), ``split``, ``supporting_titles``,
``supporting_doc_ids`` (the subject's paragraph), ``metadata`` (``qa_pairs``: the one (question, answer) pair,
which the warm-up renders as one search then the answer; ``parent_id``, ``evidence``, ``relation``, ``source``).
Standard library only.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

HELDOUT_SIZE = 210
HELDOUT_LARGE_SIZE = 600
HELDOUT_START = 50
TRAIN_SRC = "train/2wikimultihopqa_train_migres.jsonl"
DEV_SRC = "eval/2wikimultihopqa_dev.jsonl"
TRAIN_CORPUS = "corpus/train_wiki.jsonl"
DEV_CORPUS = "corpus/multihop_wiki.jsonl"
WARMUP_ROWS = range(0, 250)
RL_ROWS = range(250, 500)

WHO = {"director", "father", "mother", "spouse", "performer", "composer", "child", "sibling", "producer",
       "founded by", "editor", "screenwriter", "cast member"}
PHRASES = {
    "date of birth": "When was {s} born?",
    "date of death": "When did {s} die?",
    "place of birth": "Where was {s} born?",
    "place of death": "Where did {s} die?",
    "place of burial": "Where was {s} buried?",
    "publication date": "When was {s} published?",
    "cause of death": "What was the cause of death of {s}?",
    "educated at": "Where was {s} educated?",
    "has part": "Who is part of {s}?",
    "country": "Which country is {s} in?",
    "country of origin": "Which country does {s} come from?",
}


def question_for(subject: str, relation: str) -> str:
    """The single-hop question of one evidence triple."""
    if relation in PHRASES:
        return PHRASES[relation].format(s=subject)
    if relation in WHO:
        return f"Who is the {relation} of {subject}?"
    return f"What is the {relation} of {subject}?"


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        sys.exit(f"error: {path} does not exist; pass --shared <the shared data folder>")
    return [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def _field(row: dict[str, Any], key: str) -> Any:
    """A field that some shared files store as a Python literal string."""
    value = row.get(key)
    return ast.literal_eval(value) if isinstance(value, str) and value[:1] in "[{" else value


def _corpus(path: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in map(json.loads, _lines(path))}


def hops_of(row: dict[str, Any], corpus: dict[str, dict[str, Any]], split: str, src: str,
            index: int) -> list[dict[str, Any]]:
    """The kept single-hop rows of one 2Wiki row (see the module docstring for the rule)."""
    meta = _field(row, "metadata") or {}
    by_title = {corpus[i]["title"]: corpus[i] for i in _field(row, "supporting_doc_ids") or [] if i in corpus}
    out = []
    for k, (subject, relation, obj) in enumerate(meta.get("evidences") or []):
        para = by_title.get(subject)
        if para is None or obj.lower() not in para["text"].lower():
            continue
        q = question_for(subject, relation)
        out.append({"id": f"{row['id']}#{k}", "question": q, "golden_answers": [obj], "dataset": "2wiki_hops",
                    "split": split, "supporting_titles": [para["title"]], "supporting_doc_ids": [para["id"]],
                    "metadata": {"qa_pairs": [{"question": q, "answer": obj}], "parent_id": row["id"],
                                 "evidence": [subject, relation, obj], "relation": relation,
                                 "source": {"file": src, "row": index}}})
    return out


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def build(shared: Path, out: Path) -> dict[str, tuple[int, str]]:
    """Write the three files into ``out``; returns file name -> (rows, sha256)."""
    train_rows = [json.loads(x) for x in _lines(shared / TRAIN_SRC)]
    dev_rows = [json.loads(x) for x in _lines(shared / DEV_SRC)]
    if len(train_rows) < RL_ROWS.stop:
        sys.exit(f"error: {TRAIN_SRC} has {len(train_rows)} rows; {RL_ROWS.stop} are needed")
    train_corpus, dev_corpus = _corpus(shared / TRAIN_CORPUS), _corpus(shared / DEV_CORPUS)
    seen: set[str] = set()
    parents: set[str] = set()
    files: dict[str, list[dict[str, Any]]] = {}

    def take(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        kept = [r for r in rows if _norm(r["question"]) not in seen and r["metadata"]["parent_id"] not in parents]
        # one row per text: the first occurrence, placed where the text last occurs (the order the committed files,
        # and so the held-out set's first 210, were built with)
        uniq = list({_norm(r["question"]): r for r in reversed(kept)}.values())[::-1]
        seen.update(_norm(r["question"]) for r in uniq)
        return uniq

    for name, rng in (("2wiki_hops_warmup.jsonl", WARMUP_ROWS), ("2wiki_hops_rl.jsonl", RL_ROWS)):
        files[name] = take([h for i in rng for h in hops_of(train_rows[i], train_corpus, "train", TRAIN_SRC, i)])
    parents = {r["metadata"]["parent_id"] for rows in files.values() for r in rows}
    heldout = take([h for i in range(HELDOUT_START, len(dev_rows))
                    for h in hops_of(dev_rows[i], dev_corpus, "dev", DEV_SRC, i)])
    if len(heldout) < HELDOUT_LARGE_SIZE:
        sys.exit(f"error: only {len(heldout)} held-out hops; {HELDOUT_LARGE_SIZE} are needed")
    files["2wiki_hops_heldout.jsonl"] = heldout[:HELDOUT_SIZE]
    files["2wiki_hops_heldout600.jsonl"] = heldout[:HELDOUT_LARGE_SIZE]
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, rows in files.items():
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
        (out / name).write_bytes(data)
        written[name] = (len(rows), hashlib.sha256(data).hexdigest())
    return written


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--shared`` (source folder), ``--out`` (default: this folder)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from build_cli import run

    return run(build, __doc__.splitlines()[0], Path(__file__).resolve().parent, argv)


if __name__ == "__main__":
    raise SystemExit(main())
