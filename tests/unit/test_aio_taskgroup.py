"""shared._aio.TaskGroup: a child failing after the body ended leaves no cancel request behind."""

from __future__ import annotations

import asyncio

import pytest

from shared._aio import TaskGroup
from tests._support.cancels import loses_cancels


async def _fail_later(started: asyncio.Event) -> None:
    started.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    raise ValueError("boom")


@pytest.mark.parametrize("fail_in_body", [False, True])
async def test_no_cancel_request_is_left_on_the_parent(fail_in_body: bool) -> None:
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    started = asyncio.Event()

    async def run() -> None:
        async with TaskGroup() as tg:
            tg.create_task(_fail_later(started))
            await started.wait()
            if fail_in_body:
                # The child fails while the body still runs (3.11 handles this case itself).
                await asyncio.sleep(1)

    with pytest.raises(ExceptionGroup):
        await run()
    assert task.cancelling() == before
    # Later scopes in the same task work as if nothing happened.
    async with asyncio.timeout(5):
        await asyncio.sleep(0)


async def test_an_outside_cancel_still_propagates() -> None:
    gate = asyncio.Event()

    async def body() -> None:
        async with TaskGroup() as tg:
            tg.create_task(asyncio.sleep(10))
            gate.set()
            await asyncio.sleep(10)

    t = asyncio.create_task(body())
    await gate.wait()
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert t.cancelled()


async def test_plain_taskgroup_leaks_on_this_python() -> None:
    # Documents why the subclass exists; on 3.12+ the leak is gone.
    import sys

    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    started = asyncio.Event()

    async def run() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_fail_later(started))
            await started.wait()

    with pytest.raises(ExceptionGroup):
        await run()
    leaked = task.cancelling() - before
    assert leaked == (1 if sys.version_info < (3, 12) else 0)
    if leaked:
        task.uncancel()


async def test_raise_if_cancelling_ends_a_task_whose_cancel_was_swallowed() -> None:
    """A cancel lost inside a library call (the task reads on) is raised again at the check."""
    from shared._aio import raise_if_cancelling

    async def reader() -> str:
        task = asyncio.current_task()
        assert task is not None
        raise_if_cancelling()  # no request yet: returns
        task.cancel()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass  # what a library that loses the cancel does
        raise_if_cancelling()
        return "read on"

    t = asyncio.ensure_future(reader())
    with pytest.raises(asyncio.CancelledError):
        await t


@pytest.mark.parametrize("how", ["body raises", "child fails", "parent cancelled"])
async def test_an_aborting_group_ends_though_a_child_lost_its_cancel(how: str) -> None:
    started = asyncio.Event()
    cancels: list[int] = []

    async def fail_soon() -> None:
        await started.wait()
        raise ValueError("child failed")

    async def run() -> None:
        async with TaskGroup() as tg:
            tg.create_task(loses_cancels(1, cancels, started=started))
            if how == "child fails":
                tg.create_task(fail_soon())
                await asyncio.sleep(3600)
            await started.wait()
            if how == "body raises":
                raise ValueError("body failed")
            await asyncio.sleep(3600)

    t = asyncio.create_task(run())
    await started.wait()
    if how == "parent cancelled":
        await asyncio.sleep(0)
        t.cancel()
    # A plain asyncio.TaskGroup waits for the child forever here.
    async with asyncio.timeout(10):
        done, _ = await asyncio.wait([t])
    assert t in done
    assert len(cancels) == 2, cancels
    if how == "parent cancelled":
        assert t.cancelled()
    else:
        assert isinstance(t.exception(), ExceptionGroup)


async def test_a_group_that_is_not_aborting_cancels_nothing_again() -> None:
    """A child the body cancelled itself is the body's to see through (cancel_until_done):
    the group adds no cancel of its own (it would read as one from outside)."""
    from shared._aio import RECANCEL_S

    started = asyncio.Event()
    cancels: list[int] = []
    handled = asyncio.Event()

    async def child() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancels.append(1)
            # Cleanup that takes several re-cancel periods, the request still pending.
            try:
                await asyncio.sleep(RECANCEL_S * 4)
            except asyncio.CancelledError:
                cancels.append(2)
            handled.set()
            raise

    async with asyncio.timeout(10):
        async with TaskGroup() as tg:
            t = tg.create_task(child())
            await started.wait()
            t.cancel()
    assert handled.is_set()
    assert cancels == [1]
