"""A fleet's Redis state and store, written as the workers write them, for the job and dataset pages' tests.

:func:`seed_pages` writes, for a fleet of :data:`SHARDS` shards:

- job ``JOB`` (:data:`BIG` datasets ``d00000``...): open on the shards in
  :data:`OPEN_SHARDS` (records in ``state:jobs`` / ``state:datasets``, the
  committed ones with a result beside them) and ended on the others (its
  results only), with a driver's liveness key on one open shard, and
  :data:`OTHER` datasets of another job in the same hashes (the page must
  not show them); :func:`expected_status` says what each shows;
- dataset ``DATASET``: open work of two jobs (one waiting, one quarantined),
  a quarantined record, :data:`COMMITS` manifests with watermarks and their
  ``committed`` events, its watermarks document, and its lock, taken and
  released by a real :class:`~shared.locks.StorageLock` (epoch 1);
- a dataset named ``GLOB_NAME`` (Redis glob characters) with one open job,
  whose page must show no other dataset's work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import msgspec
import redis.asyncio

from coordinator.admin import AdminServer
from shared import Settings
from shared.commit import Manifest, ManifestFile, WatermarksDoc
from shared.events import Committed, manifest_key, watermarks_key
from shared.locks import StorageLock
from shared.queue import AdminPublisher, DatasetResult, Keys, connect, encode_result, shard_of
from shared.storage import ObjectStore
from workers import DatasetState, JobMeta
from workers._core import Ended

SHARDS: Final = 4
JOB: Final = "job-big"
OTHER_JOB: Final = "job-other"
BIG: Final = 2000
OTHER: Final = 600
OPEN_SHARDS: Final = frozenset({0, 2})
DATASET: Final = "sales"
COMMITS: Final = 12
GLOB_NAME: Final = "s*l?s[b]"  # [b] is also Rich markup (bold)
QUARANTINE_REASON: Final = "publish failed: <b>bad</b> & 'quoted'"


def big_names() -> list[str]:
    """Return the names of JOB's datasets."""
    return [f"d{i:05d}" for i in range(BIG)]


def expected_status(name: str) -> str:
    """Return the status the page must show for one of JOB's datasets."""
    if shard_of(name, SHARDS) in OPEN_SHARDS:
        return "committed" if int(name[1:]) % 3 == 0 else "waiting"
    return "committed" if int(name[1:]) % 2 == 0 else "aborted"


