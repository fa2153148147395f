"""Hostile staged output through a real coordinator and worker (in one process, a real redis-server,
a local-files store): a staging folder linked out of the root, a linked staged file, a false MD5 and a
wrong size each quarantine their dataset with a reason and publish nothing; a failed job with a link
in its staging is rolled back; nothing outside the root is touched; the worker stays alive and
commits the jobs that come after."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import msgspec
import redis.asyncio

from shared.events import (
    Aborted,
    AdminEvent,
    Committed,
    DatasetExpectation,
    JobFailed,
    JobFinished,
    JobStarted,
    Quarantined,
    QueueEvent,
    StagedFile,
    TaskFinished,
)
from shared.queue import ensure_fleet
from shared.storage import ObjectStore
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_checks import admin_events, committed, nothing_under
from tests._support.fleet_jobs import good_job, stage_task
from tests._support.wait import wait_for


def _outside(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    out = tmp_path / "outside"
    (out / "dir").mkdir(parents=True)
    files = {"secret": b"not yours" * 7, "dir/part-0.bin": b"o" * 64}
    for name, body in files.items():
        (out / name).write_bytes(body)
    return out, files


def _one_dataset_job(job: str, dataset: str, tasks: list[TaskFinished]) -> list[QueueEvent]:
    return [
        JobStarted(job=job, datasets=[dataset], timeout_s=600, started_at=time.time()),
        *tasks,
        JobFinished(
            job=job,
            datasets={dataset: DatasetExpectation(tasks=len(tasks), winners=[0] * len(tasks))},
            finished_at=time.time(),
        ),
    ]


async def _hostile_jobs(store: ObjectStore, root: Path, out: Path) -> list[QueueEvent]:
    evs: list[QueueEvent] = []
    # A staging folder that is a link to outside: task 1's attempt folder.
    t0 = await stage_task(store, "j-dir", "lk", 0, 0)
    (root / "_staging" / "j-dir" / "lk" / "1-0").symlink_to(out / "dir")
    t1 = msgspec.structs.replace(t0, task=1, files=[StagedFile(path="part-0.bin", size=64)])
    evs += _one_dataset_job("j-dir", "lk", [t0, t1])
    # A staged file that is a link to a file outside.
    f0 = await stage_task(store, "j-file", "lf", 0, 0)
    (root / "_staging" / "j-file" / "lf" / "0-0" / "part-0.bin").unlink()
    (root / "_staging" / "j-file" / "lf" / "0-0" / "part-0.bin").symlink_to(out / "secret")
    evs += _one_dataset_job(
        "j-file", "lf", [msgspec.structs.replace(f0, files=[StagedFile(path="part-0.bin", size=63)])]
    )
    # A false MD5, and a wrong size, on the last task (the others would be published first).
    m = [await stage_task(store, "j-md5", "md", t, 0) for t in range(3)]
    false = StagedFile(path="part-0.bin", size=64, md5=hashlib.md5(b"something else").hexdigest())
    evs += _one_dataset_job("j-md5", "md", [*m[:2], msgspec.structs.replace(m[2], files=[false])])
    s = [await stage_task(store, "j-size", "sz", t, 0) for t in range(3)]
    evs += _one_dataset_job(
        "j-size",
        "sz",
        [*s[:2], msgspec.structs.replace(s[2], files=[StagedFile(path="part-0.bin", size=65)])],
    )
    # A failed job whose staging holds a link to a folder outside: the abort must not follow it.
    a = await stage_task(store, "j-fail", "ab", 0, 0)
    (root / "_staging" / "j-fail" / "ab" / "1-0").symlink_to(out / "dir")
    evs += [
        JobStarted(job="j-fail", datasets=["ab"], timeout_s=600, started_at=time.time()),
        a,
        JobFailed(job="j-fail", datasets=["ab"], reason="boom", failed_at=time.time()),
    ]
    return evs


async def test_hostile_staging_quarantines_and_the_worker_goes_on(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    out, outside_files = _outside(tmp_path)
    settings = fleet_settings(redis_url, root, fleet_name)
    async with inprocess_fleet(redis_client, settings, ensure=False) as fleet:
        store = fleet.store
        await ensure_fleet(redis_client, fleet_name, settings.fleet.shards)
        pub = fleet.publisher
        await pub.publish_many(await _hostile_jobs(store, root, out))
        await pub.publish_many(await good_job(store, "j-ok", ["ok1", "ok2"], tasks=2))

        want = {"lk": "symbolic link", "lf": "symbolic link", "md": "MD5", "sz": "its task reported 65"}

        async def outcomes() -> list[AdminEvent] | None:
            evs = await admin_events(redis_client, fleet_name)
            quarantined = {e.dataset for e in evs if isinstance(e, Quarantined)}
            aborted = {e.dataset for e in evs if isinstance(e, Aborted)}
            done = {e.dataset for e in evs if isinstance(e, Committed)}
            return evs if quarantined >= set(want) and "ab" in aborted and done >= {"ok1", "ok2"} else None

        evs = await wait_for(outcomes, timeout=60, what="quarantines, the abort and the good commits")
        reasons = {e.dataset: e.reason for e in evs if isinstance(e, Quarantined)}
        for dataset, words in want.items():
            assert reasons[dataset].startswith("publish _staging/") and ": verify: " in reasons[dataset]
            assert words in reasons[dataset], reasons[dataset]
        for dataset in ("lk", "lf", "md", "sz"):
            assert await nothing_under(store, f"{dataset}/"), dataset  # nothing published
        assert await nothing_under(store, "_staging/j-fail/")  # rolled back (the link is not an object)
        assert (root / "_staging" / "j-fail" / "ab" / "1-0").is_symlink()  # left alone, not followed

        # Nothing outside the root was moved, read into the store or deleted.
        assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(outside_files)
        for name, body in outside_files.items():
            assert (out / name).read_bytes() == body

        # The worker is alive and still commits what comes next.
        assert not any(t.done() for t in (fleet.coordinator_task, *fleet.worker_tasks))
        await pub.publish_many(await good_job(store, "j-later", ["ok3"], tasks=2))
        await wait_for(lambda: committed(store, ["ok3"], "j-later"), timeout=60, what="a later commit")
