"""The commit critical path, pinned: one commit of F files alone, lock included, counted through
:class:`~shared.storage._counting.CountingStore` on a real local store (requests by kind, and
sequential rounds = busy periods). The figures must not drift back."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path

import pytest

from shared import Settings
from shared.commit import (
    AdvanceWatermarks,
    CommitRequest,
    StagedFile,
    StepContext,
    WinningAttempt,
    commit_dataset,
    read_manifest,
    read_watermarks,
)
from shared.events import lock_name, staged_key
from shared.locks import StorageLock
from shared.settings import LockSettings
from shared.storage._counting import CountingStore
from shared.storage._local import LocalStore
from tests._support.commit import ManualLease, fast_settings, keys


async def _stage(store: LocalStore, dataset: str, job: str, files: int) -> CommitRequest:
    winners = []
    for task in range(files):
        body = os.urandom(256 + task)
        path = f"part-{task}.parquet"
        await store.write(staged_key(job, dataset, task, 0, path), body)
        md5 = hashlib.md5(body).hexdigest()
        winners.append(
            WinningAttempt(
                task=task,
                attempt=0,
                files=[StagedFile(path=path, size=len(body), md5=md5)],
                watermarks={"p": task},
            )
        )
    return CommitRequest(dataset=dataset, job=job, winners=winners, expected_tasks=files)


async def _one_commit(root: Path, settings: Settings, dataset: str, files: int) -> CountingStore:
    store = LocalStore(root, durable=False)
    req = await _stage(store, dataset, "job-1", files)
    counting = CountingStore(store)
    lock = StorageLock(counting, lock_name(dataset), owner="probe", settings=LockSettings())
    async with lock.hold() as lease:
        res = await commit_dataset(counting, req, lease, settings)
    assert res.ok and not res.recovered, res
    manifest = await read_manifest(store, dataset, "job-1")
    assert manifest is not None and len(manifest.files) == files
    assert await keys(store, "_staging/") == []
    return counting


@pytest.mark.parametrize("files", [1, 4, 16])
async def test_one_commit_alone_within_2f_plus_10_requests_and_10_rounds(tmp_path: Path, files: int) -> None:
    counting = await _one_commit(tmp_path, fast_settings(concurrency=16), f"ds{files}", files)
    shown = dict(sorted(counting.requests.items()))
    assert counting.total <= 2 * files + 10, shown
    assert counting.rounds <= 10, (counting.rounds, shown)


async def test_no_object_is_read_twice_in_one_commit(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, durable=False)
    req = await _stage(store, "ds", "job-1", 4)
    reads: Counter[str] = Counter()

    class Watch(CountingStore):
        async def read(self, key: str):  # type: ignore[no-untyped-def]
            reads[key] += 1
            return await super().read(key)

        async def head(self, key: str):  # type: ignore[no-untyped-def]
            reads[key] += 1
            return await super().head(key)

        async def head_md5(self, key: str):  # type: ignore[no-untyped-def]
            reads[key] += 1
            return await super().head_md5(key)

    watched = Watch(store)
    lock = StorageLock(watched, lock_name("ds"), owner="probe", settings=LockSettings())
    async with lock.hold() as lease:
        assert (await commit_dataset(watched, req, lease, fast_settings())).ok
    assert all(n == 1 for n in reads.values()), reads


async def test_a_stale_watermarks_guess_is_refused_and_nothing_moves_back(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, durable=False)
    first = await _stage(store, "ds", "job-1", 2)  # watermarks p: 1
    assert (await commit_dataset(store, first, ManualLease("ds", 1), fast_settings())).ok
    # Another process moves the watermarks far ahead: this process's last sight of them is stale.
    other = CommitRequest(
        dataset="ds",
        job="job-x",
        expected_tasks=1,
        winners=[WinningAttempt(task=0, attempt=0, files=[], watermarks={"p": 500, "q": 7})],
    )
    raw = LocalStore(tmp_path, durable=False)
    await AdvanceWatermarks(dataset="ds", values=dict(other.winners[0].watermarks)).execute(
        StepContext(store=_Elsewhere(raw), lease=ManualLease("ds", 2))
    )
    second = await _stage(store, "ds", "job-2", 4)  # watermarks p: 3
    counting = CountingStore(store)
    assert (await commit_dataset(counting, second, ManualLease("ds", 3), fast_settings())).ok
    assert await read_watermarks(store, "ds") == {"p": 500, "q": 7}
    # The guessed write on the old version was refused, then one read: the values already covered.
    assert counting.requests["write_if_match"] == 2  # the refused guess, the fence
    assert counting.requests["read"] == 1


class _Elsewhere(CountingStore):
    """The same files under another name: writes through it are not this process's sight of the store."""

    @property
    def url(self) -> str:
        return self._inner.url + "#elsewhere"
