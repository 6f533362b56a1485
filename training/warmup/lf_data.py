"""LLaMA-Factory datasets: write alpaca / sharegpt files with their ``dataset_info.json``, and read a user's own.

LLaMA-Factory finds a dataset through an entry of ``dataset_info.json``: ``file_name`` (relative to that file's
folder), ``formatting`` (``alpaca``, the default, or ``sharegpt``), ``columns`` and, for sharegpt, ``tags``.
:func:`read_lf_dataset` follows the same entry (with LLaMA-Factory's defaults for missing columns and tags) and
returns searchloop chat rows ``{"messages": [{role, content}], "question_id", "source"}`` — the rows warm-up SFT
trains on — so a user's own warm-up data goes in through ``warmup.lf_datasets``. Roles become ``system``,
``user`` and ``assistant`` (observations, i.e. tool results such as documents, are user turns, as in our own
warm-up chats; function calls are assistant turns).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import orjson

from infra import artifacts
from infra.errors import DataError

Formatting = Literal["alpaca", "sharegpt"]
ALPACA_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output", "system": "system",
                  "history": "history"}
SHAREGPT_DEFAULT_COLUMNS = {"messages": "conversations", "system": "system"}
SHAREGPT_DEFAULT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                         "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}
OUR_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
            "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}


def dataset_info_entry(file_name: str, formatting: Formatting,
                       rows: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The ``dataset_info.json`` entry for a file written by :func:`write_lf_dataset`. An alpaca entry maps only the
    columns the rows have (LLaMA-Factory's converter reads every mapped column: a ``system`` column no row has is
    a ``KeyError`` there)."""
    if formatting == "alpaca":
        present = set().union(*(r.keys() for r in rows)) if rows else set(ALPACA_COLUMNS.values())
        return {"file_name": file_name, "columns": {k: v for k, v in ALPACA_COLUMNS.items() if v in present}}
    return {"file_name": file_name, "formatting": "sharegpt", "columns": {"messages": "messages"},
            "tags": dict(OUR_TAGS)}


