"""Refinement branches inside a GRPO group when every copy of a prompt runs as its own coroutine (verl's agent loop).

verl 0.9.1's ``AgentLoopWorker.generate_sequences`` starts one asyncio task per sample (the ``n`` copies of a prompt
are contiguous after ``repeat(interleave=True)`` and share the ``uid`` the trainer assigns per prompt) and
instantiates the agent loop anew for each, so copies can only meet through process-level state. This module is that
state, free of verl so it is testable in the main environment:

* :meth:`GroupCoordinator.join` (synchronous, called before the copy's first ``await``): copies get ranks 0, 1,
  2, ... in arrival order; even ranks are *leaders* (on-policy samples), rank ``2k + 1`` is the branch of leader
  ``2k``. This is the seed's group mix (``vLLMRolloutWithSearch.generate_sequences``: each round samples one
  on-policy trajectory and continues its FIRST kept refined prefix once, until n): a group of n = 8 holds 4
  on-policy samples and up to 4 branches, each from a different on-policy sample;
* a leader generates, judges and refines, then hands out its first kept refined prefix with
  :meth:`GroupCoordinator.publish` (an ``asyncio.Future`` per pair); it must publish even when it fails (an empty
  list), so its follower never waits forever;
* copy ``2k + 1`` awaits :meth:`GroupCoordinator.prefix_for`: leader ``2k``'s first kept prefix, or None (nothing
  kept: it samples on-policy, where the seed would start another round with a new on-policy sample);
* the group is dropped once every pair that joined is settled (no growth across training steps).

All tasks of a worker are created before any of them runs, so every copy has joined before a leader can finish
its trajectory: :meth:`GroupCoordinator.has_follower` tells a leader whether anyone will continue its prefix (a
leader without a follower, e.g. the last copy of an odd group, skips refinement). A copy that joins after the group
was dropped starts a new group as its leader (it samples on-policy).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Group:
    members: int = 0
    published: dict[int, list[Any]] = field(default_factory=dict)
    futures: dict[int, asyncio.Future] = field(default_factory=dict)
    taken: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Member:
    """One copy's place in its group: the group key and its arrival rank (even = leader, odd = its branch)."""

    key: Hashable
    rank: int

    @property
    def leader(self) -> bool:
        """True for an on-policy copy (even rank): it is judged and refined, its follower continues its prefix."""
        return self.rank % 2 == 0

    @property
    def pair(self) -> int:
        """The pair index ``rank // 2`` (leader ``2k`` and its branch ``2k + 1``)."""
        return self.rank // 2


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
        """Copies that have joined ``member``'s group so far."""
        group = self._groups.get(member.key)
        return group.members if group is not None else 1

    def has_follower(self, member: Member) -> bool:
        """True when a copy ranked ``member.rank + 1`` joined: someone will continue this leader's prefix."""
        return member.leader and self.size(member) > member.rank + 1

    def publish(self, member: Member, kept: Sequence[Any]) -> None:
        """A leader hands out its kept refined prefixes (the first one is used; empty: its follower samples
        on-policy); idempotent."""
        if not member.leader:
            raise ValueError("only a leader (an even rank, an on-policy copy) publishes prefixes")
        group = self._groups.get(member.key)
        if group is None or member.pair in group.published:
            return
        group.published[member.pair] = list(kept)[:1]
        future = group.futures.get(member.pair)
        if future is not None and not future.done():
            future.set_result(None)
        self._maybe_drop(member.key, group)

    async def prefix_for(self, member: Member) -> Any | None:
        """A follower's prefix: its leader's first kept prefix once published; None if it kept none."""
        if member.leader:
            raise ValueError("a leader samples on-policy; it has no prefix to wait for")
        group = self._groups.get(member.key)
        if group is None:
            return None
        if member.pair not in group.published:
            future = group.futures.get(member.pair)
            if future is None:
                future = group.futures[member.pair] = asyncio.get_running_loop().create_future()
            await future
        group.taken.add(member.pair)
        kept = group.published.get(member.pair) or []
        self._maybe_drop(member.key, group)
        return kept[0] if kept else None

    def _maybe_drop(self, key: Hashable, group: _Group) -> None:
        leaders = (group.members + 1) // 2
        followers = group.members // 2
        settled = len(group.published) >= leaders and len(group.taken) >= followers
        if settled and self._groups.get(key) is group:
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
