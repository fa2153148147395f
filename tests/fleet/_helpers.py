"""Helpers for fleet tests: settings, publishing synthetic jobs with staged files, checks."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis.asyncio

from shared import Settings, load_settings
from shared.commit import AuditReport, audit, read_manifest
from shared.events import (
    AdminEvent,
    Committed,
    DatasetExpectation,
    JobFailed,
    JobFinished,
    JobStarted,
    QueueEvent,
    StagedFile,
    TaskFinished,
    staged_key,
)
from shared.queue import Keys, read_admin_range
from shared.storage import ObjectStore
from tests._support.wait import wait_for
from workers import Probe


def fleet_settings(redis_url: str, root: Path, fleet: str, *, shards: int = 8, **extra: Any) -> Settings:
    """Return settings for a fast test fleet on a local-files root."""
    overrides: dict[str, Any] = {
        "fleet": {"name": fleet, "shards": shards},
        "redis": {"url": redis_url},
        "store": {"url": root.as_uri()},
        "lock": {"validity": 6.0, "renew_interval": 1.5, "max_drift": 0.2, "poll_min": 0.02, "poll_max": 0.3},
        "worker": {"lease": 3.0, "heartbeat": 0.5, "read_block_ms": 200, "drain_grace": 10.0},
        "coordinator": {"tick": 0.2, "http_port": 0},
        "commit": {"retry": {"attempts": 4, "initial": 0.01, "maximum": 0.1, "budget": 5.0}},
        "log": {"level": "INFO", "format": "text"},
    }
    for section, values in extra.items():
        overrides.setdefault(section, {}).update(values)
    return load_settings(env={}, overrides=overrides)


def pause_first_at(point: str) -> tuple[asyncio.Event, asyncio.Event, Probe]:
    """Return a probe (``Worker(..., probe=...)``, see ``workers._probe``) that makes the first work
    to reach point ``point`` of the commit path wait there.

    Returns ``(paused, go, probe)``: ``paused`` is set when that work arrives,
    and it goes on once the test sets ``go``; later arrivals pass at once.
    """
    paused = asyncio.Event()
    go = asyncio.Event()

    async def pause_first(at: str) -> None:
        if at == point and not paused.is_set():
            paused.set()
            await go.wait()

    return paused, go, pause_first


async def stage_task(
    store: ObjectStore, job: str, dataset: str, task: int, attempt: int, *, files: int = 1, size: int = 64
) -> TaskFinished:
    """Write a task attempt's staged files and return its TaskFinished event."""
    staged: list[StagedFile] = []
    for i in range(files):
        rel = f"part-{i}.bin"
        data = f"{job}/{dataset}/{task}/{attempt}/{i}|".encode().ljust(size, b".")
        await store.write(staged_key(job, dataset, task, attempt, rel), data)
        staged.append(StagedFile(path=rel, size=len(data)))
    return TaskFinished(
        job=job,
        dataset=dataset,
        task=task,
        attempt=attempt,
        files=staged,
        watermarks={"p0": task * 10 + attempt},
        finished_at=time.time(),
    )


async def good_job(
    store: ObjectStore,
    job: str,
    datasets: Iterable[str],
    tasks: int,
    *,
    duplicate_attempt: bool = True,
    concurrency: int = 1,
) -> list[QueueEvent]:
    """Return the events of a successful job (with a retried task and a duplicate delivery).

    ``concurrency`` > 1 stages that many datasets at once (a producer's
    executors do; the soak benchmark would otherwise measure its own staging);
    the events come out in the same order either way.
    """
    names = list(datasets)
    limit = asyncio.Semaphore(concurrency)

    async def one(ds: str) -> tuple[list[QueueEvent], DatasetExpectation]:
        async with limit:
            evs: list[QueueEvent] = []
            winners = []
            for t in range(tasks):
                ev = await stage_task(store, job, ds, t, 0)
                evs.append(ev)
                if duplicate_attempt and t == 0:
                    evs.append(ev)  # duplicate delivery
                    evs.append(await stage_task(store, job, ds, t, 1))  # a retried attempt that wins
                    winners.append(1)
                else:
                    winners.append(0)
            return evs, DatasetExpectation(tasks=tasks, winners=winners)

    evs: list[QueueEvent] = [JobStarted(job=job, datasets=names, timeout_s=600, started_at=time.time())]
    expect: dict[str, DatasetExpectation] = {}
    if concurrency <= 1:
        done = [await one(ds) for ds in names]
    else:
        done = list(await asyncio.gather(*(one(ds) for ds in names)))
    for ds, (ds_evs, expectation) in zip(names, done, strict=True):
        evs.extend(ds_evs)
        expect[ds] = expectation
    evs.append(JobFinished(job=job, datasets=expect, finished_at=time.time()))
    return evs


