"""The RL questions' date files: ``2wiki_hops_rl_dates.jsonl`` (ReSearch attempt 8) and
``2wiki_hops_rl_nodates.jsonl`` (ReSearch attempt 9).

Every single-hop RL run with an F1-based reward (ReSearch attempts 5-7, R1-Searcher attempt 5, ExSearch's EM) moved
"When did X die?" towards the paragraph's *first* date, the birth date ("January 22, 1940" -> "March 3, 1883").
In ``2wiki_hops_rl.jsonl`` the first year written in a "When ..." question's paragraph (``corpus/train_wiki.jsonl``)
is the gold year for 49 of 50 "date of birth" and 22 of 22 "publication date" questions and for none of the 33
"date of death" ones: answering the first date earns the reward on 71 of 105 date questions.

``2wiki_hops_rl_dates.jsonl`` balances the two dates: it adds the warm-up file's 36 "date of death" questions
(``2wiki_hops_warmup.jsonl``; the 40-step warm-up trains on 160 of its 504 trajectories), so that the death dates
(69) weigh about as much as the first dates (71):

- the rows of ``2wiki_hops_rl.jsonl``, unchanged and in order;
- then the rows of ``2wiki_hops_warmup.jsonl`` whose ``metadata.relation`` is ``date of death``, in order.

``2wiki_hops_rl_nodates.jsonl`` takes the date questions out instead: the rows of ``2wiki_hops_rl.jsonl`` whose
``metadata.relation`` is not a date (:data:`DATE_RELATIONS`), unchanged and in order, 418 of 524. Why: over three
seeds attempt 8 moved held-out birth dates by -0.126, -0.024 and -0.273 and death dates by +0.360, +0.095 and
+0.399 (a paragraph holds both dates; the policy learned which position to answer), while the 420 held-out
questions that ask for neither moved +0.015, +0.025 and -0.010 (``docs/results/learning/README.md``).

Deterministic, reads only committed files (written with ``infra.artifacts``: a temporary file, then a rename);
``tests/test_hops_data.py`` rebuilds both. Run from the repository root::

    python data/hops/dates.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RL = "2wiki_hops_rl.jsonl"
WARMUP = "2wiki_hops_warmup.jsonl"
TARGET = "2wiki_hops_rl_dates.jsonl"
NODATES_TARGET = "2wiki_hops_rl_nodates.jsonl"
ADDED_RELATION = "date of death"
#: the relations whose answer is a date in the RL file (2Wiki's ``date of birth``, ``date of death``,
#: ``publication date`` and ``inception``)
DATE_RELATIONS = frozenset({"date of birth", "date of death", "publication date", "inception"})


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def balanced(rl: list[str], warmup: list[str]) -> list[str]:
    """The RL file's lines, then the warm-up lines whose relation is :data:`ADDED_RELATION` (both kept verbatim)."""
    return rl + [line for line in warmup if json.loads(line)["metadata"]["relation"] == ADDED_RELATION]


def without_dates(rl: list[str]) -> list[str]:
    """The RL file's lines whose relation is not in :data:`DATE_RELATIONS` (kept verbatim, in order)."""
    return [line for line in rl if json.loads(line)["metadata"]["relation"] not in DATE_RELATIONS]


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--out`` (default: this folder)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE), help="folder to write the files into")
    args = parser.parse_args(argv)
    rl = _lines(HERE / RL)
    sys.path.insert(0, str(HERE.parent.parent))
    from infra import artifacts

    for name, lines in ((TARGET, balanced(rl, _lines(HERE / WARMUP))), (NODATES_TARGET, without_dates(rl))):
        text = "".join(line + "\n" for line in lines)
        target = Path(args.out) / name
        artifacts.write_text(str(target), text)  # temporary file, then rename
        print(f"{target.name}: {len(lines)} rows, sha256 {hashlib.sha256(text.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
