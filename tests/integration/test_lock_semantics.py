"""The storage lock against real stores (local files, and S3 / GCS / Azure emulators via ``any_store``).

Faults are injected by :class:`~tests._support.fault_store.FaultStore`, a wrapper that forwards every
call to the real store and, on the calls a test picks, raises an error before or after the real call
(a write that took effect but answers 412 is the "ghost lock" of RFC-91's review), or never answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared import (
    BadInput,
    ConfigError,
    Fenced,
    LockLost,
    LockTimeout,
    OutcomeUnknown,
    PreconditionFailed,
    Throttled,
    TransientError,
)
from shared.locks import HeldLease, Lease, LockRecord, StorageLock, read_lock
from shared.locks._state import encode_record
from shared.settings import LockSettings
from shared.storage import ObjectStore
from shared.storage._local import LocalStore
from tests._support.fault_store import Fault, FaultStore
from tests._support.locks import FAST, KEY, NAME, is_release, is_renewal, lock, stored
from tests._support.wait import wait_for


@pytest.fixture
async def tmp_store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    """A local-files store (for the tests whose faults need no emulator to be meaningful)."""
    async with LocalStore(tmp_path / "store") as store:
        yield store


async def write_foreign(store: ObjectStore, *, owner: str, epoch: int, expires_in: float) -> LockRecord:
    """Overwrite the lock object unconditionally, as another holder would after a takeover."""
    now = time.time()
    rec = LockRecord(owner=owner, epoch=epoch, acquired_at=now, expires_at=now + expires_in, nonce="f00d")
    await store.write(KEY, encode_record(rec))
    return rec


# -- acquire, release, epochs ----------------------------------------------------------------------------


async def test_acquire_release_reacquire_raises_epoch_by_one(any_store: ObjectStore) -> None:
    a, b = lock(any_store, "a"), lock(any_store, "b")
    assert await read_lock(any_store, NAME) is None
    epochs = []
    for contender in (a, b, a, a, b):
        async with contender.hold() as lease:
            assert isinstance(lease, Lease)
            lease.check()
            held = await stored(any_store)
            assert (held.owner, held.epoch, held.released) == (contender.owner, lease.epoch, False)
            assert lease.took_over_from is None
            epochs.append(lease.epoch)
        after = await stored(any_store)
        assert after.released and after.epoch == lease.epoch
        with pytest.raises(LockLost):
            lease.check()
    assert epochs == [1, 2, 3, 4, 5]


async def test_held_lock_blocks_others_and_released_lock_is_taken_at_once(any_store: ObjectStore) -> None:
    a, b = lock(any_store, "a"), lock(any_store, "b")
    lease = await a.acquire()
    assert await b.try_acquire() is None
    started = time.monotonic()
    with pytest.raises(LockTimeout, match="held by a"):
        await b.acquire(timeout=0.3)
    assert time.monotonic() - started >= 0.3
    await a.release()
    assert lease.released
    # Released, not expired: taken without waiting for expires_at.
    got = await b.try_acquire()
    assert got is not None and got.epoch == 2 and got.took_over_from is None
    await got.release()


async def test_contender_is_not_reentrant(any_store: ObjectStore) -> None:
    a = lock(any_store, "a")
    async with a.hold():
        with pytest.raises(RuntimeError):
            await a.acquire()
    async with a.hold() as again:
        assert again.epoch == 2


async def test_expired_lock_is_taken_over_only_after_expiry_plus_drift(
    any_store: ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    dead = await write_foreign(any_store, owner="dead-holder", epoch=7, expires_in=0.5)
    b = lock(any_store, "b")
    with caplog.at_level(logging.WARNING, logger="shared.locks"):
        async with b.hold(timeout=5) as lease:
            taken_at = time.time()
            assert taken_at > dead.expires_at + FAST.max_drift
            assert lease.epoch == 8
            assert lease.took_over_from == "dead-holder"
            assert (await stored(any_store)).owner == "b"
    assert any("taken over from dead-holder" in r.getMessage() for r in caplog.records)


async def test_renewal_keeps_the_lock_past_its_validity(any_store: ObjectStore) -> None:
    a, b = lock(any_store, "a"), lock(any_store, "b")
    async with a.hold() as lease:
        first = await stored(any_store)
        end = time.monotonic() + 3 * FAST.validity
        while time.monotonic() < end:
            lease.check()
            assert await b.try_acquire() is None
            await asyncio.sleep(0.1)
        now = await stored(any_store)
        assert now.epoch == first.epoch and now.owner == "a"
        assert now.expires_at > first.expires_at + FAST.validity  # renewed more than once
        assert lease.deadline > time.monotonic()


# -- losing the lock -------------------------------------------------------------------------------------


async def test_refused_renewal_cancels_the_body_with_fenced(any_store: ObjectStore) -> None:
    a = lock(any_store, "a")
    body_cancelled = asyncio.Event()
    taken = asyncio.Event()

    async def body(lease: HeldLease) -> None:
        try:
            taken.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            body_cancelled.set()
            raise

    async def holder() -> None:
        async with a.hold() as lease:
            await body(lease)

    task = asyncio.create_task(holder())
    await asyncio.wait_for(taken.wait(), 10)
    lease = a.lease
    assert lease is not None
    usurper = await write_foreign(any_store, owner="usurper", epoch=lease.epoch + 1, expires_in=30)
    lost_at = time.monotonic()
    with pytest.raises(Fenced, match="usurper"):
        await asyncio.wait_for(task, FAST.renew_interval + 5)
    assert time.monotonic() - lost_at < FAST.validity
    assert body_cancelled.is_set()
    assert lease.lost.is_set()
    # The stale holder's release did not touch the new holder's lock.
    assert await stored(any_store) == usurper


async def test_lease_running_out_locally_cancels_the_body(tmp_store: ObjectStore) -> None:
    faulty = FaultStore(tmp_store)
    # Renewals are sent but never answered: the local deadline must stop the work.
    faulty.faults.append(Fault("write_if_match", None, hang=True, times=100, when=is_renewal))
    a = lock(faulty, "a")
    started = time.monotonic()
    with pytest.raises(LockLost, match="ran out locally") as info:
        async with a.hold() as lease:
            await asyncio.Event().wait()
    elapsed = time.monotonic() - started
    assert not isinstance(info.value, Fenced)
    assert FAST.validity - FAST.max_drift - 0.05 <= elapsed < FAST.validity + 2
    with pytest.raises(LockLost):
        lease.check()
    # Nothing landed, so the release (not a renewal) still went through on the known version.
    assert (await stored(tmp_store)).released


async def test_check_fails_once_the_local_deadline_passes_without_renewal(tmp_store: ObjectStore) -> None:
    faulty = FaultStore(tmp_store)
    faulty.faults.append(Fault("write_if_match", None, hang=True, times=100, when=is_renewal))
    lease = await lock(faulty, "a").acquire()
    lease.check()
    await asyncio.wait_for(lease.lost.wait(), FAST.validity + 2)
    assert time.monotonic() >= lease.deadline
    with pytest.raises(LockLost):
        lease.check()
    await lease.release()


async def test_body_that_swallows_the_cancellation_still_ends_with_lock_lost(any_store: ObjectStore) -> None:
    a = lock(any_store, "a")
    swallowed = False

    async def badly_behaved() -> None:
        nonlocal swallowed
        async with a.hold() as lease:
            await write_foreign(any_store, owner="usurper", epoch=lease.epoch + 1, expires_in=30)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                swallowed = True

    with pytest.raises(Fenced):
        await badly_behaved()
    assert swallowed
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_explicit_lease_sets_lost_event(any_store: ObjectStore) -> None:
    leader = lock(any_store, "leader")
    lease = await leader.acquire()
    assert not lease.lost.is_set()
    await write_foreign(any_store, owner="other", epoch=lease.epoch + 5, expires_in=30)
    await asyncio.wait_for(lease.lost.wait(), FAST.validity + 2)
    assert isinstance(lease.lost_error, Fenced)
    with pytest.raises(Fenced):
        lease.check()
    await leader.release()
    assert leader.lease is None
    assert (await stored(any_store)).owner == "other"


# -- cancellation from outside ---------------------------------------------------------------------------


async def test_outside_cancellation_propagates_and_releases(any_store: ObjectStore) -> None:
    a = lock(any_store, "a")
    held = asyncio.Event()

    async def holder() -> None:
        async with a.hold():
            held.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(holder())
    await asyncio.wait_for(held.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert (await stored(any_store)).released


async def test_outside_timeout_is_a_timeout_not_lock_lost(any_store: ObjectStore) -> None:
    a = lock(any_store, "a")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5), a.hold():
            await asyncio.Event().wait()
    assert (await stored(any_store)).released
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_cancelled_acquire_does_not_leave_its_claim_behind(tmp_store: ObjectStore) -> None:
    faulty = FaultStore(tmp_store)
    # The create lands but its answer never comes back; then the acquirer is cancelled.
    faulty.faults.append(Fault("write_if_absent", None, after=True, hang=True))
    a = lock(faulty, "a")
    task = asyncio.create_task(a.acquire())
    await wait_for(lambda: read_lock(tmp_store, NAME), timeout=10, what="the claim to land")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    rec = await stored(tmp_store)
    assert rec.owner == "a" and rec.released
    assert await lock(tmp_store, "b").try_acquire() is not None


# -- ambiguous answers: ghost locks, throttled release ----------------------------------------------------


@pytest.mark.parametrize("error", [PreconditionFailed, OutcomeUnknown, TransientError])
async def test_claim_that_landed_but_reported_failure_is_ours(
    any_store: ObjectStore, error: type[Exception]
) -> None:
    faulty = FaultStore(any_store)
    faulty.faults.append(Fault("write_if_absent", error, after=True))
    a = lock(faulty, "a")
    async with a.hold(timeout=5) as lease:
        assert lease.epoch == 1
        rec = await stored(any_store)
        assert (rec.owner, rec.nonce) == ("a", lease.record.nonce)
    assert faulty.faults[0].hits == 1
    assert (await stored(any_store)).released


async def test_takeover_that_landed_but_reported_failure_is_ours(any_store: ObjectStore) -> None:
    async with lock(any_store, "a").hold():
        pass
    faulty = FaultStore(any_store)
    faulty.faults.append(Fault("write_if_match", PreconditionFailed, after=True, when=is_renewal))
    b = lock(faulty, "b")
    lease = await b.try_acquire()
    assert lease is not None and lease.epoch == 2
    assert faulty.faults[0].hits == 1
    await lease.release()
    rec = await stored(any_store)
    assert rec.released and rec.epoch == 2 and rec.owner == "b"


async def test_failed_claim_that_did_not_land_is_not_ours(any_store: ObjectStore) -> None:
    faulty = FaultStore(any_store)
    faulty.faults.append(Fault("write_if_absent", PreconditionFailed))
    assert await lock(faulty, "a").try_acquire() is None
    assert await read_lock(any_store, NAME) is None


@pytest.mark.parametrize("error", [PreconditionFailed, OutcomeUnknown, Throttled])
async def test_renewal_that_landed_but_reported_failure_keeps_the_lease(
    any_store: ObjectStore, error: type[Exception]
) -> None:
    faulty = FaultStore(any_store)
    faulty.faults.append(Fault("write_if_match", error, after=True, times=2, when=is_renewal))
    a = lock(faulty, "a")
    async with a.hold() as lease:
        await wait_for(
            lambda: asyncio.sleep(0, faulty.faults[0].hits == 2), timeout=10, what="two ghost renewals"
        )
        end = time.monotonic() + FAST.validity
        while time.monotonic() < end:
            lease.check()
            await asyncio.sleep(0.05)

        async def in_step() -> bool:
            # A renewal may be in flight at any moment; between two, the lease knows what is stored.
            rec = await stored(any_store)
            return (rec.owner, rec.epoch, rec.nonce) == ("a", lease.epoch, lease.record.nonce)

        await wait_for(in_step, timeout=10, what="the lease to match the stored record")
    assert (await stored(any_store)).released


@pytest.mark.parametrize("after", [False, True], ids=["refused", "landed"])
async def test_release_is_retried_on_throttling(any_store: ObjectStore, after: bool) -> None:
    faulty = FaultStore(any_store)
    faulty.faults.append(Fault("write_if_match", Throttled, after=after, times=2, when=is_release))
    a = lock(faulty, "a")
    async with a.hold():
        pass
    assert faulty.faults[0].hits == 2
    rec = await stored(any_store)
    assert rec.released and rec.owner == "a"
    # No dangling lock until expiry: the next contender gets it at once.
    nxt = await lock(any_store, "b").try_acquire()
    assert nxt is not None
    await nxt.release()


async def test_release_that_keeps_failing_is_reported_and_the_lock_expires(tmp_store: ObjectStore) -> None:
    faulty = FaultStore(tmp_store)
    faulty.faults.append(Fault("write_if_match", Throttled, times=1000, when=is_release))
    lease = await lock(faulty, "a").acquire()
    with pytest.raises(Throttled):
        await lease.release()
    rec = await stored(tmp_store)
    assert not rec.released
    got = await lock(tmp_store, "b").acquire(timeout=5)
    assert got.took_over_from == "a"
    await got.release()


# -- several contenders in one process -------------------------------------------------------------------


async def test_contenders_in_one_process_never_overlap(any_store: ObjectStore) -> None:
    inside: list[str] = []
    holds: list[tuple[int, str]] = []
    settings = LockSettings(
        validity=3.0, renew_interval=1.0, max_drift=0.1, acquire_timeout=60, poll_min=0.005, poll_max=0.05
    )

    async def contender(i: int) -> None:
        me = StorageLock(any_store, NAME, owner=f"c{i}", settings=settings)
        for _ in range(3):
            async with me.hold() as lease:
                inside.append(me.owner)
                assert len(inside) == 1, f"two holders: {inside}"
                holds.append((lease.epoch, me.owner))
                await asyncio.sleep(0.002)
                inside.remove(me.owner)

    async with asyncio.TaskGroup() as tg:
        for i in range(8):
            tg.create_task(contender(i))
    assert [e for e, _ in holds] == list(range(1, 25))


# -- bad state and bad settings ---------------------------------------------------------------------------


async def test_corrupt_lock_object_is_reported_not_overwritten(tmp_store: ObjectStore) -> None:
    await tmp_store.write(KEY, b'{"v": 1, "owner": "a"}')
    with pytest.raises(BadInput):
        await read_lock(tmp_store, NAME)
    with pytest.raises(BadInput):
        await lock(tmp_store, "b").acquire(timeout=1)
    assert (await tmp_store.read(KEY)).data == b'{"v": 1, "owner": "a"}'


def test_settings_without_room_for_two_renewals_are_refused(tmp_store: ObjectStore) -> None:
    bad = LockSettings(validity=3.0, renew_interval=1.0, max_drift=1.5)
    with pytest.raises(ConfigError, match="renew_interval"):
        StorageLock(tmp_store, NAME, settings=bad)
    with pytest.raises(BadInput):
        StorageLock(tmp_store, "a/b", settings=FAST)
