"""Job order is commit order, for every dataset, across SIGKILLed owners (issue 31 item 2).

30 jobs share 50 datasets; each job's ``job_finished`` is published after the one of the job before it, so
on every shard's stream the jobs finished in job order. Worker processes are SIGKILLed while commits are
queued, and new owners rebuild the work from the saved shard state. Each dataset's commits must still be
in job order: read from the store, the lock epoch each manifest was planned under (a dataset's lock epoch
grows with each hold, and one commit runs at a time under it) orders its commits. Some of the datasets are
bound to Iceberg and Delta tables: each table's snapshots (parent chain) or versions (delta-rs' history)
must be in job order too (20 of them in the ``chaos`` variant). The variant across Redis restarts is in
test_commit_order_restart.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis.asyncio

from shared.commit import read_manifest
from shared.events import DatasetExpectation, JobFinished, JobStarted, QueueEvent
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_checks import committed
from tests._support.fleet_jobs import good_job, stage_task
from tests._support.process_fleet import Fleet, report
from tests._support.routing import datasets_on
from tests._support.table_order import commits_started_by, jobs_sharing_bound_datasets, order_bindings
from tests._support.wait import wait_for

JOBS = [f"order{j:02d}" for j in range(30)]
DATASETS = [f"shared{i:02d}" for i in range(50)]


# A few of the datasets are bound to tables: their snapshots/versions must be in job order too.
BINDINGS = order_bindings(DATASETS, iceberg=3, delta=3)


async def _kill_each_owner(fleet: Fleet) -> None:
    """Kill each owner in turn while most commits are still queued; a fresh worker takes its place."""
    await wait_for(lambda: commits_started_by(fleet, "w1", 20), timeout=60, interval=0.01, what="w1 commits")
    fleet.names["w1"].kill()
    fleet.start("worker", "w3")
    await wait_for(lambda: commits_started_by(fleet, "w3", 20), timeout=90, interval=0.01, what="w3 commits")
    fleet.names["w2"].kill()
    fleet.start("worker", "w4")


async def test_each_datasets_commit_order_is_the_job_order_after_kills(fleet: Fleet) -> None:
    took = await jobs_sharing_bound_datasets(fleet, JOBS, DATASETS, BINDINGS, _kill_each_owner)
    report(f"{len(JOBS)} jobs x {len(DATASETS)} shared datasets (6 bound) committed in {took:.1f}s")


@pytest.mark.chaos
async def test_each_tables_order_is_the_job_order_after_kills_with_20_tables(fleet: Fleet) -> None:
    bindings = order_bindings(DATASETS, iceberg=10, delta=10)
    took = await jobs_sharing_bound_datasets(fleet, JOBS, DATASETS, bindings, _kill_each_owner)
    report(f"{len(JOBS)} jobs x {len(DATASETS)} shared datasets (20 bound) committed in {took:.1f}s")


async def test_a_later_job_waits_while_an_earlier_job_still_waits_for_a_task_of_the_dataset(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name)
    shared_ds, other = datasets_on(2, settings.fleet.shards, 2)  # one shard: one stream, one order
    async with inprocess_fleet(redis_client, settings) as fleet:
        first = await stage_task(fleet.store, "early", shared_ds, 0, 0)
        last = await stage_task(fleet.store, "early", shared_ds, 1, 0)
        early: list[QueueEvent] = [
            JobStarted(job="early", datasets=[shared_ds], timeout_s=600, started_at=time.time()),
            first,
            JobFinished(
                job="early", datasets={shared_ds: DatasetExpectation(tasks=2)}, finished_at=time.time()
            ),
        ]
        later = await good_job(fleet.store, "later", [shared_ds, other], tasks=1, duplicate_attempt=False)
        await fleet.publisher.publish_many([*early, *later])
        # "later" finished after "early" and is complete: its other dataset commits at once ...
        await wait_for(
            lambda: committed(fleet.store, [other], "later"), timeout=60, what="later's other dataset"
        )
        # ... but not the shared one, while "early" (finished first) waits for its last task.
        assert await read_manifest(fleet.store, shared_ds, "later") is None
        assert await read_manifest(fleet.store, shared_ds, "early") is None
        await fleet.publisher.publish_many([last])
        await wait_for(lambda: committed(fleet.store, [shared_ds], "later"), timeout=60, what="both commits")
        m_early = await read_manifest(fleet.store, shared_ds, "early")
        m_later = await read_manifest(fleet.store, shared_ds, "later")
        assert m_early is not None and m_later is not None
        assert m_early.epoch < m_later.epoch, "early's commit of the dataset came first"
