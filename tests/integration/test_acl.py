"""The minimal Redis ACLs of a worker, a coordinator and a producer, tested against real servers.

docs/queue.md ("ACLs") gives these rules; :func:`test_the_docs_give_the_tested_rules` checks
that it gives exactly these (for a fleet named ``prod``). Each role's user may run only the
commands listed (scripts' own commands included: Redis checks a script's ``redis.call``
against the caller's ACL) on the fleet's keys ``~cf:<fleet>:*``; a worker also publishes and
subscribes the fleet's lock-release channels ``&cf:<fleet>:*``. The coordinator is given the
worker's rule (its own user). Nothing here needs ``CONFIG``, ``KEYS`` or ``SCAN``.

On the machine's Redis 7.0 (``durability = "replicas"``, a replica started here) and on Redis
8.2 (``"aof+replicas"``, both nodes with ``appendonly yes``; :func:`modern_redis_server`): a
coordinator and a worker (in this process, each with its own client and user) commit a job a
producer publishes through the Spark side's own calls (the executors' and the driver's
publisher, the shard count read from the fleet record, the driver's heartbeat, its wait for
the outcome, a streaming app's run record), and Redis's ``ACL LOG`` stays empty: no command
was denied, a lock-release notice included (a refused ``PUBLISH`` / ``SUBSCRIBE`` is only
logged by the worker). Then each role loses one command and the error is seen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import redis

from coordinator import Coordinator
from shared import ConfigError
from shared.events import JobStarted
from shared.queue import Keys, StreamRun, SyncPublisher, read_stream_run_sync, write_stream_run_sync
from shared.spark import ProducerConfig, wait_for_outcome
from shared.spark._outcome import Heartbeat
from shared.spark._publishing import publish, publisher_for, resolve_shards
from shared.storage import open_store
from tests._support.acl import MODERN, PRODUCER, WORKER, rule, setuser_line
from tests._support.fleet import fleet_settings
from tests._support.fleet_jobs import good_job
from tests._support.redis_server import RedisServer, modern_redis_server, wait_replica_synced
from tests._support.wait import wait_for_sync
from workers import Worker

Factory = Callable[..., RedisServer]


def set_user(admin: redis.Redis, user: str, args: list[str]) -> None:
    """``ACL SETUSER`` as docs/queue.md writes it (:func:`setuser_line`), with the user's password."""
    admin.execute_command("ACL", "SETUSER", user, "reset", f">{user}-pw", *args)


def acl_log(admin: redis.Redis) -> list[dict[str, object]]:
    return list(admin.execute_command("ACL", "LOG"))


def url(server: RedisServer, user: str) -> str:
    return f"redis://{user}:{user}-pw@127.0.0.1:{server.port}/0"


def servers(redis_factory: Factory, version: str) -> RedisServer:
    """Start a master and a replica (Redis 8.2 with appendonly yes for "8.2"); return the master."""
    modern = version == "8.2"
    binary = modern_redis_server() if modern else None
    master = redis_factory(persistent=modern, binary=binary)
    replica = redis_factory(persistent=modern, binary=binary, replica_of=master)
    wait_replica_synced(master, replica)
    return master


LEVEL = {"7.0": "replicas", "8.2": "aof+replicas"}


@pytest.mark.parametrize("version", ["7.0", "8.2"])
async def test_a_fleet_and_a_producer_commit_under_their_minimal_acls(
    redis_factory: Factory, fleet_name: str, tmp_path: Path, version: str
) -> None:
    master = servers(redis_factory, version)
    aof = version == "8.2"
    admin = redis.Redis(port=master.port)
    try:
        if not aof:
            for name in MODERN:
                with pytest.raises(redis.ResponseError, match=name.lstrip("+").replace("|", ".")):
                    set_user(admin, "worker", rule(fleet_name, [*WORKER, name], channels=True, modern=False))
        set_user(admin, "worker", rule(fleet_name, WORKER, channels=True, modern=aof))
        set_user(admin, "coordinator", rule(fleet_name, WORKER, channels=True, modern=aof))
        set_user(admin, "producer", rule(fleet_name, PRODUCER, channels=False, modern=aof))
        admin.execute_command("ACL", "LOG", "RESET")
        redis_settings = {"durability": LEVEL[version], "wait_timeout": 3.0}
        store_root = tmp_path / "store"

        def settings(user: str):  # type: ignore[no-untyped-def]
            return fleet_settings(url(master, user), store_root, fleet_name, shards=4, redis=redis_settings)

        producer = msgspec.structs.replace(
            ProducerConfig.from_settings(settings("producer"), job_timeout=60), shards=None
        )
        datasets = ["orders", "users", "events"]
        worker_settings = settings("worker")
        async with open_store(worker_settings.store.url, worker_settings.store) as store:
            evs = await good_job(store, "j1", datasets, tasks=2)
            coordinator = Coordinator(settings("coordinator"), coordinator_id="c1")
            worker = Worker(worker_settings, worker_id="w1")
            async with asyncio.TaskGroup() as tg:
                tg.create_task(coordinator.run())
                tg.create_task(worker.run())
                meta = Keys(fleet_name).meta
                await asyncio.to_thread(
                    wait_for_sync, lambda: admin.exists(meta), timeout=30, what="the fleet"
                )
                try:
                    results = await asyncio.to_thread(run_producer, producer, evs, datasets)
                finally:
                    worker.shutdown()
                    coordinator.shutdown()
        assert {ds: r.status for ds, r in results.items()} == dict.fromkeys(datasets, "committed")
        # Nothing was denied to any role (a refused lock-release PUBLISH / SUBSCRIBE is only logged
        # by the worker: this is where it would show).
        denied = [(e[b"username"], e[b"object"], e[b"context"]) for e in acl_log(admin)]
        assert denied == [], denied
        users = {u.decode() for u in admin.execute_command("ACL", "USERS")}
        assert {"worker", "coordinator", "producer"} <= users
    finally:
        admin.close()


