"""``commitfleet status`` (its async body) prints the open work page by page: ``--all`` every pending
dataset across several pages, ``--json`` JSON Lines (summary first, a line per open job and dataset)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import redis.asyncio
from rich.console import Console

from coordinator.cli._status_run import show_status
from shared.queue import Keys, ensure_fleet, shard_of
from tests._support.fleet import fleet_settings
from workers import DatasetState, JobMeta
from workers._state_store import ShardStateStore

SHARDS = 4
DATASETS = 2500  # more than two pages of 1000


async def _open_work(r: redis.asyncio.Redis, keys: Keys) -> None:
    enc = msgspec.json.Encoder()
    async with r.pipeline(transaction=False) as pipe:
        for j in range(3):
            for s in range(SHARDS):
                meta = JobMeta(job=f"job-{j}", opened_at=1.0, deadline=2.0)
                pipe.hset(keys.shard_state(s, "jobs"), f"job-{j}", enc.encode(meta))
        for i in range(DATASETS):
            name = f"d[{i}]*"
            status = "waiting" if i % 2 else "open"  # half pending
            key = keys.shard_state(shard_of(name, SHARDS), "datasets")
            pipe.hset(key, f"job-{i % 3}/{name}", enc.encode(DatasetState(status=status)))
        await pipe.execute()
    for shard in range(SHARDS):  # an owner's load writes the shard's counts
        await r.set(keys.shard_state(shard, "owner"), b"w1@1")
        await ShardStateStore(r, keys, shard, b"w1@1").load()


async def test_status_all_and_json_print_every_page(
    redis_client: redis.asyncio.Redis, redis_url: str, fleet_name: str, tmp_path: Path
) -> None:
    s = fleet_settings(redis_url, tmp_path, fleet_name, shards=SHARDS)
    await ensure_fleet(redis_client, fleet_name, SHARDS)
    await _open_work(redis_client, Keys(fleet_name))

    text = io.StringIO()
    out = Console(file=text, width=200, force_terminal=False)
    await show_status(s, out, lambda b: None, top=None, as_json=False)
    rows = [ln.split()[0] for ln in text.getvalue().splitlines() if ln.strip().startswith("d[")]
    assert len(rows) == DATASETS // 2 and len(set(rows)) == DATASETS // 2, len(rows)
    assert "open jobs 3 " in text.getvalue()

    chunks: list[bytes] = []
    await show_status(s, out, chunks.append, top=None, as_json=True)
    assert len(chunks) > 3, "written as the pages come, not at once"
    lines = [json.loads(ln) for ln in b"".join(chunks).splitlines()]
    assert lines[0]["totals"]["open_jobs"] == 3 and lines[0]["totals"]["datasets"] == DATASETS
    assert sorted(ln["job"]["job"] for ln in lines if "job" in ln) == ["job-0", "job-1", "job-2"]
    names = [ln["dataset"]["dataset"] for ln in lines if "dataset" in ln]
    assert len(names) == DATASETS == len(set(names))

    text = io.StringIO()
    await show_status(s, Console(file=text, width=200), lambda b: None, top=5, as_json=False)
    assert f"... and {DATASETS // 2 - 5} more pending datasets" in text.getvalue(), text.getvalue()
