"""The RL questions without the date questions: ``2wiki_hops_rl_nodates.jsonl`` (ReSearch attempt 9).

A paragraph of ``corpus/train_wiki.jsonl`` that answers a "When ..." question usually holds two dates (birth and
death, or a release and a later one), and the single-hop RL runs with an F1-based reward learned which of the two
to answer rather than to read the question: ReSearch attempt 8 (``2wiki_hops_rl_dates.jsonl``, the death dates
balanced against the first dates) moved birth dates by -0.126, -0.024 and -0.273 over three seeds and death dates by
+0.360, +0.095 and +0.399, while the 420 held-out questions that ask for neither moved +0.015, +0.025 and -0.010
(``docs/results/learning/README.md``). This file keeps the rows of ``2wiki_hops_rl.jsonl`` whose
``metadata.relation`` is not a date (:data:`DATE_RELATIONS`), unchanged and in order: 418 of 524.

Deterministic, reads only committed files (written with ``infra.artifacts``: a temporary file, then a rename);
``tests/test_hops_data.py`` rebuilds it. Run from the repository root::

    python data/hops/nodates.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RL = "2wiki_hops_rl.jsonl"
TARGET = "2wiki_hops_rl_nodates.jsonl"
#: the relations whose answer is a date in the RL file (2Wiki's ``date of birth``, ``date of death``,
#: ``publication date`` and ``inception``)
DATE_RELATIONS = frozenset({"date of birth", "date of death", "publication date", "inception"})


def without_dates(rl: list[str]) -> list[str]:
    """The RL file's lines whose relation is not in :data:`DATE_RELATIONS` (kept verbatim, in order)."""
    return [line for line in rl if json.loads(line)["metadata"]["relation"] not in DATE_RELATIONS]


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--out`` (default: this folder)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE), help="folder to write the file into")
    args = parser.parse_args(argv)
    rl = [line for line in (HERE / RL).read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = without_dates(rl)
    text = "".join(line + "\n" for line in lines)
    sys.path.insert(0, str(HERE.parent.parent))
    from infra import artifacts

    target = Path(args.out) / TARGET
    artifacts.write_text(str(target), text)  # temporary file, then rename
    print(f"{target.name}: {len(lines)} rows, sha256 {hashlib.sha256(text.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
