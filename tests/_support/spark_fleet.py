"""The Spark end-to-end fleet tests' shared parts: the fleet's handle, its fixtures, the exactly-once job.

tests/e2e/test_spark_fleet.py runs the fleet on the session's redis-server,
tests/e2e/test_spark_fleet_redis_cluster.py on a Redis Cluster; each defines
its ``spark``, ``e2e`` (the fleet processes) and ``r`` (a client) fixtures,
imports :func:`e2e_store` and :func:`settled_fleet` (the ``store`` and
``fleet`` fixtures), and both run :func:`three_datasets_commit_exactly_once`.
"""

from __future__ import annotations

import hashlib
import io
import secrets
import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
import redis.asyncio

from shared import Settings
from shared.commit import ManifestFile, audit, read_manifest, read_watermarks
from shared.events import (
    Aborted,
    Committed,
    JobFinished,
    QueueEvent,
    TaskFinished,
    ValidationLimits,
    decode_entry,
    manifest_key,
    published_key,
    staged_key,
)
from shared.fleet import FleetRegistry
from shared.queue import Keys, connect_sync, ensure_fleet_sync
from shared.spark import ProducerConfig, TaskResult, commit_job, max_watermark
from shared.storage import ObjectStore, open_store
from tests._support.fleet import fleet_settings
from tests._support.fleet_checks import admin_events
from tests._support.processes import FleetProcess, fleet_processes, write_config
from tests._support.wait import wait_for

SHARDS = 4
SECRET = "e2e-secret"
WORKERS = {"w1", "w2"}
ROWS = 240  # small on purpose: the point is the protocol, not the volume
SCHEMA = "id long, name string, attempt int"


@dataclass
class E2EFleet:
    """The module's running fleet: its settings, the producer config for it, its processes."""

    settings: Settings
    producer: ProducerConfig
    procs: list[FleetProcess]

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.fleet.name)

    def logs(self) -> str:
        return "".join(f"\n===== {p.name} ({p.kind}) =====\n{p.output()[-6000:]}" for p in self.procs)


@contextmanager
def run_e2e_fleet(base: Path, redis_url: str, *, app: str, **overrides: Any) -> Iterator[E2EFleet]:
    """Start a coordinator and two workers on ``redis_url`` and a store under ``base`` (not waiting
    for them: Spark starts meanwhile); kill them when the block ends.

    ``overrides`` are more settings (see ``fleet_settings``); messages are signed
    with :data:`SECRET`, acknowledged entries are kept (tests read the events of
    their jobs back from the streams).
    """
    (base / "store").mkdir()
    logs = base / "logs"
    logs.mkdir()
    settings = fleet_settings(
        redis_url,
        base / "store",
        "e2e" + secrets.token_hex(4),
        shards=SHARDS,
        security={"hmac_secret": SECRET},
        queue={"trim_interval": 0.0},
        **overrides,
    )
    config = write_config(settings, base / "fleet.toml")
    client = connect_sync(settings.redis)
    try:
        ensure_fleet_sync(client, settings.fleet.name, SHARDS)
    finally:
        client.close()
    producer = ProducerConfig.from_settings(settings, job_timeout=120.0, app=app)
    with fleet_processes(logs) as procs:
        procs.append(FleetProcess("coordinator", "c1", config, logs))
        procs.extend(FleetProcess("worker", w, config, logs) for w in sorted(WORKERS))
        yield E2EFleet(settings, producer, procs)


@pytest.fixture(name="store")
async def e2e_store(e2e: E2EFleet) -> AsyncIterator[ObjectStore]:
    async with open_store(e2e.settings.store.url, e2e.settings.store) as s:
        yield s


