"""The scale bench's state builder (tests/_support/scale_fleet.py) builds what it says, with real processes.

A bench: building the quick state (5,000 open datasets x 10 task reports through a coordinator and 4 worker
processes) takes 25-35 s on a loaded 2-core machine, past what the default run admits for one test.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import redis.asyncio

from tests._support.scale_fleet import QUICK_DATASETS, ScaleSpec, open_datasets, open_fleet, unread_events

pytestmark = [pytest.mark.bench, pytest.mark.timeout(600)]


async def test_the_quick_state_is_every_dataset_open_and_every_task_taken_in(tmp_path: Path) -> None:
    spec = ScaleSpec(datasets=QUICK_DATASETS, tasks=10, jobs=100, workers=4, shards=64)
    async with open_fleet(tmp_path, spec, build_timeout=300) as fleet:
        r = redis.asyncio.Redis.from_url(fleet.redis_url)
        try:
            keys = fleet.keys
            assert await open_datasets(r, keys, spec.shards) == QUICK_DATASETS
            assert await unread_events(r, keys, spec.shards) == 0
            fields: set[bytes | str] = set()
            attempts = jobs = 0
            for s in range(spec.shards):
                fields |= set(await r.hkeys(keys.shard_state(s, "datasets")))
                attempts += await r.hlen(keys.shard_state(s, "attempts"))
                jobs += await r.hlen(keys.shard_state(s, "jobs"))
                assert not await r.exists(keys.shard_state(s, "ended")), "no job ended"
        finally:
            await r.aclose()
        expected: set[bytes | str] = {
            f"{job}/{ds}".encode() for j, job in enumerate(spec.job_names()) for ds in spec.datasets_of(j)
        }
        assert fields == expected
        assert attempts == QUICK_DATASETS * spec.tasks  # every task report saved
        assert spec.jobs <= jobs <= spec.jobs * spec.shards  # each job open on the shards of its datasets
        staged = list((tmp_path / "store" / "_staging").glob("*/*/*/part-0.bin"))
        assert len(staged) == QUICK_DATASETS * spec.tasks
        # The coordinator serves the state it is measured on.
        with urllib.request.urlopen(f"http://127.0.0.1:{fleet.http_port}/status", timeout=60) as resp:
            doc = json.loads(resp.read())
        assert resp.status == 200
        assert doc["fleet"] == fleet.settings.fleet.name
        assert fleet.idle_rss_mb > 0
        assert fleet.coordinator.proc.poll() is None
        assert all(w.proc.poll() is None for w in fleet.workers)
