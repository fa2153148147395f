"""The local store's urgent lane: calls on lock objects run before calls queued earlier."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import shared.storage._local_pool as pool_mod
from shared._aio import TaskGroup
from shared.locks import lock_key
from shared.storage._local import URGENT_PREFIX, LocalStore
from shared.storage._local_pool import ThreadPool


async def test_an_urgent_call_runs_before_the_calls_queued_ahead_of_it() -> None:
    pool = ThreadPool(1, "t", burst=1)  # one thread, never a surplus one
    release, started = threading.Event(), threading.Event()
    order: list[str] = []

    def blocker() -> None:
        started.set()
        assert release.wait(10)

    def record(name: str) -> str:
        order.append(name)
        return name

    try:
        async with TaskGroup() as tg:
            tg.create_task(pool.run(blocker))
            assert await asyncio.to_thread(started.wait, 10)
            queued = [tg.create_task(pool.run(functools.partial(record, f"q{i}"))) for i in range(5)]
            await asyncio.sleep(0)  # the five are in the queue before the urgent one
            urgent = tg.create_task(pool.run(functools.partial(record, "urgent"), urgent=True))
            await asyncio.sleep(0)
            release.set()
        assert order == ["urgent", "q0", "q1", "q2", "q3", "q4"]
        assert urgent.result() == "urgent" and [t.result() for t in queued] == [f"q{i}" for i in range(5)]
    finally:
        release.set()
        pool.close()


async def test_urgent_calls_queued_before_close_still_run() -> None:
    pool = ThreadPool(1, "t", burst=1)
    release, started = threading.Event(), threading.Event()

    def blocker() -> None:
        started.set()
        assert release.wait(10)

    try:
        first = asyncio.create_task(pool.run(blocker))
        assert await asyncio.to_thread(started.wait, 10)
        urgent = asyncio.create_task(pool.run(lambda: "done", urgent=True))
        await asyncio.sleep(0)
        pool.close()
        release.set()
        assert await asyncio.wait_for(urgent, 10) == "done"
        await first
    finally:
        release.set()
        pool.close()


async def test_many_urgent_and_plain_calls_on_several_threads_all_answer() -> None:
    pool = ThreadPool(3, "t")
    try:
        calls = [pool.run(functools.partial(int, i), urgent=i % 3 == 0) for i in range(600)]
        assert await asyncio.gather(*calls) == list(range(600))
        assert not pool._urgent
    finally:
        pool.close()


def test_the_urgent_prefix_is_where_locks_live() -> None:
    assert lock_key("ds1").startswith(URGENT_PREFIX)


async def test_a_lock_write_on_a_busy_local_store_jumps_the_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No surplus thread in this test: the one thread is the only way through.
    monkeypatch.setattr(pool_mod, "STALL_S", 60.0)
    store = LocalStore(tmp_path, threads=1)
    release, started = threading.Event(), threading.Event()
    original: Callable[..., object] = store._head

    def head(root_fd: int, key: str) -> object:
        if key == "slow":
            started.set()
            assert release.wait(10)
        return original(root_fd, key)

    monkeypatch.setattr(store, "_head", head)
    done: list[str] = []
    try:
        await store.write("slow", b"x")

        async def write(key: str) -> None:
            await store.write(key, b"data")
            done.append(key)

        async with TaskGroup() as tg:
            tg.create_task(store.head("slow"))
            assert await asyncio.to_thread(started.wait, 10)
            for i in range(4):
                tg.create_task(write(f"data/part-{i}"))
            await asyncio.sleep(0)
            tg.create_task(write(lock_key("ds1")))
            await asyncio.sleep(0)
            release.set()
        assert done[0] == lock_key("ds1")
        assert sorted(done[1:]) == [f"data/part-{i}" for i in range(4)]
        assert (await store.read(lock_key("ds1"))).data == b"data"
    finally:
        release.set()
        await store.close()
