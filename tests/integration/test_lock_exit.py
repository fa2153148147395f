"""The lock's contract at the end of a block: a block that outlived its lease, or whose loss was
noticed late, ends with ``LockLost``; cancellation counts left behind by Python 3.11 do not turn the
lock's own cancellation into a silent ``CancelledError``.

On a real local store; the holder is frozen by blocking its event loop (as a SIGSTOP, a long GC pause
or a starved CPU would), with a successor in another thread taking the lock over meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from shared import LockLost, RetryPolicy
from shared.locks import Clock, StorageLock, read_lock
from shared.settings import LockSettings
from shared.storage._local import LocalStore
from tests._support.fault_store import Fault, FaultStore
from tests._support.locks import FAST, NAME, is_renewal


def _lock(
    store: LocalStore | FaultStore,
    owner: str,
    settings: LockSettings = FAST,
    monotonic: Clock = time.monotonic,
) -> StorageLock:
    policy = RetryPolicy(budget=5.0).no_wait()
    return StorageLock(store, NAME, owner=owner, settings=settings, retry=policy, monotonic=monotonic)


async def test_a_block_that_outlived_its_lease_raises_lock_lost(tmp_path: Path) -> None:
    """Controllable clock: the block ends, without an await, after the local deadline."""
    now = [1000.0]
    slow = LockSettings(validity=60.0, renew_interval=20.0, max_drift=0.5, acquire_timeout=5.0)
    async with LocalStore(tmp_path / "s") as store:
        lock = _lock(store, "a", slow, monotonic=lambda: now[0])

        async def outlive() -> None:
            async with lock.hold() as lease:
                lease.check()
                now[0] = lease.deadline + 0.001  # the holder "slept" past its lease

        with pytest.raises(LockLost, match="outlived its lease"):
            await outlive()
        # Within the lease the same block ends normally.
        async with lock.hold() as lease:
            now[0] = lease.deadline - 0.001
        rec = await read_lock(store, NAME)
        assert rec is not None and rec.released


async def test_a_frozen_holder_whose_successor_holds_the_lock_gets_lock_lost(tmp_path: Path) -> None:
    """The holder's loop is blocked past its lease; a successor takes over; the block then ends normally."""
    root = tmp_path / "s"
    taken = threading.Event()
    successor_epoch: list[int] = []

    def successor() -> None:
        async def run() -> None:
            async with LocalStore(root) as store, _lock(store, "b").hold(timeout=20) as lease:
                successor_epoch.append(lease.epoch)
                taken.set()
                await asyncio.sleep(FAST.validity * 3)

        asyncio.run(run())

    async with LocalStore(root) as store:
        holder = _lock(store, "a")
        thread = threading.Thread(target=successor, daemon=True)

        async def frozen() -> None:
            async with holder.hold() as lease:
                thread.start()
                # Frozen: no await, so neither the heartbeat nor anything else runs here.
                assert taken.wait(timeout=20), "the successor never took the lock over"
                assert successor_epoch == [lease.epoch + 1]

        with pytest.raises(LockLost, match="outlived its lease"):
            await frozen()
        # The successor still holds it: the stale holder's release wrote nothing.
        rec = await read_lock(store, NAME)
        assert rec is not None and rec.owner == "b" and not rec.released
        thread.join(timeout=30)


async def _leak_a_cancel_request() -> None:
    """What Python 3.11's TaskGroup does when a child fails after the body ended: one request stays."""

    async def fail() -> None:
        await asyncio.sleep(0)
        raise ValueError("child failed")

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(fail())
    except* ValueError:
        pass


@pytest.mark.parametrize("leak", ["before", "inside"])
async def test_loss_after_a_leaked_cancel_request_is_lock_lost(tmp_path: Path, leak: str) -> None:
    """The worker's stuck dataset: the block's own cancellation must come out as LockLost.

    Before the fix the lease took the leaked request for an outside cancellation and let
    CancelledError through; the worker's retry loop does not catch that, so the work ended
    silently and the dataset stayed in flight on a live worker.
    """
    async with LocalStore(tmp_path / "s") as inner:
        store = FaultStore(inner)
        lock = _lock(store, "a")
        if leak == "before":
            await _leak_a_cancel_request()
        task = asyncio.current_task()
        assert task is not None
        leaked = task.cancelling()

        async def lose() -> None:
            async with lock.hold():
                if leak == "inside":
                    await _leak_a_cancel_request()
                # Renewals now hang: the lease runs out locally and the block is cancelled.
                store.faults.append(Fault("write_if_match", None, hang=True, times=1000, when=is_renewal))
                await asyncio.sleep(FAST.validity * 5)

        with pytest.raises(LockLost):
            await lose()
        assert task.cancelling() <= max(leaked, 1)
        while task.cancelling():
            task.uncancel()


async def test_a_block_that_swallows_the_cancellation_is_cancelled_again(tmp_path: Path) -> None:
    """A cancellation lost once (as 3.11's wait_for can) does not let the block run on unprotected."""
    async with LocalStore(tmp_path / "s") as inner:
        store = FaultStore(inner)
        lock = _lock(store, "a")
        swallowed = 0

        async def swallow_once() -> None:
            nonlocal swallowed
            async with lock.hold():
                store.faults.append(Fault("write_if_match", None, hang=True, times=1000, when=is_renewal))
                deadline = time.monotonic() + FAST.validity * 5
                while time.monotonic() < deadline:
                    try:
                        await asyncio.sleep(FAST.validity * 5)
                    except asyncio.CancelledError:
                        swallowed += 1
                        if swallowed > 1:
                            raise

        with pytest.raises(LockLost):
            await swallow_once()
        assert swallowed == 2


async def test_an_outside_cancellation_still_propagates(tmp_path: Path) -> None:
    async with LocalStore(tmp_path / "s") as store:
        lock = _lock(store, "a")
        entered = asyncio.Event()

        async def block() -> None:
            async with lock.hold():
                entered.set()
                await asyncio.sleep(60)

        t = asyncio.create_task(block())
        await entered.wait()
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        rec = await read_lock(store, NAME)
        assert rec is not None and rec.released
