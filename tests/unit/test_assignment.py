"""Shard assignment: balanced, sticky, two-step moves."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.fleet._assignment import Assignment, Slot, balanced_targets, moved_count, rebalance


def _settle(a: Assignment, live: set[str], leader: int = 1) -> Assignment:
    """Run rebalance with every old owner confirming at once, until stable."""
    for _ in range(5):
        confirmed = {i: s.owner for i, s in enumerate(a.slots) if s.moving_to and s.owner}
        b = rebalance(a, live, confirmed, leader_epoch=leader)  # type: ignore[arg-type]
        if b is a:
            return a
        a = b
    return a


def test_first_assignment_is_balanced_and_direct() -> None:
    a = rebalance(Assignment.empty(64), {"w1", "w2", "w3"}, {}, leader_epoch=1)
    counts = sorted(len(v) for v in a.owners().values())
    assert counts == [21, 21, 22]
    assert all(s.moving_to is None for s in a.slots)
    assert a.epoch == 1


def test_unchanged_returns_same_object() -> None:
    a = rebalance(Assignment.empty(8), {"w1"}, {}, leader_epoch=1)
    assert rebalance(a, {"w1"}, {}, leader_epoch=1) is a


def test_adding_a_worker_moves_only_its_share_in_two_steps() -> None:
    a = rebalance(Assignment.empty(64), {"w1", "w2"}, {}, leader_epoch=1)
    b = rebalance(a, {"w1", "w2", "w3"}, {}, leader_epoch=1)
    moving = [i for i, s in enumerate(b.slots) if s.moving_to]
    assert len(moving) == 21  # exactly w3's quota, nothing else shuffles
    assert all(b.slots[i].moving_to == "w3" for i in moving)
    assert b.runnable("w3") == frozenset()  # not before the old owners confirm
    confirmed = {i: b.slots[i].owner for i in moving[:5]}
    c = rebalance(b, {"w1", "w2", "w3"}, confirmed, leader_epoch=1)  # type: ignore[arg-type]
    assert c.runnable("w3") == frozenset(moving[:5])
    assert moved_count(a, b) == 21


def test_dead_owner_shards_go_straight_to_survivors() -> None:
    a = rebalance(Assignment.empty(12), {"w1", "w2", "w3"}, {}, leader_epoch=1)
    lost = a.owners()["w2"]
    b = rebalance(a, {"w1", "w3"}, {}, leader_epoch=1)
    for i in lost:
        assert b.slots[i].owner in {"w1", "w3"} and b.slots[i].moving_to is None
    assert sorted(len(v) for v in b.owners().values()) == [6, 6]


def test_move_to_a_worker_that_dies_is_retargeted() -> None:
    b = Assignment(epoch=3, slots=(Slot(owner="w1", moving_to="w2"), Slot(owner="w1")))
    c = rebalance(b, {"w1"}, {}, leader_epoch=1)
    assert c.slots == (Slot(owner="w1"), Slot(owner="w1"))


def test_no_live_workers_leaves_shards_unowned() -> None:
    a = rebalance(Assignment.empty(4), {"w1"}, {}, leader_epoch=1)
    b = rebalance(a, set(), {}, leader_epoch=1)
    assert all(s.owner is None for s in b.slots)


@settings(max_examples=200, deadline=None)
@given(
    shards=st.integers(1, 80),
    before=st.sets(st.sampled_from([f"w{i}" for i in range(8)]), min_size=1),
    after=st.sets(st.sampled_from([f"w{i}" for i in range(8)]), min_size=1),
)
def test_settled_assignment_is_balanced_and_sticky(shards: int, before: set[str], after: set[str]) -> None:
    a = _settle(Assignment.empty(shards), before)
    b = _settle(a, after)
    counts = [len(b.owners().get(w, [])) for w in after]
    assert max(counts) - min(counts) <= 1
    assert sum(counts) == shards
    assert all(s.owner in after and s.moving_to is None for s in b.slots)
    # Sticky: only the shards of departed workers and the excess of overloaded
    # survivors change owner.
    changed = sum(1 for x, y in zip(a.slots, b.slots, strict=True) if x.owner != y.owner)
    held = a.owners()
    departed = sum(len(v) for w, v in held.items() if w not in after)
    floor_q, ceil_q = shards // len(after), -(-shards // len(after))
    least = departed + sum(max(0, len(held.get(w, [])) - ceil_q) for w in after)
    most = departed + sum(max(0, len(held.get(w, [])) - floor_q) for w in after)
    assert least <= changed <= most
    assert moved_count(a, b) <= shards


def test_balanced_targets_keeps_owners_within_quota() -> None:
    current = {0: "a", 1: "a", 2: "b", 3: "b"}
    assert balanced_targets(4, current, {"a", "b"}) == current
