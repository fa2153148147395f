"""Every command a fleet run sends touches one cluster slot (recorded with MONITOR on one node).

A single node accepts cross-slot transactions, MGETs and scripts that a
cluster refuses (CROSSSLOT), so this test records everything a whole fleet
run sends to a plain redis-server: a coordinator and two workers (one leaves
mid-run: a handoff), the async and sync publishers, a good job with
duplicate deliveries, a failed and a cancelled job, the Spark driver's
liveness beats and outcome reads, and the status command. Then it asks the
server which arguments are keys and checks their slots.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import redis
import redis.asyncio

from coordinator.admin import OpenWorkFilter, get_status, open_jobs_page, open_work_page
from shared.events import Aborted, Committed, JobCancelled, JobStarted, QueueEvent
from shared.queue import (
    AsyncPublisher,
    Keys,
    SyncPublisher,
    beat_sync,
    connect,
    ensure_fleet,
    read_outcome_sync,
)
from shared.storage import ObjectStore
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_checks import admin_events, committed
from tests._support.fleet_jobs import failed_job, good_job, stage_task
from tests._support.redis_monitor import CommandRecorder, command_keys, cross_slot_violations, parse_line
from tests._support.redis_server import RedisServer
from tests._support.wait import wait_for
from workers import Worker


async def _run(client: redis.asyncio.Redis, store: ObjectStore, url: str, fleet: str, leaver: Worker) -> None:
    """Publish the jobs (async and sync), let ``leaver`` go mid-run, wait for every outcome."""
    shards = 8
    datasets = [f"ds{i}" for i in range(12)]
    pub = AsyncPublisher(client, fleet, shards)
    await pub.publish_many(await good_job(store, "good", datasets[:8], tasks=3))
    await pub.publish_many(await failed_job(store, "bad", datasets[8:10], tasks=2))
    gone = datasets[10:]
    cancel: list[QueueEvent] = [JobStarted(job="gone", datasets=gone, timeout_s=600, started_at=time.time())]
    cancel += [await stage_task(store, "gone", ds, 0, 0) for ds in gone]
    cancel.append(JobCancelled(job="gone", datasets=gone, reason="user", cancelled_at=time.time()))
    await pub.publish_many(cancel)
    await wait_for(lambda: committed(store, datasets[:4], "good"), timeout=30, what="first commits")
    leaver.shutdown()  # a worker leaves mid-run: its shards move to the other
    # The Spark driver's side: a sync publisher, liveness beats, outcome reads.
    sync_pub = SyncPublisher(redis.Redis.from_url(url), fleet, shards)
    keys = Keys(fleet)
    sync_events = await good_job(store, "sync", ["s0", "s1"], 2)
    try:
        await asyncio.to_thread(sync_pub.publish_many, sync_events)
        await asyncio.to_thread(beat_sync, sync_pub.redis, keys, range(shards), "sync", 30.0, time.time())
        await asyncio.to_thread(read_outcome_sync, sync_pub.redis, keys, shards, "sync", ["s0", "s1"])
    finally:
        sync_pub.close()
    await wait_for(lambda: committed(store, datasets[:8], "good"), timeout=60, what="commits")
    await wait_for(lambda: committed(store, ["s0", "s1"], "sync"), timeout=60, what="sync commits")

    async def all_events() -> bool:
        evs = await admin_events(client, fleet)
        done = Counter(type(e).__name__ for e in evs if isinstance(e, (Committed, Aborted)))
        return done == Counter({"Committed": 10, "Aborted": 4})

    await wait_for(all_events, timeout=60, what="10 committed + 4 aborted events")


async def test_a_fleet_run_never_sends_a_cross_slot_command(
    redis_factory: type[RedisServer], fleet_name: str, tmp_path: Path
) -> None:
    server = redis_factory()
    recorder = CommandRecorder(server.port)
    recorder.start()
    settings = fleet_settings(server.url, tmp_path / "store", fleet_name, shards=8)
    client = connect(settings.redis)
    try:
        async with inprocess_fleet(client, settings, workers=("w1", "w2"), ensure=False) as fleet:
            await ensure_fleet(client, fleet_name, settings.fleet.shards)
            await _run(client, fleet.store, server.url, fleet_name, fleet.workers[1])
            assert await get_status(settings)
            # The open work's pages (GET /status/datasets, /status/jobs): HSCAN, HGET, pipelined HEXISTS.
            keys = Keys(fleet_name)
            await open_work_page(client, keys, settings, OpenWorkFilter(), None, 10)
            await open_work_page(client, keys, settings, OpenWorkFilter(job="j-x", dataset="d"), None, 10)
            await open_jobs_page(client, keys, settings, None, 10)
    finally:
        await client.aclose()
        recorder.stop()
    names = Counter(c.name for c in recorder.commands)
    # The run did exercise every kind of multi-key operation the code has.
    # (No MULTI/WATCH left: every multi-key write is a script, MGET the one multi-key read.)
    for kind in ("MGET", "EVALSHA", "EVAL", "XADD", "XREADGROUP", "HSET"):
        assert names[kind] > 0, f"no {kind} recorded: {names.most_common(30)}"
    with redis.Redis.from_url(server.url) as r:
        keys_of = command_keys(r, recorder.commands)
    bad = cross_slot_violations(recorder.commands, keys_of)
    assert not bad, "\n".join(bad[:30])


def test_the_checker_finds_each_kind_of_cross_slot_use() -> None:
    a, b = b"cf:f:{s1}:events", b"cf:f:{s2}:events"
    cmds = [
        parse_line('1.0 [0 127.0.0.1:1] "MGET" "x" "y"'),
        parse_line('1.0 [0 127.0.0.1:2] "WATCH" "cf:f:{s1}:events"'),
        parse_line('1.0 [0 127.0.0.1:3] "GET" "cf:f:{s2}:events"'),  # another client: not in the txn
        parse_line('1.0 [0 127.0.0.1:2] "MULTI"'),
        parse_line('1.0 [0 127.0.0.1:2] "XACK" "cf:f:{s2}:events" "g" "1-1"'),
        parse_line('1.0 [0 127.0.0.1:2] "EXEC"'),
        parse_line('1.0 [0 127.0.0.1:4] "EVALSHA" "abc" "1" "cf:f:{s1}:events"'),
        parse_line('1.0 [0 lua] "XLEN" "cf:f:{s2}:events"'),
    ]
    commands = [c for c in cmds if c is not None]
    assert len(commands) == len(cmds)
    keys = {
        (b"MGET", b"x", b"y"): (b"x", b"y"),
        (b"WATCH", a): (a,),
        (b"GET", b): (b,),
        (b"MULTI",): (),
        (b"XACK", b, b"g", b"1-1"): (b,),
        (b"EXEC",): (),
        (b"EVALSHA", b"abc", b"1", a): (a,),
        (b"XLEN", b): (b,),
    }
    bad = cross_slot_violations(commands, keys)
    assert len(bad) == 3, bad
    assert "MGET" in bad[0] and "transaction" in bad[1] and "lua call XLEN" in bad[2]
