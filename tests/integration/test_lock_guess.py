"""Acquiring without reading first: a lock this process never saw is created at once, one it last
saw released is claimed on that version at once; a wrong guess costs one refused write and still
acquires correctly (or waits). Counted on a real local store."""

from __future__ import annotations

from pathlib import Path

from shared import OutcomeUnknown
from shared.locks import read_lock
from shared.locks._io import SEEN
from shared.storage._counting import CountingStore
from shared.storage._local import LocalStore
from tests._support.fault_store import Fault, FaultStore
from tests._support.locks import KEY, NAME, lock, stored


async def test_a_new_lock_is_taken_with_one_request_and_released_with_one(tmp_path: Path) -> None:
    counting = CountingStore(LocalStore(tmp_path / "s", durable=False))
    async with lock(counting, "a").hold() as lease:
        assert dict(counting.requests) == {"write_if_absent": 1}
        assert lease.epoch == 1
    assert dict(counting.requests) == {"write_if_absent": 1, "write_if_match": 1}
    assert (await stored(counting)).released


async def test_a_lock_released_by_this_process_is_retaken_with_one_request(tmp_path: Path) -> None:
    counting = CountingStore(LocalStore(tmp_path / "s", durable=False))
    async with lock(counting, "a").hold():
        pass
    counting.reset()
    async with lock(counting, "b").hold() as lease:  # another contender, same process
        assert dict(counting.requests) == {"write_if_match": 1}
        assert lease.epoch == 2
    assert (await stored(counting)).epoch == 2


async def test_a_stale_guess_costs_one_refused_write_then_reads(tmp_path: Path) -> None:
    counting = CountingStore(LocalStore(tmp_path / "s", durable=False))
    async with lock(counting, "a").hold():
        pass
    seen = SEEN.get(counting, KEY)  # epoch 1, released
    # Another process takes it and lets go (this process's sight of it stays at epoch 1).
    async with lock(counting, "other").hold():
        pass
    assert seen is not None
    SEEN.put(counting, KEY, seen)
    counting.reset()
    async with lock(counting, "b").hold() as lease:
        assert lease.epoch == 3
    # The refused guess, the claim after the read, the release.
    assert dict(counting.requests) == {"write_if_match": 3, "read": 1}


async def test_a_stale_guess_never_takes_a_held_lock(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s", durable=False)
    async with lock(store, "a").hold():
        pass
    seen = SEEN.get(store, KEY)
    held = await lock(store, "a").try_acquire()
    assert held is not None and seen is not None
    SEEN.put(store, KEY, seen)  # this process believes it released
    assert await lock(store, "b").try_acquire() is None
    assert (await stored(store)).owner == "a"
    await held.release()


async def test_a_guessed_claim_that_landed_but_reported_failure_is_ours(tmp_path: Path) -> None:
    faulty = FaultStore(LocalStore(tmp_path / "s", durable=False))
    faulty.faults.append(Fault("write_if_absent", OutcomeUnknown, after=True))
    lease = await lock(faulty, "a").acquire()
    assert lease.epoch == 1 and (await stored(faulty)).owner == "a"
    await lease.release()
    assert (rec := await read_lock(faulty, NAME)) is not None and rec.released
