"""What a producer learns about its job's outcome: results, failures by name, ``commitfleet wait``.

An in-process fleet (a coordinator and one worker) on a real redis-server and
a local store; the driver's side is the real code without Spark
(``wait_for_outcome``, the job context's ``JobFinished`` path), and the CLI
runs as a real subprocess.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest
import redis.asyncio

from shared.events import (
    Aborted,
    DatasetExpectation,
    JobFailed,
    JobFinished,
    JobStarted,
    Quarantined,
    ValidationLimits,
    decode_entry,
)
from shared.queue import AsyncPublisher, ensure_fleet, shard_of
from shared.spark import JobNotCommitted
from shared.spark._job import JobContext
from shared.spark._outcome import wait_for_outcome
from tests._support.fleet import fleet_settings, inprocess_fleet, producer_config
from tests._support.fleet_checks import admin_events
from tests._support.fleet_jobs import corrupted_job, good_job, stage_task
from tests._support.processes import write_config
from tests._support.routing import datasets_on
from tests._support.wait import wait_for

SHARDS = 8


async def commitfleet(config: Path, *args: str) -> tuple[int, str, str]:
    """Run ``commitfleet ARGS`` as a subprocess with only ``--config``; return (rc, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMITFLEET_") and k != "REDIS_URL"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "coordinator",
        args[0],
        "--config",
        str(config),
        *args[1:],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_results_quarantine_by_name_and_the_wait_command(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(
        redis_url, tmp_path / "store", fleet_name, shards=SHARDS, queue={"trim_interval": 0.0}
    )
    config = write_config(settings, tmp_path / "fleet.toml")
    cfg = producer_config(settings, job_timeout=60.0)
    async with inprocess_fleet(redis_client, settings, ensure=False) as fleet:
        store = fleet.store
        await ensure_fleet(redis_client, fleet_name, SHARDS)
        pub = AsyncPublisher(redis_client, fleet_name, SHARDS)
        await pub.publish_many(await good_job(store, "fine", ["a", "b"], tasks=2))
        results = await asyncio.to_thread(wait_for_outcome, cfg, "fine", ["a", "b"], 30.0)
        assert {d: r.status for d, r in results.items()} == {"a": "committed", "b": "committed"}

        evs, _key, _right = await corrupted_job(store, "broken", "c")
        await pub.publish_many(evs)
        with pytest.raises(JobNotCommitted) as info:
            await asyncio.to_thread(wait_for_outcome, cfg, "broken", ["c"], 60.0)
        (quarantined,) = [
            e for e in await admin_events(redis_client, fleet_name) if isinstance(e, Quarantined)
        ]
        assert info.value.failed["c"].status == "quarantined"
        assert info.value.failed["c"].reason == quarantined.reason
        assert "c: quarantined (" in str(info.value)

        rc, out, _err = await commitfleet(config, "wait", "fine", "a", "b")
        assert rc == 0, out
        assert "a\tcommitted\ta/_commits/fine.json" in out
        rc, out, _err = await commitfleet(config, "wait", "broken", "c")
        assert rc == 1 and "c\tquarantined\t" in out
        # A name on a shard where the job is still open (it never started there): pending, then 124.
        fine_shards = {shard_of("a", SHARDS), shard_of("b", SHARDS)}
        elsewhere = next(f"x{i}" for i in range(100) if shard_of(f"x{i}", SHARDS) not in fine_shards)
        rc, out, _err = await commitfleet(config, "wait", "fine", "a", "b", elsewhere, "--timeout", "0.5")
        assert rc == 124 and f"{elsewhere}\tpending" in out
        # A name without a result on a shard where the job has ended: the answer will not come
        # (forgotten, or never a dataset of the job): unknown, exit 4 at once.
        beside = next(f"x{i}" for i in range(100) if shard_of(f"x{i}", SHARDS) == shard_of("a", SHARDS))
        rc, out, _err = await commitfleet(config, "wait", "fine", "a", beside, "--timeout", "600")
        assert rc == 4 and f"{beside}\tunknown" in out and "a\tcommitted" in out
        rc, _out, err = await commitfleet(config, "wait", "../x", "a")
        assert rc == 2 and "config error" in err
        rc, _out, _err = await commitfleet(config, "wait", "fine")  # no dataset: a usage error
        assert rc == 2


async def test_a_driver_finishing_a_job_the_fleet_already_ended_fails_loudly(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(
        redis_url, tmp_path / "store", fleet_name, shards=SHARDS, queue={"trim_interval": 0.0}
    )
    cfg = producer_config(settings, job_timeout=1.0)
    first, second = datasets_on(3, SHARDS, 2)
    other_shard = next(f"x{i}" for i in range(100) if shard_of(f"x{i}", SHARDS) != 3)
    async with inprocess_fleet(redis_client, settings, ensure=False) as fleet:
        store = fleet.store
        await ensure_fleet(redis_client, fleet_name, SHARDS)
        pub = AsyncPublisher(redis_client, fleet_name, SHARDS)
        # The driver announced a short timeout, staged output, then went silent (no heartbeat) on
        # one shard; the other shard's dataset was announced later (still open there).
        await pub.publish(
            JobStarted(job="late", datasets=[first, second], timeout_s=1.0, started_at=time.time())
        )
        await pub.publish(await stage_task(store, "late", first, 0, 0))

        async def ended() -> bool:
            got = [e for e in await admin_events(redis_client, fleet_name) if isinstance(e, Aborted)]
            return len(got) == 2

        await wait_for(ended, timeout=30, what="the fleet to time the job out")
        await pub.publish(
            JobStarted(job="late", datasets=[other_shard], timeout_s=600.0, started_at=time.time())
        )
        ctx = JobContext(None, "late", (first, second, other_shard), cfg)  # type: ignore[arg-type]
        ctx._expectations = {d: DatasetExpectation(tasks=1, winners=[0]) for d in ctx.datasets}
        with pytest.raises(JobNotCommitted) as info:
            ctx._end.publish_finished(ctx.expectations)
        text = str(info.value)
        assert f"{first}: aborted (timed out: no sign of life" in text
        assert f"{other_shard}: aborted (the fleet ended part of the job first)" in text
        # Nothing was published as finished; the dataset the fleet had not ended got JobFailed.
        limits = ValidationLimits()
        sent = [
            decode_entry(fields, limits=limits)
            for shard in range(SHARDS)
            for _id, fields in await redis_client.xrange(pub.keys.events(shard))
        ]
        assert not [e for e in sent if isinstance(e, JobFinished) and e.job == "late"]
        (failed,) = [e for e in sent if isinstance(e, JobFailed) and e.job == "late"]
        assert failed.datasets == [other_shard]
        assert "the fleet ended part of the job first" in failed.reason
