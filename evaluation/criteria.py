"""Issue 27's learning criteria, recomputed from the committed held-out rows of each evidence folder.

An evidence folder (``docs/results/learning/<recipe>/``) holds ``heldout_start.jsonl`` and ``heldout_final.jsonl``:
one row per held-out question with ``reward`` (the recipe's own signal), ``f1``, ``format_ok`` and ``n_searches``.
From those rows alone (no run, no summary file), with the paired bootstrap of :mod:`evaluation.paired`:

1. the recipe's reward: the 95% interval of final - start above 0;
2. F1: the interval above 0;
3. the agent keeps searching: mean searches per question at the end >= 0.8 x the start and >= 0.5;
4. not format alone: the mean F1 change among rows format-ok at both ends > 0;
5. a replicate with other seeds (a folder ``<recipe>__seed<N>``) meets 1-3 too.

Rows written since session 36 also hold ``answer_retrieved`` (a document a search returned holds a gold answer);
where both files have it, the searches cell adds the share of questions whose searches found the answer, start ->
final, so a gain is split into better searches and better reading of what was found.

``python -m evaluation.criteria docs/results/learning/*/`` prints the table as markdown (``--json`` for rows);
folders without both files (attempts stopped before their final evaluation) are listed as such. ``--ids FILE``
restricts every folder to the questions whose ``id`` a JSONL file lists (e.g. the first 210 rows of a larger
held-out set: ``--ids data/hops/2wiki_hops_heldout.jsonl``); a folder holding none of them is skipped.

``--by FIELD --questions FILE`` splits each folder's F1 change by a field of the held-out questions (a dotted path,
e.g. ``metadata.relation``): per group, the rows, F1 start -> final with its paired interval, the questions that went
up and down and the summed change, so a mean that hides a trade between question types is read as one (ReSearch's
single-hop runs gained on "When was X born?" and lost on "When did X die?"). Groups under ``--min-group`` rows are
pooled as ``(other)``, and so are groups not named in ``--groups A,B`` when it is given.

``--pool`` reads a recipe and its replicates together (a folder and every ``<folder>__seed<N>`` given, all on the
same questions): per question the change averaged over the seeds, with two intervals. "Questions" resamples the
questions with the seeds fixed: the expected change of these seeds' runs on such questions. "Seeds x questions"
resamples the seeds too (with replacement, then the questions), so the spread between seeds widens it; with three
seeds it is a rough bound. Neither replaces criterion 5, which asks each replicate to resolve on its own: pooling
says whether a recipe whose runs each sit at the edge of what the held-out set resolves moves the answers on average.

``--answers`` reads the predictions: per folder, how many answers are exact (F1 1), partial (0 < F1 < 1), copied
from the question, another wrong answer, or none, start -> final; the largest moves between those kinds; and, where
rows record ``answer_retrieved``, how many answers below F1 1 had a gold answer in what their searches returned (a
reading error, not a search error). A gain that is "none -> exact" is format; "other -> exact" is answers.

``--searched`` reads whether the agent searched: per folder, searches per question start -> final with the paired
interval of the change, the share of questions with at least one search, and the questions split by whether the
start and the final policy searched (no -> no, no -> yes, yes -> no, yes -> yes), each with its mean F1 start ->
final. An agent that learns to search moves questions from "no" to "yes" and gains F1 there; one that stops searching
(Search-R1's multi-hop attempt 1) moves them the other way.

``--gold GOLD_JSONL`` (once per folder, in the folders' order) reads what a run's start policy left to learn: the
``gold`` condition of ``searchloop run search-value`` on the same checkpoint and questions (the supporting paragraph
inserted after a scripted first search) against the folder's start and final rows. Per folder: F1 start, with the
gold paragraph, final; the headroom gold - start, the gain final - start and gold - final, each with its paired
interval, and the share of the headroom the run took. A seed whose start already searches well leaves a gain too
small for the held-out set to resolve, whatever RL does (ReSearch's seed 44, session 35).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evaluation.metrics import copied_from_question
from evaluation.paired import PairedDiff, paired_bootstrap, paired_rows

SEARCH_KEEP_RATIO = 0.8
SEARCH_FLOOR = 0.5
#: a bound within this of 0 is 0: a mean of discrete differences can land at 2e-18 instead of 0 (float summation)
EPS = 1e-9


class Criteria(BaseModel):
    """One evidence folder's numbers and criteria 1-4 (5 is decided across folders)."""

    folder: str = Field(description="Evidence folder name.")
    n: int = Field(description="Held-out questions paired.")
    reward: PairedDiff
    f1: PairedDiff
    f1_format_ok_both: PairedDiff = Field(description="F1 change among rows format-ok at start and at final.")
    searches_start: float
    searches_final: float
    format_start: float
    format_final: float
    retrieved_start: float | None = Field(default=None, description="Share of questions whose searches returned "
                                          "a gold answer at the start (rows without ``answer_retrieved``: None).")
    retrieved_final: float | None = None
    c1_reward: bool
    c2_f1: bool
    c3_searching: bool
    c4_not_format_only: bool

    @property
    def meets_1_to_3(self) -> bool:
        """Criteria 1-3 (what a replicate must meet)."""
        return self.c1_reward and self.c2_f1 and self.c3_searching

    @property
    def meets_1_to_4(self) -> bool:
        """Criteria 1-4 (what the main run must meet)."""
        return self.meets_1_to_3 and self.c4_not_format_only


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def read_ids(path: str | Path) -> set[str]:
    """The ``id`` of every row of a JSONL file (a held-out set or an evidence file)."""
    try:
        rows = _rows(Path(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a JSONL file ({exc}); pass a JSONL file of questions with an 'id' "
                         "field") from exc
    ids = {str(r["id"]) for r in rows if isinstance(r, dict) and "id" in r}
    if not ids:
        raise ValueError(f"{path} holds no rows with an 'id' field; pass a JSONL file of questions")
    return ids


def evaluate_folder(folder: str | Path, n_resamples: int = 10000, seed: int = 0,
                    ids: set[str] | None = None) -> Criteria | None:
    """Criteria of one evidence folder; None when it lacks a start or final evaluation (or, with ``ids``, holds
    none of those questions)."""
    d = Path(folder)
    start_p, final_p = d / "heldout_start.jsonl", d / "heldout_final.jsonl"
    if not (start_p.is_file() and final_p.is_file()):
        return None
    start, final = _rows(start_p), _rows(final_p)
    if ids is not None:
        start = [r for r in start if str(r["id"]) in ids]
        final = [r for r in final if str(r["id"]) in ids]
        if not start:
            return None
    diffs = paired_rows(start, final, ["reward", "f1", "n_searches", "format_ok"], n_resamples=n_resamples,
                        seed=seed)
    by_id = {str(r["id"]): r for r in final}
    both = [(r, by_id[str(r["id"])]) for r in start if r.get("format_ok") and by_id[str(r["id"])].get("format_ok")]
    fok = paired_bootstrap([float(a["f1"]) for a, _ in both], [float(b["f1"]) for _, b in both],
                           field="f1_format_ok_both", n_resamples=n_resamples, seed=seed)
    s = diffs["n_searches"]
    found: dict[str, float] = {}
    if all("answer_retrieved" in r for r in (*start, *final)):
        found = {"retrieved_start": sum(float(r["answer_retrieved"]) for r in start) / len(start),
                 "retrieved_final": sum(float(r["answer_retrieved"]) for r in final) / len(final)}
    return Criteria(folder=d.name, n=diffs["f1"].n, reward=diffs["reward"], f1=diffs["f1"], f1_format_ok_both=fok,
                    searches_start=s.start, searches_final=s.final, format_start=diffs["format_ok"].start,
                    format_final=diffs["format_ok"].final, **found, c1_reward=diffs["reward"].low > EPS,
                    c2_f1=diffs["f1"].low > EPS,
                    c3_searching=s.final >= SEARCH_KEEP_RATIO * s.start and s.final >= SEARCH_FLOOR,
                    c4_not_format_only=fok.n > 0 and fok.diff > EPS)


def replicate_of(name: str) -> str | None:
    """The recipe folder a replicate folder ``<recipe>__seed<N>`` belongs to, else None."""
    m = re.fullmatch(r"(.+)__seed\d+", name)
    return m.group(1) if m else None


def _ci(p: PairedDiff) -> str:
    return f"{p.diff:+.3f} [{p.low:+.3f}, {p.high:+.3f}]"


def _found(r: Criteria) -> str:
    if r.retrieved_start is None or r.retrieved_final is None:
        return ""
    return f" (answer found {r.retrieved_start:.2f} → {r.retrieved_final:.2f})"


def table(results: Sequence[Criteria], missing: Sequence[str] = ()) -> str:
    """Markdown table: numbers, criteria 1-4 per folder, criterion 5 on the main folder of a recipe, and whether
    all five hold (the folder meets 1-4 and one of its replicates meets 1-3)."""
    reps: dict[str, list[Criteria]] = {}
    for r in results:
        base = replicate_of(r.folder)
        if base:
            reps.setdefault(base, []).append(r)
    yes = {True: "yes", False: "no"}
    lines = ["| evidence | n | reward Δ [95%] | F1 Δ [95%] | F1 Δ, format-ok both ends (rows) | searches start → "
             "final | format-ok start → final | 1 | 2 | 3 | 4 | 5 (replicate meets 1-3) | 1-5 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if replicate_of(r.folder):
            c5, all5 = "(replicate)", "-"
        elif r.folder in reps:
            c5 = ", ".join(f"{x.folder}: {yes[x.meets_1_to_3]}" for x in reps[r.folder])
            all5 = yes[r.meets_1_to_4 and any(x.meets_1_to_3 for x in reps[r.folder])]
        else:
            c5, all5 = "no replicate", "no"
        lines.append(f"| {r.folder} | {r.n} | {_ci(r.reward)} | {_ci(r.f1)} | {_ci(r.f1_format_ok_both)} "
                     f"({r.f1_format_ok_both.n}) | {r.searches_start:.2f} → {r.searches_final:.2f}{_found(r)} | "
                     f"{r.format_start:.2f} → {r.format_final:.2f} | {yes[r.c1_reward]} | {yes[r.c2_f1]} | "
                     f"{yes[r.c3_searching]} | {yes[r.c4_not_format_only]} | {c5} | {all5} |")
    if missing:
        lines.append("")
        lines.append("No final evaluation (stopped before it): " + ", ".join(missing) + ".")
    return "\n".join(lines)


class PooledChange(BaseModel):
    """A recipe's runs over several seeds on the same questions (``--pool``)."""

    recipe: str = Field(description="The main folder's name.")
    folders: list[str] = Field(description="The folders pooled: the main one, then its replicates.")
    n: int = Field(description="Questions every folder holds.")
    field: str
    per_seed: list[float] = Field(description="Each folder's mean final - start, in the order of ``folders``.")
    diff: float = Field(description="Mean over seeds and questions of final - start.")
    low_questions: float = Field(description="95% interval, questions resampled, seeds fixed: lower bound.")
    high_questions: float
    low_seeds_questions: float = Field(description="95% interval, seeds resampled, then questions: lower bound.")
    high_seeds_questions: float


def pooled_seeds(folders: Sequence[str | Path], field: str = "f1", n_resamples: int = 10000, seed: int = 0,
                 ids: set[str] | None = None, confidence: float = 0.95) -> PooledChange:
    """The change of ``field`` averaged over a recipe's seeds (``folders``: the main one first), with an interval
    over questions and one over seeds and questions.

    Raises:
        ValueError: fewer than two folders, a folder without both evaluations, or folders that share no question.
    """
    import numpy as np

    paths = [Path(f) for f in folders]
    if len(paths) < 2:
        raise ValueError(f"pooling needs a recipe and at least one replicate (<recipe>__seed<N>), got {len(paths)} "
                         "folder(s)")
    per: list[dict[str, tuple[float, float]]] = []
    for d in paths:
        start_p, final_p = d / "heldout_start.jsonl", d / "heldout_final.jsonl"
        if not (start_p.is_file() and final_p.is_file()):
            raise ValueError(f"{d} lacks heldout_start.jsonl or heldout_final.jsonl; pool finished runs only")
        final = {str(r["id"]): r for r in _rows(final_p)}
        pairs = {}
        for r in _rows(start_p):
            q = str(r["id"])
            if q in final and (ids is None or q in ids):
                a, b = r.get(field), final[q].get(field)
                if a is not None and b is not None:
                    pairs[q] = (float(a), float(b))
        per.append(pairs)
    common = sorted(set.intersection(*(set(d) for d in per)))
    if not common:
        raise ValueError(f"{', '.join(p.name for p in paths)} share no question with a {field!r} value at both ends; "
                         "pool runs evaluated on the same held-out set")
    start = np.array([[d[q][0] for q in common] for d in per])  # seeds x questions
    final = np.array([[d[q][1] for q in common] for d in per])
    # questions resampled, seeds fixed: the paired bootstrap of the seed-averaged start and final values
    by_q = paired_bootstrap(start.mean(axis=0).tolist(), final.mean(axis=0).tolist(), field=field,
                            confidence=confidence, n_resamples=n_resamples, seed=seed)
    m = final - start
    k, n = m.shape
    rng = np.random.default_rng(seed)
    sq_means = np.array([m[rng.integers(0, k, k)][:, rng.integers(0, n, n)].mean() for _ in range(n_resamples)])
    alpha = (1 - confidence) / 2
    ls, hs = np.quantile(sq_means, [alpha, 1 - alpha])
    return PooledChange(recipe=paths[0].name, folders=[p.name for p in paths], n=n, field=field,
                        per_seed=[float(x) for x in m.mean(axis=1)], diff=float(m.mean()), low_questions=by_q.low,
                        high_questions=by_q.high, low_seeds_questions=float(ls), high_seeds_questions=float(hs))


def pooled_table(pools: Sequence[PooledChange]) -> str:
    """Markdown table of ``--pool``: per recipe and field, each seed's change and the pooled change's intervals."""
    lines = ["| recipe | field | seeds | n | per seed | mean over seeds | 95%, questions resampled | 95%, seeds x "
             "questions resampled |", "|---|---|---|---|---|---|---|---|"]
    for p in pools:
        lines.append(f"| {p.recipe} | {p.field} | {len(p.folders)} | {p.n} | "
                     f"{', '.join(f'{x:+.3f}' for x in p.per_seed)} | {p.diff:+.3f} | "
                     f"[{p.low_questions:+.3f}, {p.high_questions:+.3f}] | "
                     f"[{p.low_seeds_questions:+.3f}, {p.high_seeds_questions:+.3f}] |")
    return "\n".join(lines)


class GroupChange(BaseModel):
    """The F1 change of one group of held-out questions (``--by``)."""

    group: str
    f1: PairedDiff
    up: int = Field(description="Questions whose F1 rose.")
    down: int = Field(description="Questions whose F1 fell.")
    summed: float = Field(description="Sum of final - start F1 over the group's questions.")


def question_groups(questions: Iterable[Any], field: str | None) -> dict[str, str]:
    """Question id -> the value of ``field`` (a dotted path, e.g. ``metadata.relation``) for the questions (rows or
    pydantic models) that have a plain value there; empty when ``field`` is None or no question has it."""
    from evaluation.predictions import MISSING, get_field

    if not field:
        return {}
    out: dict[str, str] = {}
    for q in questions:
        row = q.model_dump(mode="json") if hasattr(q, "model_dump") else q
        value = get_field(row, field)
        if isinstance(row, dict) and "id" in row and value is not MISSING and value is not None \
                and not isinstance(value, (dict, list)):
            out[str(row["id"])] = str(value)
    return out


def group_changes(folder: str | Path, groups: Mapping[str, str], min_group: int = 10, n_resamples: int = 10000,
                  seed: int = 0, keep: Sequence[str] | None = None) -> list[GroupChange]:
    """:func:`row_group_changes` of one evidence folder's ``heldout_start.jsonl`` / ``heldout_final.jsonl``; empty
    when the folder lacks either evaluation."""
    d = Path(folder)
    start_p, final_p = d / "heldout_start.jsonl", d / "heldout_final.jsonl"
    if not (start_p.is_file() and final_p.is_file()):
        return []
    return row_group_changes(_rows(start_p), _rows(final_p), groups, min_group, n_resamples, seed, keep)


def row_group_changes(start: Sequence[dict[str, Any]], final_rows: Sequence[dict[str, Any]],
                      groups: Mapping[str, str], min_group: int = 10, n_resamples: int = 10000, seed: int = 0,
                      keep: Sequence[str] | None = None) -> list[GroupChange]:
    """F1 final - start of held-out rows split by ``groups`` (question id -> group name); groups with fewer than
    ``min_group`` paired rows, or not in ``keep`` when it is given, are pooled as ``(other)``, questions without a
    group as ``(none)``. Largest groups first."""
    final = {str(r["id"]): r for r in final_rows}
    pairs: dict[str, list[tuple[float, float]]] = {}
    for r in start:
        f = final.get(str(r["id"]))
        if f is not None:
            pairs.setdefault(groups.get(str(r["id"]), "(none)"), []).append((float(r["f1"]), float(f["f1"])))
    pooled: dict[str, list[tuple[float, float]]] = {}
    for name, rows in pairs.items():
        kept = len(rows) >= min_group and (keep is None or name in keep)
        pooled.setdefault(name if kept else "(other)", []).extend(rows)
    out = []
    for name, rows in sorted(pooled.items(), key=lambda kv: (kv[0] == "(other)", -len(kv[1]), kv[0])):
        a, b = [x for x, _ in rows], [y for _, y in rows]
        out.append(GroupChange(group=name, f1=paired_bootstrap(a, b, field="f1", n_resamples=n_resamples, seed=seed),
                               up=sum(y > x for x, y in rows), down=sum(y < x for x, y in rows),
                               summed=sum(y - x for x, y in rows)))
    return out


def group_table(folder: str, changes: Sequence[GroupChange]) -> str:
    """Markdown table of :func:`group_changes` for one folder."""
    lines = [f"{folder}:", "", "| group | n | F1 start → final | F1 Δ [95%] | up / down | summed Δ |",
             "|---|---|---|---|---|---|"]
    for c in changes:
        lines.append(f"| {c.group} | {c.f1.n} | {c.f1.start:.3f} → {c.f1.final:.3f} | {_ci(c.f1)} | "
                     f"{c.up} / {c.down} | {c.summed:+.1f} |")
    return "\n".join(lines)


ANSWER_KINDS = ("exact", "partial", "copied", "other", "none")


class SearchMove(BaseModel):
    """The questions whose start and final policies did (or did not) search, and their mean F1 at both ends."""

    start_searched: bool
    final_searched: bool
    n: int
    f1_start: float
    f1_final: float


class SearchedSplit(BaseModel):
    """One folder's searching, start -> final (``--searched``)."""

    folder: str
    n: int
    searches: PairedDiff = Field(description="Searches per question, final - start, paired interval.")
    searched_start: float = Field(description="Share of questions with at least one search at the start.")
    searched_final: float
    moves: list[SearchMove]


def _paired_ends(folder: Path, ids: set[str] | None = None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(start row, final row) of every question both ends of an evidence folder hold (within ``ids`` when given), in
    the start file's order; empty without both files."""
    start_p, final_p = folder / "heldout_start.jsonl", folder / "heldout_final.jsonl"
    if not (start_p.is_file() and final_p.is_file()):
        return []
    final_by_id = {str(r["id"]): r for r in _rows(final_p)}
    return [(r, final_by_id[str(r["id"])]) for r in _rows(start_p)
            if str(r["id"]) in final_by_id and (ids is None or str(r["id"]) in ids)]


def searched_split(folder: str | Path, ids: set[str] | None = None, n_resamples: int = 10000,
                   seed: int = 0) -> SearchedSplit | None:
    """Whether each question's start and final policy searched, and its F1 at both ends; None without both files."""
    d = Path(folder)
    pairs = _paired_ends(d, ids)
    if not pairs:
        return None
    counts = [(float(a.get("n_searches") or 0), float(b.get("n_searches") or 0)) for a, b in pairs]
    searches = paired_bootstrap([x for x, _ in counts], [y for _, y in counts], field="n_searches",
                                n_resamples=n_resamples, seed=seed)
    moves = []
    for searched_start in (False, True):
        for searched_final in (False, True):
            cell = [(a, b) for (a, b), (x, y) in zip(pairs, counts, strict=True)
                    if (x > 0) == searched_start and (y > 0) == searched_final]
            moves.append(SearchMove(
                start_searched=searched_start, final_searched=searched_final, n=len(cell),
                f1_start=sum(float(a.get("f1") or 0) for a, _ in cell) / len(cell) if cell else 0.0,
                f1_final=sum(float(b.get("f1") or 0) for _, b in cell) / len(cell) if cell else 0.0))
    n = len(pairs)
    return SearchedSplit(folder=d.name, n=n, searches=searches,
                         searched_start=sum(m.n for m in moves if m.start_searched) / n,
                         searched_final=sum(m.n for m in moves if m.final_searched) / n, moves=moves)


def searched_table(rows: Sequence[SearchedSplit]) -> str:
    """Markdown table of :func:`searched_split` rows."""
    def cell(m: SearchMove) -> str:
        return f"{m.n} ({m.f1_start:.3f} → {m.f1_final:.3f})" if m.n else "0"

    out = ["| evidence | n | searches / question start → final, Δ [95%] | searched start → final | no → no | "
           "no → yes | yes → no | yes → yes |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.folder} | {r.n} | {r.searches.start:.2f} → {r.searches.final:.2f}, {_ci(r.searches)} | "
                   f"{r.searched_start:.2f} → {r.searched_final:.2f} | "
                   + " | ".join(cell(m) for m in r.moves) + " |")
    out.append("")
    out.append("Cells: questions (mean F1 start → final), split by whether the start and the final policy searched.")
    return "\n".join(out)


def answer_kind(row: Mapping[str, Any]) -> str:
    """What a held-out row's answer is: ``exact`` (F1 1), ``partial`` (0 < F1 < 1), or a miss (F1 0) that is
    ``none`` (no answer), ``copied`` from the question (:func:`evaluation.metrics.copied_from_question`) or ``other``
    (a wrong answer of its own: another entity, date or place)."""
    f1 = float(row["f1"])
    if f1 >= 1 - EPS:
        return "exact"
    if f1 > EPS:
        return "partial"
    pred = str(row.get("pred") or "").strip()
    if not pred:
        return "none"
    if copied_from_question(str(row.get("question", "")), pred, row.get("golden_answers") or ()):
        return "copied"
    return "other"


class AnswerKinds(BaseModel):
    """How a folder's answers split by :func:`answer_kind`, start and final, and how the rows moved between kinds."""

    folder: str
    n: int
    start: dict[str, int]
    final: dict[str, int]
    moves: dict[str, int] = Field(description="'start kind -> final kind': rows, for rows whose kind changed.")
    missed_found_start: int | None = Field(
        default=None, description="Rows below F1 1 whose searches found a gold answer (answer_retrieved), start.")
    missed_found_final: int | None = None
    missed_start: int
    missed_final: int


def answer_kinds(folder: str | Path, ids: set[str] | None = None) -> AnswerKinds | None:
    """:class:`AnswerKinds` of one evidence folder (the questions both ends hold); None without both ends."""
    d = Path(folder)
    pairs = _paired_ends(d, ids)
    if not pairs:
        return None
    kinds = [(answer_kind(a), answer_kind(b)) for a, b in pairs]
    moves: dict[str, int] = {}
    for a, b in kinds:
        if a != b:
            moves[f"{a} -> {b}"] = moves.get(f"{a} -> {b}", 0) + 1
    found: dict[str, int] = {}
    if all("answer_retrieved" in r for pair in pairs for r in pair):
        found = {"missed_found_start": sum(bool(a["answer_retrieved"]) and ka != "exact"
                                           for (a, _), (ka, _) in zip(pairs, kinds, strict=True)),
                 "missed_found_final": sum(bool(b["answer_retrieved"]) and kb != "exact"
                                           for (_, b), (_, kb) in zip(pairs, kinds, strict=True))}
    return AnswerKinds(folder=d.name, n=len(pairs),
                       start={k: sum(a == k for a, _ in kinds) for k in ANSWER_KINDS},
                       final={k: sum(b == k for _, b in kinds) for k in ANSWER_KINDS},
                       moves=dict(sorted(moves.items(), key=lambda kv: -kv[1])), **found,
                       missed_start=sum(ka != "exact" for ka, _ in kinds),
                       missed_final=sum(kb != "exact" for _, kb in kinds))


def answer_kinds_table(rows: Sequence[AnswerKinds]) -> str:
    """Markdown table of :func:`answer_kinds`: each kind start -> final, the largest moves, and (where rows record
    it) how many answers below F1 1 had the gold answer in what their searches returned."""
    head = " | ".join(ANSWER_KINDS)
    out = [f"| evidence | n | {head} | below F1 1 with the answer found | largest moves |",
           "|---|---|" + "---|" * len(ANSWER_KINDS) + "---|---|"]
    for a in rows:
        cells = " | ".join(f"{a.start[k]} → {a.final[k]}" for k in ANSWER_KINDS)
        found = ("-" if a.missed_found_start is None else
                 f"{a.missed_found_start}/{a.missed_start} → {a.missed_found_final}/{a.missed_final}")
        moves = ", ".join(f"{k} {v}" for k, v in list(a.moves.items())[:4]) or "-"
        out.append(f"| {a.folder} | {a.n} | {cells} | {found} | {moves} |")
    return "\n".join(out)


class Headroom(BaseModel):
    """What a run's start policy left to learn on its held-out questions, against what the run took (F1)."""

    folder: str
    n: int
    gold_minus_start: PairedDiff
    final_minus_start: PairedDiff
    gold_minus_final: PairedDiff

    @property
    def taken(self) -> float:
        """Share of the headroom the run took (final - start over gold - start; NaN without headroom)."""
        room = self.gold_minus_start.diff
        return self.final_minus_start.diff / room if room > EPS else float("nan")


def headroom(folder: str | Path, gold_rows: Sequence[dict[str, Any]], n_resamples: int = 10000,
             seed: int = 0) -> Headroom:
    """Gold - start, final - start and gold - final F1 of ``folder`` on the questions the three share.

    Raises:
        ValueError: the folder lacks a start or final evaluation, or shares no question with ``gold_rows``.
    """
    d = Path(folder)
    if not ((d / "heldout_start.jsonl").is_file() and (d / "heldout_final.jsonl").is_file()):
        raise ValueError(f"{d} has no heldout_start.jsonl and heldout_final.jsonl; pass an evidence folder")
    start = {str(r["id"]): float(r["f1"]) for r in _rows(d / "heldout_start.jsonl")}
    final = {str(r["id"]): float(r["f1"]) for r in _rows(d / "heldout_final.jsonl")}
    gold = {str(r["id"]): float(r["f1"]) for r in gold_rows}
    ids = [i for i in start if i in final and i in gold]
    if not ids:
        raise ValueError(f"the gold rows share no question id with {d}; pass the search-value rows of its start "
                         "policy on the same held-out questions")
    s, f, g = [start[i] for i in ids], [final[i] for i in ids], [gold[i] for i in ids]
    kw = {"n_resamples": n_resamples, "seed": seed, "field": "f1"}
    return Headroom(folder=d.name, n=len(ids), gold_minus_start=paired_bootstrap(s, g, **kw),
                    final_minus_start=paired_bootstrap(s, f, **kw), gold_minus_final=paired_bootstrap(f, g, **kw))


def headroom_table(rows: Sequence[Headroom]) -> str:
    """Markdown table of :func:`headroom` results."""
    out = ["| evidence | n | F1 start | F1 with the gold paragraph | F1 final | gold − start [95%] | final − start "
           "[95%] | gold − final [95%] | headroom taken |", "|---|---|---|---|---|---|---|---|---|"]
    for h in rows:
        taken = "-" if h.taken != h.taken else f"{h.taken:.0%}"
        out.append(f"| {h.folder} | {h.n} | {h.gold_minus_start.start:.3f} | {h.gold_minus_start.final:.3f} | "
                   f"{h.final_minus_start.final:.3f} | {_ci(h.gold_minus_start)} | {_ci(h.final_minus_start)} | "
                   f"{_ci(h.gold_minus_final)} | {taken} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Command line: evidence folders; prints the markdown table (or ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="evidence folders (heldout_start/final.jsonl)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per folder instead")
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--ids", type=Path, default=None,
                    help="JSONL file whose rows' ids restrict every folder (e.g. data/hops/2wiki_hops_heldout.jsonl)")
    ap.add_argument("--by", default=None, metavar="FIELD",
                    help="split each folder's F1 change by this field of the --questions rows (e.g. metadata.relation)")
    ap.add_argument("--questions", type=Path, default=None,
                    help="JSONL held-out questions holding the --by field (e.g. data/hops/2wiki_hops_heldout600.jsonl)")
    ap.add_argument("--min-group", type=int, default=10, help="--by groups with fewer rows are pooled as (other)")
    ap.add_argument("--groups", default=None,
                    help="comma-separated --by groups to show; the rest are pooled as (other) (e.g. 'date of death,"
                         "date of birth')")
    ap.add_argument("--pool", action="store_true",
                    help="pool each recipe folder with its <recipe>__seed<N> replicates among the folders given: the "
                         "change averaged over seeds, intervals over questions and over seeds x questions")
    ap.add_argument("--answers", action="store_true",
                    help="what the answers are, start -> final: exact, partial, copied from the question, another "
                         "wrong answer, none; the largest moves; misses whose searches found the answer")
    ap.add_argument("--searched", action="store_true",
                    help="whether the agent searched, start -> final: searches per question with its interval, and "
                         "the questions split by whether the start and the final policy searched, with their F1")
    ap.add_argument("--gold", type=Path, action="append", default=None, metavar="GOLD_JSONL",
                    help="search-value gold rows of each folder's start policy, once per folder in the folders' "
                         "order: prints the headroom table (gold - start, final - start, gold - final)")
    args = ap.parse_args(argv)
    if args.gold is not None:
        if args.pool or args.by is not None or args.ids is not None:
            ap.error("--gold is a report of its own (every question the folder and its gold rows share); run it "
                     "without --pool, --by and --ids")
        return _print_headroom(ap, args)
    if sum((args.pool, args.by is not None, args.answers, args.searched)) > 1:
        ap.error("--pool, --by, --answers and --searched are separate reports; run them one at a time")
    if (args.by is None) != (args.questions is None):
        ap.error("--by and --questions go together: --by metadata.relation --questions <held-out JSONL file>")
    ids = None
    if args.ids is not None:
        if not args.ids.is_file():
            ap.error(f"--ids {args.ids} does not exist; pass a JSONL file of questions with an 'id' field")
        try:
            ids = read_ids(args.ids)
        except ValueError as exc:
            ap.error(str(exc))
    not_dirs = [str(p) for p in args.folders if not p.is_dir()]
    if not_dirs:
        ap.error(f"not a folder: {', '.join(not_dirs)}; pass evidence folders, e.g. docs/results/learning/*/")
    results, missing, outside = [], [], []
    paths: dict[str, Path] = {}
    for f in sorted(args.folders):
        r = evaluate_folder(f, n_resamples=args.resamples, ids=ids)
        if r is None:
            if (f / "heldout_start.jsonl").is_file() and (f / "heldout_final.jsonl").is_file():
                outside.append(f.name)  # none of --ids' questions
                continue
            if (f / "heldout_start.jsonl").is_file():
                missing.append(f.name)
            continue
        results.append(r)
        paths[r.folder] = f
    if not results and outside:
        ap.error(f"no folder holds any question of --ids {args.ids} ({', '.join(outside)}); pass the held-out file "
                 "those folders were evaluated on, or a part of it")
    if not results and not missing:
        ap.error("no folder holds heldout_start.jsonl; pass evidence folders, e.g. docs/results/learning/*/")
    if args.by is not None:
        return _print_groups(ap, args, [paths[r.folder] for r in results])
    if args.pool:
        return _print_pools(ap, args, paths, ids)
    if args.answers:
        kinds = [k for k in (answer_kinds(paths[r.folder], ids) for r in results) if k is not None]
        print("\n".join(json.dumps(k.model_dump()) for k in kinds) if args.json else answer_kinds_table(kinds))
        return 0
    if args.searched:
        splits = [x for x in (searched_split(paths[r.folder], ids, args.resamples) for r in results) if x is not None]
        print("\n".join(json.dumps(x.model_dump()) for x in splits) if args.json else searched_table(splits))
        return 0
    if args.json:
        for r in results:
            print(json.dumps({**r.model_dump(), "meets_1_to_4": r.meets_1_to_4}))
    else:
        print(table(results, missing))
    return 0


def _print_headroom(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if len(args.gold) != len(args.folders):
        ap.error(f"{len(args.gold)} --gold files for {len(args.folders)} folders; pass one --gold per folder, in the "
                 "same order")
    out = []
    for folder, gold in zip(args.folders, args.gold, strict=True):
        if not gold.is_file():
            ap.error(f"--gold {gold} does not exist; pass the gold.jsonl that `searchloop run search-value "
                     "--conditions gold` wrote for that folder's start policy")
        try:
            out.append(headroom(folder, _rows(gold), args.resamples))
        except (ValueError, KeyError, json.JSONDecodeError) as exc:
            ap.error(f"--gold {gold} with {folder}: {exc}")
    if args.json:
        for h in out:
            print(json.dumps({**h.model_dump(), "taken": h.taken}))
    else:
        print(headroom_table(out))
    return 0


def _print_pools(ap: argparse.ArgumentParser, args: argparse.Namespace, paths: Mapping[str, Path],
                 ids: set[str] | None) -> int:
    recipes = {name: [paths[name], *[paths[r] for r in sorted(paths) if replicate_of(r) == name]]
               for name in paths if not replicate_of(name)}
    recipes = {k: v for k, v in recipes.items() if len(v) > 1}
    if not recipes:
        ap.error("--pool found no folder given together with a replicate <folder>__seed<N>; pass a recipe's folder "
                 "and its replicates, e.g. docs/results/learning/research_hops_try6*/")
    pools = [pooled_seeds(v, field, args.resamples, ids=ids) for v in recipes.values() for field in ("reward", "f1")]
    if args.json:
        for p in pools:
            print(json.dumps(p.model_dump()))
    else:
        print(pooled_table(pools))
    return 0


def _print_groups(ap: argparse.ArgumentParser, args: argparse.Namespace, folders: Sequence[Path]) -> int:
    if not args.questions.is_file():
        ap.error(f"--questions {args.questions} does not exist; pass the held-out JSONL file the folders were "
                 "evaluated on")
    try:
        rows = _rows(args.questions)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        ap.error(f"--questions {args.questions} is not a JSONL file ({exc})")
    groups = question_groups(rows, args.by)
    if not groups:
        ap.error(f"no row of {args.questions} has the field {args.by!r}; pass a dotted path such as "
                 "metadata.relation")
    keep = [g.strip() for g in args.groups.split(",") if g.strip()] if args.groups else None
    unknown = sorted(set(keep or ()) - set(groups.values()))
    if unknown:
        ap.error(f"--groups {', '.join(unknown)}: no question of {args.questions} has that {args.by}; choose from "
                 f"{', '.join(sorted(set(groups.values())))}")
    for folder in folders:
        changes = group_changes(folder, groups, args.min_group, args.resamples, keep=keep)
        if args.json:
            for c in changes:
                print(json.dumps({"folder": folder.name, **c.model_dump()}))
        else:
            print(group_table(folder.name, changes) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