def alpaca_row(messages: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """A chat as one alpaca row: last user turn -> instruction, last assistant -> output, earlier pairs -> history.

    Raises:
        DataError: when the chat does not end on an assistant turn after a user turn.
    """
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    turns = [m for m in messages if m["role"] != "system"]
    if len(turns) < 2 or turns[-1]["role"] != "assistant" or turns[-2]["role"] == "assistant":
        raise DataError("an alpaca row needs a chat ending with a user turn then an assistant turn; "
                        f"got roles {[m['role'] for m in messages]}")
    history = [[turns[i]["content"], turns[i + 1]["content"]] for i in range(0, len(turns) - 2, 2)]
    row: dict[str, Any] = {"instruction": turns[-2]["content"], "input": "", "output": turns[-1]["content"],
                           "history": history}
    if system:
        row["system"] = system
    return row


def write_lf_dataset(chats: Iterable[Mapping[str, Any]], out_dir: str | Path, name: str,
                     formatting: Formatting) -> Path:
    """Write ``<name>.json`` (alpaca) or ``<name>.jsonl`` (sharegpt) and merge its entry into ``dataset_info.json``.

    Args:
        chats: rows with ``messages`` ([{role, content}], roles system/user/assistant/observation).
        out_dir: the LLaMA-Factory ``dataset_dir``.
        name: the dataset name to pass as ``dataset:`` in LLaMA-Factory's YAML.
        formatting: ``alpaca`` or ``sharegpt``.

    Returns:
        The ``dataset_info.json`` path.
    """
    out = Path(out_dir)
    if formatting == "alpaca":
        file_name = f"{name}.json"
        rows = [alpaca_row(c["messages"]) for c in chats]
        artifacts.write_bytes(out / file_name, orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    else:
        file_name = f"{name}.jsonl"
        rows = [{"messages": list(c["messages"])} for c in chats]
        artifacts.write_jsonl(out / file_name, rows)
    if not rows:
        raise DataError(f"nothing to export to {out / file_name}: the source has no rows")
    info_path = out / "dataset_info.json"
    info = orjson.loads(info_path.read_bytes()) if info_path.exists() else {}
    info[name] = dataset_info_entry(file_name, formatting, rows)
    artifacts.write_json(info_path, info)
    return info_path


def _entry(dataset_info: Path, name: str) -> dict[str, Any]:
    if not dataset_info.is_file():
        raise DataError(f"dataset_info {dataset_info} does not exist; pass the dataset_info.json of your "
                        "LLaMA-Factory dataset_dir")
    info = orjson.loads(dataset_info.read_bytes())
    if name not in info:
        raise DataError(f"{dataset_info} has no dataset {name!r}; it has {', '.join(sorted(info)) or 'none'}")
    entry = info[name]
    if "file_name" not in entry:
        raise DataError(f"{dataset_info}:{name}: only local files (file_name) are read, not hub or script "
                        "datasets; download it and point file_name at it")
    return entry


def _read_file(path: Path) -> list[dict[str, Any]]:
    from evaluation.benchmarks import read_rows

    if not path.exists():
        raise DataError(f"{path} (file_name of a dataset_info entry) does not exist")
    return [row for _, row in read_rows(path)]  # type: ignore[misc]


def _alpaca_messages(row: Mapping[str, Any], cols: Mapping[str, str]) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": row[cols["system"]]}] if row.get(cols.get("system", "")) else []
    for user, assistant in row.get(cols.get("history", ""), None) or []:
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    prompt = "\n".join(x for x in (row.get(cols["prompt"]), row.get(cols.get("query", ""))) if x)
    return [*msgs, {"role": "user", "content": prompt}, {"role": "assistant", "content": row[cols["response"]]}]


def _sharegpt_messages(row: Mapping[str, Any], cols: Mapping[str, str], tags: Mapping[str, str],
                       where: str) -> list[dict[str, str]]:
    roles = {tags["user_tag"]: "user", tags["observation_tag"]: "user", tags["assistant_tag"]: "assistant",
             tags["function_tag"]: "assistant", tags["system_tag"]: "system"}
    msgs = [{"role": "system", "content": row[cols["system"]]}] if row.get(cols.get("system", "")) else []
    for turn in row.get(cols["messages"]) or []:
        role = turn.get(tags["role_tag"])
        if role not in roles:
            raise DataError(f"{where}: role {role!r} is none of the dataset_info tags {sorted(roles)}")
        msgs.append({"role": roles[role], "content": str(turn.get(tags["content_tag"], ""))})
    return msgs


def read_lf_dataset(dataset_info: str | Path, name: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Chat rows of dataset ``name`` registered in a LLaMA-Factory ``dataset_info.json`` (see module docstring).

    Raises:
        DataError: for a missing entry or file, a non-local dataset, or roles the entry's tags do not name.
    """
    info = Path(dataset_info)
    entry = _entry(info, name)
    formatting = entry.get("formatting", "alpaca")
    if formatting not in ("alpaca", "sharegpt"):
        raise DataError(f"{info}:{name}: formatting {formatting!r} is neither alpaca nor sharegpt")
    rows = _read_file(info.parent / entry["file_name"])[:limit]
    out = []
    for i, row in enumerate(rows):
        where = f"{info.parent / entry['file_name']}:{i}"
        if formatting == "alpaca":
            cols = {**ALPACA_COLUMNS, **entry.get("columns", {})}
            messages = _alpaca_messages(row, cols)
        else:
            cols = {**SHAREGPT_DEFAULT_COLUMNS, **entry.get("columns", {})}
            messages = _sharegpt_messages(row, cols, {**SHAREGPT_DEFAULT_TAGS, **entry.get("tags", {})}, where)
        out.append({"messages": messages, "question_id": str(row.get("id", f"{name}_{i}")), "source": f"lf:{name}"})
    return out