async def failed_job(store: ObjectStore, job: str, datasets: Iterable[str], tasks: int) -> list[QueueEvent]:
    """Return the events of a job that fails after its tasks staged output."""
    names = list(datasets)
    evs: list[QueueEvent] = [JobStarted(job=job, datasets=names, timeout_s=600, started_at=time.time())]
    for ds in names:
        for t in range(tasks):
            evs.append(await stage_task(store, job, ds, t, 0))
    evs.append(JobFailed(job=job, datasets=names, reason="boom", failed_at=time.time()))
    return evs


async def admin_events(r: redis.asyncio.Redis, fleet: str) -> list[AdminEvent]:
    """Return every admin event so far."""
    return [ev for _id, ev in await read_admin_range(r, Keys(fleet))]


async def commit_counts(r: redis.asyncio.Redis, fleet: str) -> Counter[tuple[str, str]]:
    """Return how many ``committed`` events each (dataset, job) has on the admin stream."""
    return Counter((e.dataset, e.job) for e in await admin_events(r, fleet) if isinstance(e, Committed))


async def assert_committed_once(r: redis.asyncio.Redis, fleet: str, expected: set[tuple[str, str]]) -> None:
    """Assert that every commit of ``expected``, and nothing else, is announced, each once.

    A worker announces a commit after its sequence ended (the WAL deleted), so
    a test that waited for the store can be ahead of the admin stream: the
    announcements are waited for (60 s), then checked.
    """

    async def announced() -> bool:
        return expected <= set(await commit_counts(r, fleet))

    await wait_for(announced, timeout=60, what="every commit announced")
    counts = await commit_counts(r, fleet)
    assert set(counts) == expected
    dup = {k: n for k, n in counts.items() if n != 1}
    assert not dup, f"committed more than once: {dup}"


async def committed(store: ObjectStore, datasets: Iterable[str], job: str) -> bool:
    """Return True when every dataset has the job's manifest."""
    for ds in datasets:
        if await read_manifest(store, ds, job) is None:
            return False
    return True


async def nothing_under(store: ObjectStore, prefix: str) -> bool:
    """Return True when no object's key starts with ``prefix``."""
    async for _ in store.list(prefix):
        return False
    return True


async def no_staging_left(store: ObjectStore, job: str) -> bool:
    """Return True when nothing is staged for ``job`` any more."""
    return await nothing_under(store, f"_staging/{job}/")


async def no_wal_left(store: ObjectStore) -> bool:
    """Return True when no commit sequence is under way (the manifest is written before
    the last step, clean-up, and the WAL goes only after it)."""
    return await nothing_under(store, "_wal/")


async def clean_audit(store: ObjectStore) -> AuditReport:
    """Return the audit report (callers assert ``ok``)."""
    return await audit(store)


async def corrupted_job(
    store: ObjectStore, job: str, dataset: str, tasks: int = 2
) -> tuple[list[QueueEvent], str, bytes]:
    """Return the events of a finished job whose task 0 staged file is shorter than its report says.

    Publishing it makes the commit's publish step fail verification, so the
    commit core quarantines the sequence. Also returns the corrupted staged
    key and the bytes that belong there (write them back to fix the cause).
    """
    evs: list[QueueEvent] = [JobStarted(job=job, datasets=[dataset], timeout_s=600, started_at=time.time())]
    for t in range(tasks):
        evs.append(await stage_task(store, job, dataset, t, 0))
    key = staged_key(job, dataset, 0, 0, "part-0.bin")
    right = (await store.read(key)).data
    await store.write(key, right[: len(right) // 2])
    expect = {dataset: DatasetExpectation(tasks=tasks, winners=[0] * tasks)}
    evs.append(JobFinished(job=job, datasets=expect, finished_at=time.time()))
    return evs, key, right
