"""The local store's thread pool: answers, failures, a cancelled caller waiting for its thread, close."""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
from pathlib import Path
from typing import Any

import pytest

from shared._aio import TaskGroup
from shared.storage._local_pool import ThreadPool


async def test_returns_the_answer_and_raises_the_failure() -> None:
    pool = ThreadPool(2, "t")
    try:
        assert await pool.run(lambda: threading.current_thread().name) != threading.current_thread().name
        with pytest.raises(ZeroDivisionError):
            await pool.run(lambda: 1 // 0)
    finally:
        pool.close()


async def test_a_cancelled_caller_waits_for_its_call_then_is_cancelled() -> None:
    pool = ThreadPool(2, "t")
    started, release = threading.Event(), threading.Event()
    ended: list[str] = []

    def call() -> str:
        started.set()
        release.wait(10)
        ended.append("landed")
        return "late"

    try:
        task = asyncio.create_task(pool.run(call))
        await asyncio.to_thread(started.wait, 10)
        task.cancel()
        task.cancel()  # a second cancel changes nothing
        # The call is still running: the caller must not have moved on.
        done, _ = await asyncio.wait({task}, timeout=0.2)
        assert not done and not ended
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ended == ["landed"]  # the cancel went on only after the call had ended
    finally:
        release.set()
        pool.close()


async def test_a_cancelled_callers_failure_is_not_reported_as_never_retrieved() -> None:
    pool = ThreadPool(1, "t")
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    started, release = threading.Event(), threading.Event()

    def call() -> None:
        started.set()
        release.wait(10)
        raise OSError("failed after its caller left")

    try:
        task = asyncio.create_task(pool.run(call))
        await asyncio.to_thread(started.wait, 10)
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        del task
        gc.collect()
        await asyncio.sleep(0)
        assert seen == []
    finally:
        release.set()
        loop.set_exception_handler(None)
        pool.close()


async def test_runs_up_to_size_calls_at_once_and_no_more_threads() -> None:
    pool = ThreadPool(3, "t")
    barrier = threading.Barrier(3, timeout=10)
    try:
        # Three calls that only return once all three run at the same time.
        await asyncio.gather(*(pool.run(barrier.wait) for _ in range(3)))
        for _ in range(20):
            await pool.run(lambda: None)
        assert len(pool._threads) == 3
    finally:
        pool.close()


async def test_close_ends_the_threads_and_refuses_new_calls() -> None:
    pool = ThreadPool(2, "t")
    await asyncio.gather(pool.run(lambda: None), pool.run(lambda: None))
    threads = list(pool._threads)
    pool.close()
    pool.close()  # safe twice
    for t in threads:
        await asyncio.to_thread(t.join, 10)
        assert not t.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        await pool.run(lambda: None)


async def test_a_local_store_runs_its_calls_on_store_local_threads_threads(tmp_path: Path) -> None:
    from shared import load_settings
    from shared._errors import ConfigError
    from shared.storage import open_store
    from shared.storage._local import LocalStore

    settings = load_settings(env={}, overrides={"store": {"url": tmp_path.as_uri(), "local_threads": 2}})
    names: set[str] = set()
    release = threading.Event()
    waiting = threading.Semaphore(0)

    async with open_store(settings.store.url, settings.store) as store:
        assert isinstance(store, LocalStore)
        await store.write("warm", b"x")  # the pool starts with the first call
        pool = store._pool
        assert pool is not None

        def call() -> None:
            names.add(threading.current_thread().name)
            waiting.release()
            assert release.wait(10)

        async with TaskGroup() as tg:
            for _ in range(6):
                tg.create_task(pool.run(call))
            for _ in range(2):  # both threads busy: the other four calls queue
                assert await asyncio.to_thread(waiting.acquire, True, 10)
            release.set()
        assert len(pool._threads) == 2 and len(names) == 2
    with pytest.raises(ConfigError, match=r"store\.local_threads"):
        load_settings(env={}, overrides={"store": {"url": tmp_path.as_uri(), "local_threads": 0}})


async def test_a_call_queued_behind_busy_threads_gets_a_surplus_thread_up_to_burst(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shared.storage._local_pool as pool_mod

    monkeypatch.setattr(pool_mod, "SURPLUS_IDLE_S", 0.05)
    pool = ThreadPool(1, "t", burst=2)
    release = threading.Event()
    started = threading.Semaphore(0)

    def slow() -> str:
        started.release()
        assert release.wait(10)
        return "slow"

    try:
        async with TaskGroup() as tg:
            first = tg.create_task(pool.run(slow))
            assert await asyncio.to_thread(started.acquire, True, 10)
            # Every thread is busy: this call gets a thread of its own and ends first.
            quick = await asyncio.wait_for(pool.run(lambda: "quick"), 10)
            assert quick == "quick" and not first.done()
            second = tg.create_task(pool.run(slow))
            assert await asyncio.to_thread(started.acquire, True, 10)
            # Two threads, both busy, burst 2: a third call waits for one of them.
            third = tg.create_task(pool.run(lambda: "third"))
            done, _ = await asyncio.wait({third}, timeout=0.2)
            assert not done and len(pool._threads) == 2
            release.set()
        assert (first.result(), second.result(), third.result()) == ("slow", "slow", "third")
        # The surplus thread ends once idle; the pool still answers calls after it.
        deadline = asyncio.get_running_loop().time() + 10
        while len(pool._threads) > 1:
            assert asyncio.get_running_loop().time() < deadline, "the surplus thread never ended"
            await asyncio.sleep(0.01)
        answers = await asyncio.gather(*(pool.run(functools.partial(int, i)) for i in range(8)))
        assert answers == list(range(8))
    finally:
        release.set()
        pool.close()
