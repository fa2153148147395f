"""A real Spark job (local mode) under the producer's minimal Redis ACL; the fleet under the worker's.

A private redis-server (the machine's 7.0) with the rules of docs/queue.md "ACLs"
(tests/integration/test_acl.py holds them): the coordinator and the worker processes
connect as ``cf-worker``, the Spark driver and its executors (preflight, publishes,
heartbeat, the wait for the outcome) as ``cf-producer``. ``commit_job`` must return both
datasets committed, and Redis's ``ACL LOG`` must stay empty: nothing was denied to any of
them, on the driver or on an executor.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from shared import Secret
from shared.queue import Keys
from shared.spark import ProducerConfig, commit_job
from shared.storage import open_store
from tests._support.acl import PRODUCER, WORKER, rule
from tests._support.fleet import fleet_settings
from tests._support.processes import FleetProcess, fleet_processes, write_config
from tests._support.redis_server import RedisServer
from tests._support.spark import spark_session_fixture
from tests._support.wait import wait_for_sync

# Its own marker (make spark-acl): a minute of Spark on top of tests/integration/test_acl.py, which runs the
# fleet and both publishers under the same rules in the default run.
pytestmark = [pytest.mark.spark, pytest.mark.spark_acl]

spark = spark_session_fixture("test-spark-acl", master="local[2]")

SHARDS = 4


class AclFleet(msgspec.Struct):
    admin_port: int
    store_url: str
    producer: ProducerConfig
    procs: list[FleetProcess]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclFleet]:
    base = tmp_path_factory.mktemp("acl-fleet")
    server = RedisServer(base / "redis")
    server.start()
    try:
        name = "acl" + secrets.token_hex(4)
        admin = redis.Redis(port=server.port)
        try:
            for user, commands, channels in (("cf-worker", WORKER, True), ("cf-producer", PRODUCER, False)):
                args = rule(name, commands, channels=channels, modern=False)
                admin.execute_command("ACL", "SETUSER", user, "reset", f">{user}-pw", *args)
        finally:
            admin.close()
        url = f"redis://cf-worker:cf-worker-pw@127.0.0.1:{server.port}/0"
        (base / "store").mkdir()
        (base / "logs").mkdir()
        settings = fleet_settings(url, base / "store", name, shards=SHARDS)
        config = write_config(settings, base / "fleet.toml")
        producer = msgspec.structs.replace(
            ProducerConfig.from_settings(settings, job_timeout=120.0, app="acl"),
            redis_url=f"redis://cf-producer@127.0.0.1:{server.port}/0",
            redis_password=Secret("cf-producer-pw"),
            wait_timeout=120.0,
        )
        with fleet_processes(base / "logs") as procs:
            procs.append(FleetProcess("coordinator", "c1", config, base / "logs"))
            procs.append(FleetProcess("worker", "w1", config, base / "logs"))
            yield AclFleet(server.port, settings.store.url, producer, procs)
    finally:
        server.kill()


def acl_log(port: int) -> list[tuple[bytes, bytes]]:
    admin = redis.Redis(port=port)
    try:
        return [(e[b"username"], e[b"object"]) for e in admin.execute_command("ACL", "LOG")]
    finally:
        admin.close()


async def test_a_spark_job_commits_under_the_producers_acl(
    spark: Any, fleet: AclFleet, tmp_path: Path
) -> None:
    def fleet_up() -> bool:
        for p in fleet.procs:
            assert p.proc.poll() is None, f"{p.name} exited: {p.output()[-3000:]}"
        admin = redis.Redis(port=fleet.admin_port)
        try:
            return bool(admin.exists(Keys(fleet.producer.fleet).meta))
        finally:
            admin.close()

    wait_for_sync(fleet_up, timeout=60, what="the fleet")
    names = ["orders", "users"]
    with commit_job(spark, datasets=names, config=fleet.producer) as job:
        job.write_dataset(spark.range(0, 40, numPartitions=2), "orders")
        job.write_dataset(spark.range(0, 10, numPartitions=1), "users")
    assert {ds: r.status for ds, r in job.results.items()} == dict.fromkeys(names, "committed")
    async with open_store(fleet.store_url, fleet.producer.store) as store:
        for ds in names:
            assert [k async for k in store.list(f"{ds}/_commits/")], ds
    assert acl_log(fleet.admin_port) == []
    for p in fleet.procs:
        assert p.proc.poll() is None, f"{p.name} exited"
