"""A worker's Delta commits carry the job's sequence for the dataset as their ``txn`` version (issue 31).

An in-process fleet of one shard commits three jobs to a Delta-bound dataset; its worker is replaced
after the first, and the new owner's shard sequence starts again from its open records (none): the
``txn`` versions delta-rs reads still rise in job order.
"""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import redis.asyncio
from deltalake import DeltaTable

from shared.events import (
    DatasetExpectation,
    JobFinished,
    JobStarted,
    QueueEvent,
    StagedFile,
    TableBinding,
    TaskFinished,
    staged_key,
)
from shared.queue import Keys
from shared.storage import ObjectStore
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.wait import wait_for

DATASET = "sales"
APP = f"commitfleet/{DATASET}"


async def _job(store: ObjectStore, job: str, n: int) -> list[QueueEvent]:
    """The events of a job that writes one Parquet file of ``n`` rows to the Delta-bound dataset."""
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": [f"{job}-{i}" for i in range(n)], "amount": list(range(n))}), buf)
    body = buf.getvalue()
    await store.write(staged_key(job, DATASET, 0, 0, "part-0.parquet"), body)
    now = time.time()
    return [
        JobStarted(
            job=job,
            datasets=[DATASET],
            timeout_s=600,
            started_at=now,
            tables={DATASET: TableBinding(delta=True)},
        ),
        TaskFinished(
            job=job,
            dataset=DATASET,
            task=0,
            attempt=0,
            files=[StagedFile(path="part-0.parquet", size=len(body))],
            finished_at=now,
        ),
        JobFinished(job=job, datasets={DATASET: DatasetExpectation(tasks=1, winners=[0])}, finished_at=now),
    ]


def _txns(table: Path) -> list[int | None]:
    latest = DeltaTable(str(table)).version()
    return [DeltaTable(str(table), version=v).transaction_version(APP) for v in range(latest + 1)]


async def _ended(r: redis.asyncio.Redis, keys: Keys, job: str) -> bool:
    return not await r.hexists(keys.shard_state(0, "jobs"), job)


async def test_delta_txn_versions_are_the_jobs_sequences_and_rise_across_a_new_owner(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    settings = fleet_settings(redis_url, root, fleet_name, shards=1)
    keys = Keys(fleet_name)
    table = root / DATASET
    async with inprocess_fleet(redis_client, settings) as fleet:

        async def versions(n: int) -> bool:
            return (table / "_delta_log" / f"{n - 1:020d}.json").exists()

        await fleet.publisher.publish_many(await _job(fleet.store, "job-0", 2))
        await wait_for(lambda: versions(1), timeout=60, what="job-0's Delta version")
        await wait_for(lambda: _ended(redis_client, keys, "job-0"), timeout=30, what="job-0 ended")
        # A new owner: its shard sequence restarts from the open records it loads (none).
        fleet.worker.shutdown()
        await asyncio.wait_for(fleet.worker_task, 30)
        fleet.start_worker("w2")
        events = [*(await _job(fleet.store, "job-1", 3)), *(await _job(fleet.store, "job-2", 1))]
        await fleet.publisher.publish_many(events)
        await wait_for(lambda: versions(3), timeout=60, what="three Delta versions")
        for job in ("job-1", "job-2"):
            await wait_for(lambda j=job: _ended(redis_client, keys, j), timeout=30, what=f"{job} ended")  # type: ignore[misc]
    dt = DeltaTable(str(table))
    assert [c["commitfleet"]["job"] for c in reversed(dt.history())] == ["job-0", "job-1", "job-2"]
    # The shard's sequence: task_finished 1, job_finished 2 (job-0); after the new owner, 1 and 2 again
    # (job-1: at or below the table's txn, so one above it: 3), then 3 and 4 (job-2).
    assert _txns(table) == [2, 3, 4]
