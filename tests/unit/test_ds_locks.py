"""workers._ds_locks: one dataset at a time, and the table holds only datasets in use."""

from __future__ import annotations

import asyncio

import pytest

from workers._ds_locks import DatasetLocks


async def test_one_holder_per_dataset_and_the_table_empties() -> None:
    locks = DatasetLocks()
    inside: dict[str, int] = {}
    peak: dict[str, int] = {}

    async def work(ds: str) -> None:
        async with locks.hold(ds):
            inside[ds] = inside.get(ds, 0) + 1
            peak[ds] = max(peak.get(ds, 0), inside[ds])
            await asyncio.sleep(0)
            inside[ds] -= 1

    async with asyncio.TaskGroup() as tg:
        for i in range(3000):
            tg.create_task(work(f"ds{i % 300}"))
    assert set(peak.values()) == {1}
    assert len(locks) == 0


async def test_a_cancelled_waiter_and_a_failing_holder_leave_nothing_behind() -> None:
    locks = DatasetLocks()
    held = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("a"):
            held.set()
            await release.wait()
            raise ValueError("boom")

    async def waiter() -> None:
        async with locks.hold("a"):
            raise AssertionError("never reached")

    h = asyncio.create_task(holder())
    await held.wait()
    assert locks.busy("a") and not locks.busy("b")
    w = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    w.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w
    assert len(locks) == 1
    release.set()
    with pytest.raises(ValueError):
        await h
    assert len(locks) == 0 and not locks.busy("a")
