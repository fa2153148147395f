"""Shard assignment: pure decisions, no I/O.

An :class:`Assignment` maps every shard to a slot: its active owner, and when
the shard is on its way to another worker, the target (``moving_to``). A shard
moves in two steps: first the coordinator marks it moving (the old owner stops
it and confirms, or its lease runs out), only then does the target become the
active owner. A worker runs a shard only when it is the owner and the shard is
not moving.

:func:`rebalance` is balanced (every live worker gets ``floor(N/W)`` or
``ceil(N/W)`` shards) and sticky (it moves as few shards as it can).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec


class Slot(msgspec.Struct, frozen=True, kw_only=True):
    """One shard's ownership: ``owner`` runs it unless ``moving_to`` is set."""

    owner: str | None = None
    moving_to: str | None = None


class Assignment(msgspec.Struct, frozen=True, kw_only=True):
    """The whole fleet's shard ownership at one ``epoch`` (goes up on every change).

    ``leader_epoch`` is the storage-lock epoch of the coordinator that wrote it.
    """

    v: int = 1
    epoch: int = 0
    leader_epoch: int = 0
    slots: tuple[Slot, ...] = ()

    @classmethod
    def empty(cls, shards: int) -> Assignment:
        """Return an assignment with no owners for ``shards`` shards."""
        return cls(slots=tuple(Slot() for _ in range(shards)))

    def runnable(self, worker: str) -> frozenset[int]:
        """Return the shards ``worker`` may run now (owner and not moving)."""
        return frozenset(i for i, s in enumerate(self.slots) if s.owner == worker and s.moving_to is None)

    def releasing(self, worker: str) -> frozenset[int]:
        """Return the shards ``worker`` must stop and confirm (owner, moving away)."""
        return frozenset(i for i, s in enumerate(self.slots) if s.owner == worker and s.moving_to is not None)

    def owners(self) -> dict[str, list[int]]:
        """Return worker -> sorted shards it owns (moving ones included)."""
        out: dict[str, list[int]] = {}
        for i, s in enumerate(self.slots):
            if s.owner is not None:
                out.setdefault(s.owner, []).append(i)
        return out


def balanced_targets(shards: int, current: Mapping[int, str | None], live: Iterable[str]) -> dict[int, str]:
    """Return the desired owner of every shard, balanced and sticky.

    ``current`` is each shard's present (or incoming) owner. Shards of workers
    that are not live are reassigned; a worker over its quota gives up its
    highest shards; workers under quota take the freed shards in order.
    Returns an empty dict when no worker is live.
    """
    workers = sorted(set(live))
    if not workers:
        return {}
    mine: dict[str, list[int]] = {w: [] for w in workers}
    pool: list[int] = []
    for shard in range(shards):
        owner = current.get(shard)
        if owner in mine:
            mine[owner].append(shard)
        else:
            pool.append(shard)
    base, extra = divmod(shards, len(workers))
    # The workers that already hold the most keep the larger quotas: fewer moves.
    by_load = sorted(workers, key=lambda w: (-len(mine[w]), w))
    quota = {w: base + (1 if i < extra else 0) for i, w in enumerate(by_load)}
    for w in workers:
        held = sorted(mine[w])
        if len(held) > quota[w]:
            keep, give = held[: quota[w]], held[quota[w] :]
            mine[w] = keep
            pool.extend(give)
    pool.sort()
    for w in workers:
        while len(mine[w]) < quota[w] and pool:
            mine[w].append(pool.pop(0))
    return {shard: w for w, held in mine.items() for shard in held}


def rebalance(
    current: Assignment,
    live: Iterable[str],
    confirmed: Mapping[int, str],
    *,
    leader_epoch: int,
) -> Assignment:
    """Return the next assignment (the same object when nothing changes).

    Args:
        current: the assignment in force.
        live: workers whose membership lease is alive.
        confirmed: shard -> worker that confirmed it stopped the shard.
        leader_epoch: the calling coordinator's lock epoch.

    Rules, per shard: a moving shard completes its move (target becomes owner)
    once the old owner confirmed or is no longer live; a shard whose owner is
    gone goes straight to its new owner (no one is left to confirm); a shard
    whose live owner should give it up is marked moving; a move whose target
    died is re-targeted.
    """
    live_set = set(live)
    shards = len(current.slots)
    incoming = {i: (s.moving_to if s.moving_to is not None else s.owner) for i, s in enumerate(current.slots)}
    target = balanced_targets(shards, incoming, live_set)
    slots: list[Slot] = []
    for i, slot in enumerate(current.slots):
        want = target.get(i)
        owner = slot.owner
        owner_alive = owner is not None and owner in live_set
        released = owner is not None and confirmed.get(i) == owner
        if want is None:
            new = Slot(owner=owner if owner_alive else None, moving_to=None)
        elif owner == want:
            new = Slot(owner=owner)
        elif not owner_alive or released:
            new = Slot(owner=want)
        else:
            new = Slot(owner=owner, moving_to=want)
        slots.append(new)
    new_slots = tuple(slots)
    if new_slots == current.slots and current.leader_epoch == leader_epoch:
        return current
    return Assignment(epoch=current.epoch + 1, leader_epoch=leader_epoch, slots=new_slots)


def moved_count(before: Assignment, after: Assignment) -> int:
    """Return how many shards changed owner or target between two assignments."""
    return sum(1 for a, b in zip(before.slots, after.slots, strict=True) if a != b)
