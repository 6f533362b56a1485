"""RL data preparation: verl's parquet schema from any question set, and R1-Searcher-style difficulty buckets.

verl reads one row per prompt with the columns ``data_source``, ``prompt`` (a chat message list), ``ability``,
``reward_model`` (``{"style": "rule", "ground_truth": ...}``) and ``extra_info`` (``index``, ``question``, plus
``tools_kwargs`` for its tool agent loop). The TRL engine reads the same rows (see ``trl_rows``), so both engines
train on one prepared directory. Files are written atomically and the directory ends with ``manifest.json``.

Difficulty follows R1-Searcher: sample rollouts per question, count how many it takes to get the first correct
one, bucket into easy / medium / difficult with configurable thresholds, then mix buckets by ratio.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from evaluation.benchmarks import Question
from infra import artifacts
from infra.config import StrictModel
from infra.errors import DataError
from training.rl.config import DifficultyConfig

Bucket = Literal["easy", "medium", "difficult"]
BUCKETS: tuple[Bucket, ...] = ("easy", "medium", "difficult")
MessagesFn = Callable[[Question], list[dict[str, str]]]


def default_messages(system_prompt: str | None = None) -> MessagesFn:
    """Return a messages builder: optional system prompt, then the question as the user turn."""

    def build(q: Question) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return [*msgs, {"role": "user", "content": q.question}]

    return build


def verl_row(q: Question, index: int, messages: list[dict[str, str]], split: str = "train",
             ability: str = "search_qa", tool_name: str | None = "search") -> dict[str, Any]:
    """One verl row. ``tool_name`` adds ``extra_info.tools_kwargs`` for verl's tool agent loop (None: no tools)."""
    extra: dict[str, Any] = {"index": index, "id": q.id, "question": q.question, "split": split,
                             "dataset": q.dataset}
    if tool_name:
        extra["need_tools_kwargs"] = True
        extra["tools_kwargs"] = {tool_name: {"create_kwargs": {"ground_truth": list(q.golden_answers),
                                                              "question": q.question}}}
    return {
        "data_source": q.dataset or "unknown",
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": list(q.golden_answers)},
        "extra_info": extra,
    }


def verl_rows(questions: Sequence[Question], messages_fn: MessagesFn, split: str = "train",
              tool_name: str | None = "search") -> list[dict[str, Any]]:
    """verl rows for a question set, indexed in order."""
    return [verl_row(q, i, messages_fn(q), split=split, tool_name=tool_name) for i, q in enumerate(questions)]


def trl_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """TRL dataset rows from verl rows: ``prompt`` (messages) plus the reward columns TRL passes to reward_funcs."""
    return [
        {"prompt": r["prompt"], "golden_answers": list(r["reward_model"]["ground_truth"]),
         "question": r["extra_info"]["question"], "question_id": r["extra_info"].get("id", str(i)),
         "data_source": r["data_source"]}
        for i, r in enumerate(rows)
    ]


