"""Lock handoff within a process: a waiter is woken by the release itself, not by its next poll.

The correctness tests poll so rarely (30 s) that only the wake-up can explain a prompt handoff; they
wait on the real outcome (the acquire returning) under a deadline. The measurement (``-m bench``)
reports the handoff time in modelled round trips on a latency-modelled local store.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import pytest

from shared.locks import StorageLock
from shared.settings import LockSettings
from shared.storage._counting import CountingStore
from shared.storage._latency import LatencyModel, LatencyStore
from shared.storage._local import LocalStore
from tests._support.locks import SLOW_POLL
from tests._support.wait import wait_for


async def test_a_waiter_in_this_process_takes_over_at_the_release_with_one_write(tmp_path: Path) -> None:
    counting = CountingStore(LocalStore(tmp_path / "s", durable=False))
    holder = await StorageLock(counting, "ds", owner="a", settings=SLOW_POLL).acquire()
    waiter = asyncio.create_task(StorageLock(counting, "ds", owner="b", settings=SLOW_POLL).acquire())
    # The waiter has looked (one read: the lock is held) and sleeps until its next poll, 30 s away.
    await wait_for(
        lambda: asyncio.sleep(0, counting.requests["read"] >= 1), timeout=10, what="the waiter's look"
    )
    counting.reset()
    await holder.release()
    async with asyncio.timeout(10):
        lease = await waiter
    assert lease.epoch == 2 and lease.owner == "b"
    # The release, then the waiter's claim on the released version: no read in between.
    assert dict(counting.requests) == {"write_if_match": 2}
    await lease.release()


async def test_every_waiter_is_woken_and_exactly_one_wins_each_release(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s", durable=False)
    first = await StorageLock(store, "ds", owner="first", settings=SLOW_POLL).acquire()
    owners = [f"w{i}" for i in range(5)]
    waiting = [
        asyncio.create_task(StorageLock(store, "ds", owner=o, settings=SLOW_POLL).acquire()) for o in owners
    ]
    pending = set(waiting)
    held = first
    epochs = []
    async with asyncio.timeout(20):
        while pending:
            await held.release()
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1, done  # one lease at a time
            held = done.pop().result()
            epochs.append(held.epoch)
    await held.release()
    assert epochs == [2, 3, 4, 5, 6]
    assert {t.result().owner for t in waiting} == set(owners)


@pytest.mark.bench
async def test_handoff_time_in_round_trips(tmp_path: Path) -> None:
    median = 0.02
    store = LatencyStore(LocalStore(tmp_path / "s", durable=False), LatencyModel(median, median * 5, seed=1))
    settings = LockSettings()  # the default poll bounds: 0.05 s .. 2 s
    gaps = []
    for i in range(8):
        holder = await StorageLock(store, f"h{i}", owner="a", settings=settings).acquire()
        waiter = asyncio.create_task(StorageLock(store, f"h{i}", owner="b", settings=settings).acquire())
        await asyncio.sleep(1.5)  # the waiter is deep in its backoff (up to poll_max)
        await holder.release()
        released = time.monotonic()
        lease = await waiter
        gaps.append((time.monotonic() - released) / median)
        await lease.release()
    print(
        f"\nlock handoff within a process: p50 {statistics.median(gaps):.1f} round trips, max {max(gaps):.1f}"
    )