@pytest.fixture(name="fleet")
async def settled_fleet(
    request: pytest.FixtureRequest, e2e: E2EFleet, r: redis.asyncio.Redis
) -> AsyncIterator[E2EFleet]:
    """The module's fleet once every shard has a settled owner; its logs go to stderr if the test failed."""
    failed_before = request.session.testsfailed
    registry = FleetRegistry(r, e2e.keys)

    async def settled() -> bool:
        for p in e2e.procs:
            assert p.proc.poll() is None, f"{p.name} exited with {p.proc.returncode}"
        a = await registry.assignment(SHARDS)
        if set(a.owners()) != WORKERS or any(s.owner not in WORKERS or s.moving_to for s in a.slots):
            return False
        tokens = await registry.owner_tokens(SHARDS)
        return all(
            t is not None and t.decode().split("@")[0] == s.owner
            for s, t in zip(a.slots, tokens, strict=True)
        )

    await wait_for(settled, timeout=60, what="both workers to own every shard")
    yield e2e
    if request.session.testsfailed > failed_before:
        sys.stderr.write(e2e.logs())


# -- helpers ---------------------------------------------------------------------


def tagged_rows(spark: Any, partitions: int) -> Any:
    """Return ``ROWS`` rows ``(id, name, attempt)``; ``attempt`` is the Spark attempt that produced the row.

    The rows are made inside the writing task itself (one stage), so a file
    staged by attempt N holds ``attempt == N``: the published bytes show which
    attempt they came from.
    """

    def tag(rows: Iterable[int]) -> Iterator[tuple[int, str, int]]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        attempt = ctx.attemptNumber()
        for i in rows:
            yield (i, f"n{i}", attempt)

    rdd = spark.sparkContext.parallelize(range(ROWS), partitions).mapPartitions(tag)
    return spark.createDataFrame(rdd, SCHEMA)


async def keys_under(store: ObjectStore, prefix: str) -> list[str]:
    return [i.key async for i in store.list(prefix)]


async def events_of(r: redis.asyncio.Redis, fleet: E2EFleet, job: str) -> list[QueueEvent]:
    """Every event of ``job`` in the fleet's shard streams, decoded with the fleet's validation."""
    limits = ValidationLimits.from_settings(fleet.settings.security, fleet=fleet.settings.fleet.name)
    out: list[QueueEvent] = []
    for shard in range(SHARDS):
        stream = fleet.keys.events(shard)
        for entry_id, fields in await r.xrange(stream):
            ev = decode_entry(fields, limits=limits, stream=stream, entry_id=entry_id)
            if ev.job == job:
                out.append(ev)
    return out


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


