"""Synthetic jobs for fleet tests: staged files in the store, and the queue events reporting them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from shared.events import (
    DatasetExpectation,
    JobFailed,
    JobFinished,
    JobStarted,
    QueueEvent,
    StagedFile,
    TaskFinished,
    staged_key,
)
from shared.storage import ObjectStore


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
