"""Helpers for the commit-core tests: settings, a lease we control, staged jobs, the exactly-once check.

- :func:`fast_settings`: settings whose retries never sleep.
- :class:`ManualLease`: a Lease whose epoch we choose and that we can mark lost.
- :func:`stage_job`: writes real staged files for a job and returns the request.
- :func:`assert_exactly_once`: the exactly-once invariant, checked on the store.

(The store wrapper that injects faults is tests/_support/fault_store.py.)
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from shared import LockLost, Settings
from shared.commit import (
    CommitRequest,
    StagedFile,
    WinningAttempt,
    audit,
    read_manifest,
    read_watermarks,
)
from shared.events import published_key, staged_key, wal_prefix
from shared.settings import CommitSettings, RetrySettings
from shared.storage import ObjectStore


def fast_settings(*, attempts: int = 4, concurrency: int = 4) -> Settings:
    """Return settings whose retries never sleep (initial = maximum = 0)."""
    retry = RetrySettings(attempts=attempts, initial=0.0, maximum=0.0, budget=30.0)
    return Settings(commit=CommitSettings(publish_concurrency=concurrency, retry=retry))


class ManualLease:
    """A Lease for tests: fixed name and epoch; ``lose()`` makes ``check()`` raise LockLost."""

    def __init__(self, name: str, epoch: int) -> None:
        self._name = name
        self._epoch = epoch
        self.lost = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def epoch(self) -> int:
        return self._epoch

    def check(self) -> None:
        if self.lost:
            raise LockLost(f"lease {self._name}@{self._epoch} lost (test)")

    def lose(self) -> None:
        self.lost = True


@dataclass
class StagedJob:
    """A job staged for one dataset: the request, and every staged file's bytes by key."""

    req: CommitRequest
    winners: dict[str, bytes]  # staged key -> bytes, winning attempts
    losers: dict[str, bytes]  # staged key -> bytes, losing attempts

    def published(self) -> dict[str, bytes]:
        """Return where each winning file must end up, with its bytes."""
        out = {}
        for w in self.req.winners:
            for f in w.files:
                src = staged_key(self.req.job, self.req.dataset, w.task, w.attempt, f.path)
                out[published_key(self.req.dataset, self.req.job, w.task, f.path)] = self.winners[src]
        return out


async def stage_job(
    store: ObjectStore,
    dataset: str,
    job: str,
    *,
    tasks: int = 2,
    files_per_task: int = 2,
    losers: int = 1,
    with_md5: bool = True,
    marks: dict[str, int] | None = None,
    seed: int = 0,
) -> StagedJob:
    """Stage real files: each task's winning attempt 1 (plus ``losers`` losing attempt 0 of task 0)."""
    rng = random.Random(f"{dataset}/{job}/{seed}")
    winners: dict[str, bytes] = {}
    lost: dict[str, bytes] = {}
    attempts = []
    for task in range(tasks):
        files = []
        for n in range(files_per_task):
            body = rng.randbytes(rng.randint(1, 300))
            path = f"date=2024-01-0{1 + n % 2}/part-{n}.parquet"
            key = staged_key(job, dataset, task, 1, path)
            await store.write(key, body)
            winners[key] = body
            md5 = hashlib.md5(body).hexdigest() if with_md5 else None
            files.append(StagedFile(path=path, size=len(body), md5=md5))
        wm = {f"p{task}": (marks or {}).get(f"p{task}", 100 * (task + 1) + seed)}
        attempts.append(WinningAttempt(task=task, attempt=1, files=files, watermarks=wm))
    for n in range(losers):
        body = rng.randbytes(50)
        key = staged_key(job, dataset, 0, 0, f"loser-{n}.parquet")
        await store.write(key, body)
        lost[key] = body
    req = CommitRequest(dataset=dataset, job=job, winners=attempts, expected_tasks=tasks)
    return StagedJob(req=req, winners=winners, losers=lost)


async def keys(store: ObjectStore, prefix: str = "") -> list[str]:
    """Return every key under ``prefix``."""
    return [i.key async for i in store.list(prefix)]


async def assert_exactly_once(store: ObjectStore, *jobs: StagedJob) -> None:
    """Every winning file published once with its bytes, nothing staged left, manifest present,
    watermarks = max, no log left, and ``audit`` clean."""
    report = await audit(store)
    assert report.ok, report.violations
    assert await keys(store, "_staging/") == []
    assert await keys(store, wal_prefix()) == []
    expected_marks: dict[str, dict[str, int]] = {}
    for job in jobs:
        manifest = await read_manifest(store, job.req.dataset, job.req.job)
        assert manifest is not None
        want = job.published()
        assert sorted(f.key for f in manifest.files) == sorted(want)
        for key, body in want.items():
            assert (await store.read(key)).data == body
        marks = expected_marks.setdefault(job.req.dataset, {})
        for w in job.req.winners:
            for k, v in w.watermarks.items():
                marks[k] = max(marks.get(k, v), v)
    for dataset, marks in expected_marks.items():
        assert await read_watermarks(store, dataset) == marks
        own = (f"{dataset}/_commits/", f"{dataset}/_delta_log/")  # manifests; a Delta table's log
        published = [k for k in await keys(store, f"{dataset}/") if not k.startswith(own)]
        wanted = [k for j in jobs if j.req.dataset == dataset for k in j.published()]
        assert sorted(published) == sorted(wanted)