def write_parquet(uri: str, rows: Sequence[Mapping[str, Any]]) -> int:
    """Atomically write rows as parquet (nested columns kept as structs/lists); returns the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise DataError(f"refusing to write an empty parquet file to {uri}; check the question source")
    table = pa.Table.from_pylist([dict(r) for r in rows])
    buf = io.BytesIO()
    pq.write_table(table, buf)
    artifacts.write_bytes(uri, buf.getvalue())
    return len(rows)


def read_parquet(uri: str) -> list[dict[str, Any]]:
    """Read a parquet file written by :func:`write_parquet` back into python rows."""
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(artifacts.read_bytes(uri))).to_pylist()


class RLDataRef(StrictModel):
    """A prepared RL data directory: ``<split>.parquet`` files plus ``manifest.json``."""

    uri: str = Field(description="Directory holding <split>.parquet and manifest.json.")
    splits: dict[str, int] = Field(description="Rows per split name.")

    def split_uri(self, split: str) -> str:
        """The parquet file of a split."""
        return artifacts.join(self.uri, f"{split}.parquet")


def prepare_rl_data(splits: Mapping[str, Sequence[Question]], out_uri: str, messages_fn: MessagesFn,
                    tool_name: str | None = "search", **manifest_fields: Any) -> RLDataRef:
    """Write one verl parquet per split into ``out_uri`` and finish with the manifest.

    Args:
        splits: split name (``train``, ``val``) to questions.
        out_uri: output directory (local path or ``s3://``).
        messages_fn: builds the chat prompt of a question (the protocol's system prompt + question).
        tool_name: verl tool name to attach ``tools_kwargs`` for; ``None`` for tag protocols without tools.
        **manifest_fields: extra provenance recorded in the manifest (sources, preset, config hash).
    """
    counts = {}
    for split, qs in splits.items():
        rows = verl_rows(qs, messages_fn, split=split, tool_name=tool_name)
        counts[split] = write_parquet(artifacts.join(out_uri, f"{split}.parquet"), rows)
    artifacts.write_manifest(out_uri, kind="rl_data", schema="verl", splits=counts, **manifest_fields)
    return RLDataRef(uri=str(out_uri), splits=counts)


# ---------------------------------------------------------------- difficulty buckets (R1-Searcher)


def first_correct(flags: Sequence[bool]) -> int | None:
    """1-based index of the first correct rollout, or None if none is correct."""
    return next((i + 1 for i, ok in enumerate(flags) if ok), None)


def bucket_of(first: int | None, cfg: DifficultyConfig) -> Bucket | None:
    """Bucket for a rollouts-to-first-correct count; None means the question is dropped."""
    if first is None:
        return "difficult" if cfg.unsolved == "difficult" else None
    if first < cfg.easy_below:
        return "easy"
    if first > cfg.difficult_above:
        return "difficult"
    return "medium"


def bucket_questions(questions: Sequence[Question], correct: Mapping[str, Sequence[bool]],
                     cfg: DifficultyConfig) -> dict[str, list[Question]]:
    """Split questions into buckets from per-question correctness flags (rollout order).

    Raises:
        DataError: if a question has no rollout results.
    """
    missing = [q.id for q in questions if q.id not in correct]
    if missing:
        raise DataError(f"no rollout results for {len(missing)} question(s), e.g. {missing[:3]}; run the "
                        "difficulty rollouts over the same question set")
    out: dict[str, list[Question]] = {b: [] for b in BUCKETS}
    for q in questions:
        b = bucket_of(first_correct(correct[q.id]), cfg)
        if b is not None:
            out[b].append(q)
    return out


def mix_buckets(buckets: Mapping[str, Sequence[Question]], cfg: DifficultyConfig) -> list[Question]:
    """Sample a mixed set by ``cfg.ratio`` (empty buckets drop out and the rest is renormalised); without
    ``total`` the largest set the ratio allows is taken."""
    weights = {b: w for b, w in cfg.ratio.items() if w > 0}
    unknown = set(weights) - set(BUCKETS)
    if unknown or not weights:
        raise DataError(f"difficulty ratio {cfg.ratio} must give positive weight to some of {BUCKETS}")
    weights = {b: w for b, w in weights.items() if buckets.get(b)}  # empty buckets drop out of the mix
    if not weights:
        return []
    norm = sum(weights.values())
    share = {b: w / norm for b, w in weights.items()}
    total = cfg.total
    if total is None:
        total = int(min(len(buckets.get(b, [])) / s for b, s in share.items()))
    rng = random.Random(cfg.seed)
    mixed: list[Question] = []
    for b, s in share.items():
        pool = list(buckets.get(b, []))
        want = min(len(pool), round(total * s))
        mixed.extend(rng.sample(pool, want))
    rng.shuffle(mixed)
    return mixed


def train_split(stage: Any, data: RLDataRef) -> str:
    """The split a stage (a ``training.rl.config.StageSpec``) trains on: ``train_<stage>`` when the stage picks its
    own questions, else ``train``."""
    name = f"train_{stage.name}"
    if stage.question_stage is not None and name not in data.splits:
        raise ValueError(f"stage {stage.name!r} trains on metadata.stage={stage.question_stage} questions but the "
                         f"prepared data at {data.uri} has no {name!r} split; re-run data preparation")
    return name if name in data.splits else "train"