async def three_datasets_commit_exactly_once(
    spark: Any, fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    """A job of three datasets, one with a task that fails once and is retried, commits each exactly once
    with its watermarks; the loser's files are gone (asserted, step by step)."""
    df = tagged_rows(spark, 3)
    subsets = {
        "orders": (df, lambda i: True),
        "customers": (df.where("id % 3 = 0"), lambda i: i % 3 == 0),
        "clicks": (df.where("id % 5 = 1"), lambda i: i % 5 == 1),
    }
    names = list(subsets)
    won: dict[str, list[TaskResult]] = {}
    started = time.monotonic()
    with commit_job(spark, datasets=names, config=fleet.producer) as job:
        won["orders"] = job.write_dataset(
            subsets["orders"][0], "orders", watermarks=max_watermark("id"), fail_once_tasks={1}
        )
        won["customers"] = job.write_dataset(
            subsets["customers"][0], "customers", watermarks=max_watermark("id", "cust_id")
        )
        won["clicks"] = job.write_dataset(subsets["clicks"][0], "clicks", watermarks=max_watermark("id"))
    job_id = job.job_id
    spark_done = time.monotonic()

    # The retried task: attempt 0 staged and published, then failed; attempt 1 won.
    assert [(w.task, w.attempt) for w in won["orders"]] == [(0, 0), (1, 1), (2, 0)]
    assert all(w.attempt == 0 for ds in ("customers", "clicks") for w in won[ds])
    events = await events_of(r, fleet, job_id)
    loser = [
        e
        for e in events
        if isinstance(e, TaskFinished) and e.dataset == "orders" and (e.task, e.attempt) == (1, 0)
    ]
    assert len(loser) == 1 and loser[0].files, "the losing attempt published its staged files"
    finished = {d: exp for e in events if isinstance(e, JobFinished) for d, exp in e.datasets.items()}
    assert finished["orders"].winners == [0, 1, 0]

    async def all_committed() -> bool:
        # The manifest is written before the staging clean-up and the WAL removal: wait for all three.
        for ds in names:
            if await read_manifest(store, ds, job_id) is None or await keys_under(store, f"_wal/{ds}/"):
                return False
        return await keys_under(store, f"_staging/{job_id}/") == []

    await wait_for(all_committed, timeout=60, what="every dataset to be committed and staging cleaned")
    sys.stderr.write(
        f"[figure] spark job {spark_done - started:.1f}s, fleet commit after it "
        f"{time.monotonic() - spark_done:.1f}s\n"
    )

    rows: list[dict[str, Any]] = []
    published_md5: set[str | None] = set()
    for ds in names:
        # Exactly one manifest, and it lists exactly the winners' files under their published keys.
        assert await keys_under(store, f"{ds}/_commits/") == [manifest_key(ds, job_id)]
        manifest = await read_manifest(store, ds, job_id)
        assert manifest is not None
        expected_files = [
            ManifestFile(key=published_key(ds, job_id, w.task, f.path), size=f.size, md5=f.md5)
            for w in won[ds]
            for f in w.files
        ]
        assert sorted(manifest.files, key=lambda f: f.key) == sorted(expected_files, key=lambda f: f.key)
        assert manifest.files, f"{ds}: something was published"
        published_md5 |= {f.md5 for f in manifest.files}
        published = sorted(k for k in await keys_under(store, f"{ds}/") if "/_commits/" not in k)
        assert published == sorted(f.key for f in manifest.files), f"{ds}: published files = manifest's"

        # The published bytes are the winners' (MD5 and the attempt column both say so).
        winner_of = {published_key(ds, job_id, w.task, f.path): w.attempt for w in won[ds] for f in w.files}
        ds_rows: list[dict[str, Any]] = []
        for f in manifest.files:
            data = (await store.read(f.key)).data
            assert (len(data), md5(data)) == (f.size, f.md5)
            table = pq.read_table(io.BytesIO(data))
            assert table.schema.names == ["id", "name", "attempt"]
            assert table.schema.field("id").type == pa.int64()
            assert set(table.column("attempt").to_pylist()) == {winner_of[f.key]}
            ds_rows += table.to_pylist()

        # Watermarks: the maximum id the dataset holds, in the manifest and in the dataset's document.
        mark = "cust_id" if ds == "customers" else "id"
        top = max(i for i in range(ROWS) if subsets[ds][1](i))
        assert manifest.watermarks == {mark: top}
        assert await read_watermarks(store, ds) == {mark: top}

        # Read back: exactly the input rows (count, checksum of ids, and the rows themselves).
        want = [i for i in range(ROWS) if subsets[ds][1](i)]
        ids = sorted(row["id"] for row in ds_rows)
        assert (len(ids), sum(ids), md5(repr(ids).encode())) == (
            len(want),
            sum(want),
            md5(repr(want).encode()),
        )
        assert sorted((row["id"], row["name"]) for row in ds_rows) == [(i, f"n{i}") for i in want]
        rows += ds_rows

    # The losing attempt's staged files are gone, and none of its bytes were published.
    for f in loser[0].files:
        assert await keys_under(store, staged_key(job_id, "orders", 1, 0, f.path)) == []
    assert not {f.md5 for f in loser[0].files} & published_md5

    # One Committed admin event per dataset, no abort; the whole store audits clean.
    admin = await admin_events(r, fleet.settings.fleet.name)
    commits = sorted(e.dataset for e in admin if isinstance(e, Committed) and e.job == job_id)
    assert commits == sorted(names)
    assert not [e for e in admin if isinstance(e, Aborted) and e.job == job_id]
    report = await audit(store, ended_jobs=[job_id])
    assert report.ok, report.violations
    assert len(rows) == ROWS + ROWS // 3 + ROWS // 5