def run_producer(config: ProducerConfig, evs: list[object], datasets: list[str]) -> dict[str, object]:
    """The Redis calls of a Spark job's driver and executors, as they make them; return the results."""
    try:
        config = resolve_shards(config)  # the driver: the fleet's shard count from its record
        publish(config, evs[0])  # type: ignore[arg-type] - JobStarted, then the driver's heartbeat
        beat = Heartbeat(config, "j1", datasets)
        beat.start()
        try:
            for ev in evs[1:]:
                publish(config, ev)  # type: ignore[arg-type] - the executors' TaskFinished, JobFinished
            results = wait_for_outcome(config, "j1", datasets, 120)
        finally:
            beat.stop()
        assert beat.beats >= 1 and beat.failures == 0
        pub = publisher_for(config)  # a streaming app's run record, as its driver reads and writes it
        run = StreamRun(job="j1", batch=0, query="q", state="done", datasets=datasets, at=time.time())
        write_stream_run_sync(pub.redis, Keys(config.fleet), "app", run)
        assert read_stream_run_sync(pub.redis, Keys(config.fleet), "app") == run
        return dict(results)
    finally:
        SyncPublisher.close_cached()


def without(commands: list[str], command: str) -> list[str]:
    assert command in commands
    return [c for c in commands if c != command]


def test_a_producer_without_xadd_is_refused_with_one_line(redis_factory: Factory, fleet_name: str) -> None:
    master = servers(redis_factory, "7.0")
    admin = redis.Redis(port=master.port)
    try:
        set_user(
            admin, "producer", rule(fleet_name, without(PRODUCER, "+xadd"), channels=False, modern=False)
        )
        config = ProducerConfig(
            redis_url=url(master, "producer"), store_url="file:///x", fleet=fleet_name, shards=4
        )
        ev = JobStarted(job="j1", datasets=["orders"], timeout_s=60, started_at=time.time())
        started = time.monotonic()
        try:
            with pytest.raises(ConfigError, match=r"redis ACL denies XADD: .*xadd") as err:
                publish(config, ev)
        finally:
            SyncPublisher.close_cached()
        assert "\n" not in str(err.value) and "producer-pw" not in str(err.value)
        assert time.monotonic() - started < 5, "a denied command is not retried"
        [entry] = acl_log(admin)
        assert entry[b"object"] == b"xadd" and entry[b"username"] == b"producer", entry
    finally:
        admin.close()


async def test_a_worker_without_wait_stops_at_start_with_one_line(
    redis_factory: Factory, fleet_name: str, tmp_path: Path
) -> None:
    master = servers(redis_factory, "7.0")
    admin = redis.Redis(port=master.port)
    try:
        set_user(admin, "worker", rule(fleet_name, without(WORKER, "+wait"), channels=True, modern=False))
        settings = fleet_settings(
            url(master, "worker"), tmp_path / "store", fleet_name, shards=4, redis={"durability": "replicas"}
        )
        with pytest.raises(ConfigError, match="needs WAIT, which the redis ACL denies this user"):
            await asyncio.wait_for(Worker(settings, worker_id="w1").run(), 30)
        # Once the check has failed it asks CONFIG GET, to say why if it may (here it may not: ignored).
        denied = {(e[b"username"], e[b"object"]) for e in acl_log(admin)}
        assert denied == {(b"worker", b"wait"), (b"worker", b"config|get")}, denied
    finally:
        admin.close()


async def test_a_worker_without_xreadgroup_reads_nothing_and_says_why(
    redis_factory: Factory, fleet_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A command denied inside a shard's work is a ConfigError of that shard: logged, the shard started
    again later (workers/_runners.py), the worker itself stays up; nothing is read."""
    master = servers(redis_factory, "7.0")
    admin = redis.Redis(port=master.port)
    try:
        set_user(
            admin, "worker", rule(fleet_name, without(WORKER, "+xreadgroup"), channels=True, modern=False)
        )
        set_user(admin, "coordinator", rule(fleet_name, WORKER, channels=True, modern=False))

        def settings(user: str):  # type: ignore[no-untyped-def]
            return fleet_settings(url(master, user), tmp_path / "store", fleet_name, shards=4)

        coordinator = Coordinator(settings("coordinator"), coordinator_id="c1")
        worker = Worker(settings("worker"), worker_id="w1")

        def denied() -> bool:
            return any(
                "redis ACL denies XREADGROUP" in r.getMessage() + str(r.exc_info) for r in caplog.records
            )

        async with asyncio.TaskGroup() as tg:
            tg.create_task(coordinator.run())
            tg.create_task(worker.run())
            try:
                await asyncio.to_thread(wait_for_sync, denied, timeout=30, what="the denial logged")
            finally:
                worker.shutdown()
                coordinator.shutdown()
        assert {(e[b"username"], e[b"object"]) for e in acl_log(admin)} == {(b"worker", b"xreadgroup")}
    finally:
        admin.close()


def test_the_docs_give_the_tested_rules() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "queue.md").read_text()
    lines = docs.splitlines()
    assert setuser_line("cf-worker", rule("prod", WORKER, channels=True, modern=False)) in lines
    assert setuser_line("cf-producer", rule("prod", PRODUCER, channels=False, modern=False)) in lines
    assert f"add `{' '.join(MODERN)}` to each" in docs