async def seed_pages(r: redis.asyncio.Redis, keys: Keys, settings: Settings, store: ObjectStore) -> None:
    """Write the state described in the module doc."""
    now = time.time()
    enc = msgspec.json.Encoder()
    pipe = r.pipeline(transaction=False)
    for s in range(SHARDS):
        if s in OPEN_SHARDS:
            pipe.hset(
                keys.shard_state(s, "jobs"),
                JOB,
                enc.encode(JobMeta(job=JOB, opened_at=now - 60, deadline=now + 240)),
            )
        else:
            pipe.hset(keys.shard_state(s, "ended"), JOB, enc.encode(Ended(status="committed", at=now - 5)))
        pipe.set(keys.shard_state(s, "owner"), f"w{s}@1")
    pipe.set(keys.job_alive(min(OPEN_SHARDS), JOB), repr(now - 2), px=30_000)
    for name in big_names():
        s = shard_of(name, SHARDS)
        status = expected_status(name)
        if s in OPEN_SHARDS:
            pipe.hset(
                keys.shard_state(s, "datasets"), f"{JOB}/{name}", enc.encode(DatasetState(status=status))
            )
        if status != "waiting":
            res = DatasetResult(
                status=status,
                reason="" if status == "committed" else "failed",
                files=2,
                bytes=20,
                manifest=manifest_key(name, JOB) if status == "committed" else "",
                at=now,
            )
            pipe.hset(keys.job_result(s, JOB), name, encode_result(res))
    for s in range(SHARDS):
        other = JobMeta(job=OTHER_JOB, opened_at=now, deadline=now + 300)
        pipe.hset(keys.shard_state(s, "jobs"), OTHER_JOB, enc.encode(other))
    for i in range(OTHER):
        name = f"o{i:05d}"
        pipe.hset(
            keys.shard_state(shard_of(name, SHARDS), "datasets"),
            f"{OTHER_JOB}/{name}",
            enc.encode(DatasetState()),
        )
    ds_shard = shard_of(DATASET, SHARDS)
    pipe.hset(
        keys.shard_state(ds_shard, "jobs"),
        "job-w",
        enc.encode(JobMeta(job="job-w", opened_at=now, deadline=now + 300)),
    )
    pipe.hset(
        keys.shard_state(ds_shard, "datasets"), f"job-w/{DATASET}", enc.encode(DatasetState(status="waiting"))
    )
    pipe.hset(
        keys.shard_state(ds_shard, "jobs"),
        "job-q",
        enc.encode(JobMeta(job="job-q", opened_at=now, deadline=now + 300)),
    )
    pipe.hset(
        keys.shard_state(ds_shard, "datasets"),
        f"job-q/{DATASET}",
        enc.encode(DatasetState(status="quarantined", reason=QUARANTINE_REASON, fin=3)),
    )
    pipe.hset(keys.shard_state(ds_shard, "quarantined"), f"{DATASET}/job-q", QUARANTINE_REASON)
    g_shard = shard_of(GLOB_NAME, SHARDS)
    pipe.hset(
        keys.shard_state(g_shard, "datasets"),
        f"job-g/{GLOB_NAME}",
        enc.encode(DatasetState(status="waiting")),
    )
    # A dataset the glob would match if it were not escaped, on the same shard.
    pipe.hset(
        keys.shard_state(g_shard, "datasets"), "job-g/salesb", enc.encode(DatasetState(status="waiting"))
    )
    pipe.hset(keys.shard_state(g_shard, "quarantined"), "s-l-sb/job-g", "not mine")
    await pipe.execute()

    admin = AdminPublisher(r, keys)
    for i in range(COMMITS):
        job = f"job-c{i:02d}"
        m = Manifest(
            dataset=DATASET,
            job=job,
            files=[ManifestFile(key=f"{DATASET}/{job}~00000-part.parquet", size=100 + i)],
            watermarks={"kafka:0": 10 * i},
            epoch=1,
            committed_at=now - 100 + i,
        )
        await store.write(manifest_key(DATASET, job), msgspec.json.encode(m))
        # The admin stream remembers the newest commits only (older ones come from the listing).
        if i >= COMMITS // 2:
            await admin.publish(
                Committed(at=now, dataset=DATASET, job=job, files=1, bytes=100 + i, duration_s=0.1)
            )
    wm = WatermarksDoc(dataset=DATASET, values={"kafka:0": 10 * (COMMITS - 1)}, updated_at=now, nonce="n")
    await store.write(watermarks_key(DATASET), msgspec.json.encode(wm))
    lock = StorageLock(store, DATASET, owner="worker-7", settings=settings.lock)
    await lock.acquire(timeout=10)
    await lock.release()


__all__ = [
    "BIG",
    "COMMITS",
    "DATASET",
    "GLOB_NAME",
    "JOB",
    "OPEN_SHARDS",
    "OTHER_JOB",
    "QUARANTINE_REASON",
    "SHARDS",
    "big_names",
    "expected_status",
    "page_server",
    "seed_pages",
]


@asynccontextmanager
async def page_server(settings: Settings, keys: Keys, store: ObjectStore) -> AsyncIterator[str]:
    """Serve the admin API and console in this process (with ``store``); yield its base URL."""
    r = connect(settings.redis, client_name="pages-test")
    server = AdminServer(settings, r, keys, coordinator_id="c-pages", leading=asyncio.Event(), store=store)
    try:
        await server.start()
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop()
        await r.aclose()
