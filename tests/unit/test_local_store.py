"""Local-files store: guarantees that only a file system can break (several processes, inodes,
temp files). The behaviour shared with the cloud stores is in tests/conformance."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import cast

import pytest

from shared._errors import ConfigError, NotFound, PreconditionFailed
from shared.storage import open_store
from shared.storage._local import LocalStore

PROCS = 6
KEYS = 30
INCREMENTS = 20


def _race_absent(root: str, wid: int, barrier: Barrier, out: Queue[tuple[int, list[str]]]) -> None:
    async def run() -> list[str]:
        store = LocalStore(Path(root), durable=False)
        won = []
        for k in range(KEYS):
            try:
                await store.write_if_absent(f"race/{k}", str(wid).encode())
            except PreconditionFailed:
                continue
            won.append(f"race/{k}")
        return won

    barrier.wait(timeout=60)
    out.put((wid, asyncio.run(run())))


def _increment(root: str, barrier: Barrier, out: Queue[int]) -> None:
    async def run() -> int:
        store = LocalStore(Path(root), durable=False)
        conflicts = 0
        for _ in range(INCREMENTS):
            while True:
                cur = await store.read("counter")
                try:
                    await store.write_if_match("counter", str(int(cur.data) + 1).encode(), cur.info.version)
                    break
                except PreconditionFailed:
                    conflicts += 1
        return conflicts

    barrier.wait(timeout=60)
    out.put(asyncio.run(run()))


def _run_procs(target: object, args: list[tuple[object, ...]]) -> list[object]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(args))
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, barrier, out)) for a in args]  # type: ignore[arg-type]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return results


def test_create_if_absent_across_processes_has_one_winner_per_key(tmp_path: Path) -> None:
    root = tmp_path / "store"
    results = cast(
        list[tuple[int, list[str]]], _run_procs(_race_absent, [(str(root), w) for w in range(PROCS)])
    )
    winners: dict[str, int] = {}
    for wid, won in results:
        for key in won:
            assert key not in winners, f"{key} won by {winners[key]} and {wid}"
            winners[key] = wid
    assert len(winners) == KEYS
    for key, wid in winners.items():
        assert (root / key).read_bytes() == str(wid).encode()
    assert list((root / ".cf" / "tmp").iterdir()) == []  # losers' temp files are gone


def test_compare_and_swap_across_processes_loses_no_update(tmp_path: Path) -> None:
    root = tmp_path / "store"
    asyncio.run(LocalStore(root).write("counter", b"0"))
    _run_procs(_increment, [(str(root),) for _ in range(4)])
    assert (root / "counter").read_bytes() == str(4 * INCREMENTS).encode()


async def test_delete_and_recreate_never_brings_a_version_back(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s", durable=False)
    seen: set[str] = set()
    for _ in range(50):
        info = await store.write_if_absent("k", b"same bytes")
        assert info.version not in seen
        seen.add(info.version)
        await store.delete("k")


async def test_stale_version_after_recreate_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s", durable=False)
    old = await store.write("k", b"x")
    await store.delete("k")
    await store.write("k", b"x")
    with pytest.raises(PreconditionFailed):
        await store.write_if_match("k", b"y", old.version)


async def test_reserved_area_and_empty_folders_stay_out_of_sight(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = LocalStore(root, durable=False)
    await store.write("a/b/c", b"1")
    await store.delete("a/b/c")
    assert not (root / "a").exists()  # empty parents are pruned
    assert [i.key async for i in store.list()] == []
    assert (root / ".cf").is_dir()
    with pytest.raises(NotFound):
        await store.read("a/b/c")


def test_open_store_file_urls(tmp_path: Path) -> None:
    assert isinstance(open_store((tmp_path / "x").as_uri()), LocalStore)
    assert isinstance(open_store(f"file://localhost{tmp_path}/y"), LocalStore)
    with pytest.raises(ConfigError):
        open_store("file://otherhost/abs")
    with pytest.raises(ConfigError):
        open_store("ftp://host/abs")
    os.chmod(tmp_path, 0o500)
    try:
        if os.geteuid() != 0:  # root ignores permissions
            with pytest.raises(ConfigError):
                LocalStore(tmp_path / "cannot" / "create")
    finally:
        os.chmod(tmp_path, 0o700)


async def test_writes_and_deletes_racing_in_one_folder_never_fail(tmp_path: Path) -> None:
    # Deletes prune empty folders while writers walk into them by descriptor: a writer whose
    # folder was pruned under it walks again (never an error, never a lost write).
    store = LocalStore(tmp_path / "s", durable=False)

    async def churn(n: int) -> None:
        for i in range(150):
            key = f"x/y/z/{n}-{i % 3}"
            await store.write(key, b"v")
            assert (await store.read(key)).data == b"v"
            await store.delete(key)

    async with asyncio.TaskGroup() as tg:
        for n in range(16):
            tg.create_task(churn(n))
    assert [i.key async for i in store.list()] == []
    assert not (tmp_path / "s" / "x").exists()
