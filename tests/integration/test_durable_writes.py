"""Every write the fleet's guarantees rest on is followed by its ``WAIT`` / ``WAITAOF`` on its connection.

A fleet (coordinator and worker in this process) commits a job and aborts another against a master with
one replica, both started here, with ``redis.durability`` = ``replicas`` (the machine's Redis 7.0) and
``aof+replicas`` (Redis 8.2, master and replica with ``appendonly yes``). ``MONITOR`` on the master records
every command with the connection that sent it; then each durable write (a publish's ``XADD``, sync and
async; a save-and-ack script, with and without job results; an admin event and an outcome script with
its marker) must be followed on that connection by the level's wait, with nothing in between but more
writes of the same batch, the marker's one-byte ``SET`` and a pipelined read.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from shared.events import Aborted, Committed, JobFailed, JobStarted
from shared.queue import Keys, connect
from shared.spark._publishing import publish as spark_publish
from tests._support.fleet import fleet_settings, inprocess_fleet, producer_config
from tests._support.fleet_checks import admin_events, committed
from tests._support.fleet_jobs import good_job
from tests._support.redis_monitor import Command, CommandRecorder
from tests._support.redis_server import RedisServer, modern_redis_server, wait_replica_synced
from tests._support.wait import wait_for

Factory = Callable[..., RedisServer]
WAITS = {"WAIT", "WAITAOF"}
# What may stand between a durable write and its wait on one connection: the rest of its batch
# (more XADDs), the marker's one-byte SET, the read pipelined behind a save.
BETWEEN = {"XADD", "SET", "XREADGROUP"}


def kind(cmd: Command, keys: Keys) -> str | None:
    """Return which durable write ``cmd`` is, or None when it is none."""
    args = [a.decode(errors="replace") for a in cmd.args]
    if cmd.name == "XADD" and args[1].endswith(":events"):
        return "publish"
    if cmd.name == "XADD" and args[1] == keys.admin:
        return "admin event"
    if cmd.name in ("EVAL", "EVALSHA") and len(args) > 3:
        if args[3] == keys.admin:
            return "outcome"
        if args[3].endswith(":state:owner"):
            saved_keys = args[3 : 3 + int(args[2])]  # from the 7th on: the result hashes it writes
            return "save with results" if any(":result:" in k for k in saved_keys) else "save"
    return None


def unwaited(commands: list[Command], keys: Keys) -> tuple[list[str], Counter[str], list[Command]]:
    """Return the durable writes not followed by a wait on their connection, each kind's count, the waits."""
    by_client: dict[str, list[Command]] = defaultdict(list)
    for cmd in commands:
        if cmd.client != "lua":
            by_client[cmd.client].append(cmd)
    bad: list[str] = []
    kinds: Counter[str] = Counter()
    waits: list[Command] = []
    for client, cmds in by_client.items():
        for i, cmd in enumerate(cmds):
            if cmd.name in WAITS:
                waits.append(cmd)
            what = kind(cmd, keys)
            if what is None:
                continue
            kinds[what] += 1
            for later in cmds[i + 1 :]:
                if later.name in WAITS:
                    break
                if later.name not in BETWEEN and kind(later, keys) is None:
                    bad.append(f"{client}: {what} followed by {later.name} before any wait")
                    break
            else:
                bad.append(f"{client}: {what} never followed by a wait")
    return bad, kinds, waits


@pytest.mark.parametrize("level", ["replicas", "aof+replicas"])
async def test_every_durable_write_is_followed_by_its_wait_on_its_connection(
    redis_factory: Factory, fleet_name: str, tmp_path: Path, level: str
) -> None:
    modern = level != "replicas"
    binary = modern_redis_server() if modern else None  # "replicas": the machine's Redis (7.0)
    master = redis_factory(binary=binary, persistent=modern)
    replica = redis_factory(binary=binary, persistent=modern, replica_of=master)
    wait_replica_synced(master, replica)
    settings = fleet_settings(
        master.url, tmp_path / "store", fleet_name, shards=2, redis={"durability": level, "wait_timeout": 5.0}
    )
    keys = Keys(fleet_name)
    recorder = CommandRecorder(master.port)
    recorder.start()
    client = connect(settings.redis)
    try:
        async with inprocess_fleet(client, settings) as fleet:
            datasets = ["a", "b", "c"]
            await fleet.publisher.publish_many(await good_job(fleet.store, "job-1", datasets, tasks=2))
            # The Spark producer's blocking publisher, from the settings as a driver gets them.
            config = producer_config(settings, job_timeout=60)
            now = time.time()
            for ev in (
                JobStarted(job="job-2", datasets=["d"], timeout_s=60, started_at=now),
                JobFailed(job="job-2", datasets=["d"], reason="oom", failed_at=now),
            ):
                await asyncio.to_thread(spark_publish, config, ev)
            await wait_for(lambda: committed(fleet.store, datasets, "job-1"), timeout=90, what="commits")

            async def announced() -> bool:
                evs = await admin_events(client, fleet_name)
                done = sum(isinstance(e, Committed) for e in evs) == 3
                return done and any(isinstance(e, Aborted) and e.job == "job-2" for e in evs)

            await wait_for(announced, timeout=60, what="three commits and an abort announced")
    finally:
        await client.aclose()
        recorder.stop()
    bad, kinds, waits = unwaited(recorder.commands, keys)
    assert bad == [], bad
    # Every kind of durable write was seen (a save with results: a dataset's outcome for its driver).
    assert {"publish", "admin event", "outcome", "save", "save with results"} <= set(kinds), kinds
    assert kinds["outcome"] >= 4, kinds  # 3 committed + 1 aborted
    # The producer's connection waited too (its name is set when it connects).
    producer = {
        c.client
        for c in recorder.commands
        if c.name == "CLIENT" and b"commitfleet-producer" in b"".join(c.args)
    }
    assert producer and any(w.client in producer for w in waits), (producer, Counter(w.client for w in waits))
    expected = (b"WAIT", b"1", b"5000") if level == "replicas" else (b"WAITAOF", b"1", b"1", b"5000")
    assert {tuple(a.upper() if i == 0 else a for i, a in enumerate(w.args)) for w in waits} == {expected}
