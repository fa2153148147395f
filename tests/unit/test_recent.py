"""shared._recent.Recent: the bounded memory behind the lock and watermarks guesses."""

from __future__ import annotations

import pytest

from shared._recent import Recent


def test_keeps_at_most_limit_and_forgets_the_least_recently_put() -> None:
    r: Recent[int] = Recent(3)
    for i in range(3):
        r.put("u", f"k{i}", i)
    r.put("u", "k0", 10)  # put again: now the most recent
    r.put("u", "k3", 3)
    assert len(r) == 3
    assert r.get("u", "k1") is None  # the oldest went first
    assert [r.get("u", k) for k in ("k0", "k2", "k3")] == [10, 2, 3]


def test_forget_and_unknown_keys() -> None:
    r: Recent[str] = Recent(2)
    r.put("u", "a", "x")
    r.forget("u", "a")
    r.forget("u", "a")  # twice: nothing to forget
    r.forget("other", "a")
    assert r.get("u", "a") is None and len(r) == 0
    r.put("u", "b", "y")
    r.put("u", "c", "z")
    assert len(r) == 2  # forgetting gave its room back


def test_bound_holds_across_stores() -> None:
    r: Recent[int] = Recent(4)
    for i in range(10):
        r.put(f"u{i % 3}", f"k{i}", i)
    assert len(r) == 4
    kept = [i for i in range(10) if r.get(f"u{i % 3}", f"k{i}") is not None]
    assert len(kept) == 4 and 9 in kept  # the latest is always kept
    assert r.get("u0", "k9") == 9


def test_same_key_in_two_stores_is_two_entries() -> None:
    r: Recent[int] = Recent(4)
    r.put("u1", "k", 1)
    r.put("u2", "k", 2)
    assert (r.get("u1", "k"), r.get("u2", "k"), len(r)) == (1, 2, 2)


def test_a_stored_none_is_counted_like_any_value() -> None:
    r: Recent[int | None] = Recent(2)
    r.put("u", "a", None)
    r.put("u", "a", None)
    r.put("u", "b", 1)
    assert len(r) == 2
    r.forget("u", "a")
    assert len(r) == 1


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Recent(0)


def test_caches_built_on_it_stay_compact() -> None:
    """The lock and watermarks guesses keep one owner name and one watermark name, not one per entry."""
    import time

    import msgspec

    from shared.commit._watermarks import _SeenDocs
    from shared.locks._io import SeenLocks
    from shared.locks._state import LockRecord, Observed

    class Store:
        url = "file:///store"

    locks = SeenLocks(limit=8)
    raw = msgspec.json.encode(
        LockRecord(owner="worker-a", epoch=1, acquired_at=time.time(), expires_at=time.time(), nonce="n")
    )
    for i in range(8):
        rec = msgspec.json.decode(raw, type=LockRecord)  # a fresh owner string each time, as read
        locks.put(Store(), f"k{i}", Observed(record=rec, version=str(i)))  # type: ignore[arg-type]
    owners = {id(o.record.owner) for i in range(8) if (o := locks.get(Store(), f"k{i}")) is not None}  # type: ignore[arg-type]
    assert len(owners) == 1

    docs = _SeenDocs(limit=8)
    docs.put("u", "w", ({"job-1": 3}, {}, "v1"))
    got = docs.get("u", "w")
    assert got == ({"job-1": 3}, {}, "v1")
    assert got is not None
    got[0]["job-1"] = 99  # the caller's copy: the memory is not changed through it
    got[1]["app"] = None  # type: ignore[assignment]
    assert docs.get("u", "w") == ({"job-1": 3}, {}, "v1")
