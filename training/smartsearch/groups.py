"""Refinement branches inside a GRPO group when every copy of a prompt runs as its own coroutine (verl's agent loop).

verl 0.9.1's ``AgentLoopWorker.generate_sequences`` starts one asyncio task per sample (the ``n`` copies of a prompt
are contiguous after ``repeat(interleave=True)`` and share the ``uid`` the trainer assigns per prompt) and
instantiates the agent loop anew for each, so copies can only meet through process-level state. This module is that
state, free of verl so it is testable in the main environment:

* :meth:`GroupCoordinator.join` (synchronous, called before the copy's first ``await``): the first copy of a group
  key is the *leader* (rank 0, samples on-policy), later copies get ranks 1, 2, ...;
* the leader generates, judges and refines, then hands out the kept refined prefixes with
  :meth:`GroupCoordinator.publish` (an ``asyncio.Future`` per group); it must publish even when it fails (an empty
  list), so nobody waits forever;
* copy ``j >= 1`` awaits :meth:`GroupCoordinator.prefix_for`: kept prefix ``(j - 1) mod len(kept)``, or None (no
  kept prefix: sample on-policy);
* the group is dropped once every member that joined has taken its share (no growth across training steps).

All tasks of a worker are created before any of them runs, so every copy has joined before the leader can finish
its trajectory: :meth:`GroupCoordinator.size` is the group size the leader sees (it skips refinement in a group of
one). A copy that joins after the group was dropped starts a new group as its leader (it samples on-policy).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Group:
    members: int = 0
    taken: int = 0
    published: asyncio.Future | None = None
    kept: list[Any] = field(default_factory=list)
    done: bool = False


@dataclass(frozen=True)
class Member:
    """One copy's place in its group: the group key and its arrival rank (0 = leader)."""

    key: Hashable
    rank: int

    @property
    def leader(self) -> bool:
        """True for the first copy of the group (the on-policy sample that is judged and refined)."""
        return self.rank == 0


class GroupCoordinator:
    """Leader election and prefix hand-out for the copies of a prompt inside one event loop (see module docstring)."""

    def __init__(self) -> None:
        self._groups: dict[Hashable, _Group] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def join(self, key: Hashable) -> Member:
        """Register a copy of group ``key``; synchronous, so arrival order is task start order."""
        group = self._groups.setdefault(key, _Group())
        member = Member(key, group.members)
        group.members += 1
        return member

    def size(self, member: Member) -> int:
        """Copies that have joined ``member``'s group so far (the leader's view of the group size)."""
        group = self._groups.get(member.key)
        return group.members if group is not None else 1

    def publish(self, member: Member, kept: Sequence[Any]) -> None:
        """The leader hands out its kept refined prefixes (empty: followers sample on-policy); idempotent."""
        if not member.leader:
            raise ValueError("only the group's leader (rank 0) publishes prefixes")
        group = self._groups.get(member.key)
        if group is None or group.done:
            return
        group.kept, group.done = list(kept), True
        if group.published is not None and not group.published.done():
            group.published.set_result(None)
        self._maybe_drop(member.key, group)

    async def prefix_for(self, member: Member) -> Any | None:
        """A follower's prefix: kept ``(rank - 1) mod len(kept)`` once the leader published; None if none kept."""
        if member.leader:
            raise ValueError("the leader samples on-policy; it has no prefix to wait for")
        group = self._groups.get(member.key)
        if group is None:
            return None
        if not group.done:
            if group.published is None:
                group.published = asyncio.get_running_loop().create_future()
            await group.published
        group.taken += 1
        prefix = group.kept[(member.rank - 1) % len(group.kept)] if group.kept else None
        self._maybe_drop(member.key, group)
        return prefix

    def _maybe_drop(self, key: Hashable, group: _Group) -> None:
        if group.done and group.taken >= group.members - 1 and self._groups.get(key) is group:
            del self._groups[key]


def group_key(kwargs: dict[str, Any]) -> tuple[str, str]:
    """The group of a verl sample: ``uid`` (one per prompt per step, set by verl's trainer for training and
    validation batches) or, without it, ``extra_info``'s ``index`` and ``id`` (the same prompt twice in a batch
    then forms one larger group)."""
    uid = kwargs.get("uid")
    if uid is not None and str(uid):
        return ("uid", str(uid))
    info = kwargs.get("extra_info") or {}
    return ("index", f"{info.get('index', kwargs.get('index', ''))}\x00{info.get('id', '')}")
