"""The crash matrix of Structured Streaming: a driver SIGKILLed at every crash point, restarted until done.

Marker ``streaming`` (``make streaming``), not in the default run: every run of
the driver pays for a JVM start (8-10 s here). Each test has its own
redis-server (``redis_factory``) and fleet (a coordinator and two worker
processes on a local-files store), so one may flush Redis under its fleet.
The driver (tests/_support/streaming.py) kills itself at the ``(point, batch)``
the test names, through ``commit_batches``' probe: the crash points are
deterministic, and so is every run's sequence of probe points, which the tests
assert in full. One test is one application: a sequence of runs from one
checkpoint, each killed at the next point, and a last one that consumes the
source. Measured on the 2-core dev machine with other Spark jobs running (load
6-10): the matrix (9 driver runs) 114-153 s, the Redis flush case (3 runs, two
fleet restarts) 51-58 s; each run 8-29 s, most of it the JVM's start.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from shared.events import Aborted, manifest_key
from shared.queue import ensure_fleet_sync, stream_run_key
from shared.storage import ObjectStore
from tests._support.cli import cli
from tests._support.processes import write_config
from tests._support.redis_server import RedisServer
from tests._support.spark_fleet import (  # noqa: F401 - the store and fleet fixtures
    SHARDS,
    WORKERS,
    E2EFleet,
    e2e_store,
    keys_under,
    run_e2e_fleet,
    settled_fleet,
)
from tests._support.streaming import (
    StreamApp,
    app_events,
    assert_exactly_once,
    batch_of,
    fleet_settled,
    no_open_work,
    write_source,
)
from tests._support.wait import wait_for

pytestmark = [pytest.mark.streaming, pytest.mark.spark]


@pytest.fixture
def private_redis(redis_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_factory()


@pytest.fixture
def e2e(private_redis: RedisServer, tmp_path: Path) -> Iterator[E2EFleet]:
    """A fleet of this test alone, on its own redis-server."""
    (tmp_path / "fleet").mkdir()
    with run_e2e_fleet(tmp_path / "fleet", private_redis.url, app="stream") as fleet:
        yield fleet


@pytest.fixture
async def r(e2e: E2EFleet) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(e2e.settings.redis.url)
    try:
        yield client
    finally:
        await client.aclose()


def new_app(fleet: E2EFleet, tmp_path: Path, files: int) -> StreamApp:
    tag = secrets.token_hex(3)
    return StreamApp(
        fleet,
        tmp_path / "app",
        f"app{tag}",
        write_source(tmp_path / "source", files),
        (f"all_{tag}", f"even_{tag}"),
        table=f"lake.s_{tag}",
    )


def committed(batch: int) -> list[tuple[str, int]]:
    """The probe points of a batch that commits."""
    return [("batch.start", batch), ("batch.staged", batch), ("batch.committed", batch)]


def skipped(batch: int) -> list[tuple[str, int]]:
    """The probe points of a batch the store's record already covers."""
    return [("batch.start", batch), ("batch.skipped", batch)]


# Each step: where the run is killed, and every probe point the run reaches (the last is the kill).
MATRIX: list[tuple[tuple[str, int] | None, list[tuple[str, int]]]] = [
    # mid-batch after staging, in the batch that creates the table
    (("batch.staged", 0), committed(0)[:2]),
    # before anything of batch 1 (the staged run of batch 0 is cancelled, batch 0 committed anew)
    (("batch.start", 1), [*committed(0), ("batch.start", 1)]),
    (("batch.staged", 2), [*committed(1), *committed(2)[:2]]),
    # after the fleet committed batch 3, before Spark's commit log: the next run replays it
    (("batch.committed", 3), [*committed(2), *committed(3)]),
    # in the skip path of that replay
    (("batch.skipped", 3), skipped(3)),
    # right after a skipped replay
    (("batch.start", 4), [*skipped(3), ("batch.start", 4)]),
    (("batch.committed", 5), [*committed(4), *committed(5)]),
    (("batch.skipped", 5), skipped(5)),
    (None, [*skipped(5), *committed(6), *committed(7)]),
]


@pytest.mark.timeout(900)
async def test_a_driver_killed_at_every_crash_point_commits_every_id_exactly_once(
    fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore, tmp_path: Path
) -> None:
    app = new_app(fleet, tmp_path, files=8)
    for kill_at, trace in MATRIX:
        run = await app.run(kill_at=kill_at)
        if kill_at is None:
            run.assert_completed()
        else:
            run.assert_killed_at(*kill_at)
        assert run.trace == trace, run.describe()
    runs = app.runs
    assert {run.query for run in runs} == {runs[0].query}, "one query, restarted from its checkpoint"
    # What the runs returned to Spark: a skipped batch names the manifests of the job that committed it.
    returned = [[(o.batch, o.skipped) for o in run.outcomes] for run in runs]
    assert returned == [
        [],
        [(0, False)],
        [(1, False)],
        [(2, False)],
        [],
        [(3, True)],
        [(4, False)],
        [],
        [
            (5, True),
            (6, False),
            (7, False),
        ],
    ], returned
    commits = await assert_exactly_once(app, store, r, query=runs[0].query)
    for run, batch in ((runs[-1], 5), (runs[5], 3)):
        replay = run.outcomes[0]
        assert replay.job is None and set(replay.results.values()) == {"committed"}, replay
        assert replay.manifests == {
            ds: manifest_key(ds, next(c.job for c in commits[ds] if c.batch == batch)) for ds in app.datasets
        }, replay

    # The runs killed after staging left a job open: the next run cancelled it, the fleet rolled
    # it back (both datasets), and nothing else of the app was ever aborted.
    aborted = [e for e in await app_events(r, fleet, app.app_id) if isinstance(e, Aborted)]
    by_job: dict[str, set[str]] = {}
    for e in aborted:
        by_job.setdefault(e.job, set()).add(e.dataset)
        assert e.reason.startswith("cancelled"), e
    assert sorted(batch_of(app.app_id, j) for j in by_job) == [0, 2], aborted
    assert all(ds == set(app.datasets) for ds in by_job.values()), aborted
    assert await keys_under(store, "_staging/") == [], "nothing staged is left"
    config = write_config(fleet.settings, tmp_path / "cli.toml")
    res = await cli("audit", fleet.settings.store.url, "--config", config)
    assert res.rc == 0 and "no violations" in res.out, res


async def flush_redis(fleet: E2EFleet, r: redis.asyncio.Redis, server: RedisServer, base: Path) -> None:
    """FLUSHALL the fleet's Redis under the running fleet: every stream, run record, result record and
    job state is gone; the workers re-create their groups and the fleet settles again. The fleet's meta
    record is written again as `commitfleet init` (or a producer configured with the shard count) would."""
    assert _flushall(server.url)
    client = redis.Redis.from_url(server.url)
    try:
        ensure_fleet_sync(client, fleet.settings.fleet.name, SHARDS)
    finally:
        client.close()
    await wait_for(lambda: fleet_settled(fleet, r), timeout=60, what="the fleet back after the flush")
    assert all(p.proc.poll() is None for p in fleet.procs), "a fleet process died of the flush"


@pytest.mark.timeout(900)
async def test_redis_flushed_between_a_crash_and_the_restart_the_store_alone_decides(
    fleet: E2EFleet,
    r: redis.asyncio.Redis,
    store: ObjectStore,
    tmp_path: Path,
    private_redis: RedisServer,
) -> None:
    app = new_app(fleet, tmp_path, files=4)
    # 1. Killed mid-batch (batch 1 staged), then Redis loses the run record and the job: the
    # restart finds the dead run by its staged files, cancels it, and commits batch 1 anew.
    first = await app.run(kill_at=("batch.staged", 1))
    assert first.trace == [*committed(0), *committed(1)[:2]], first.describe()
    dead = {k.split("/")[1] for k in await keys_under(store, "_staging/")}
    assert len(dead) == 1, dead
    dead_job = dead.pop()
    assert batch_of(app.app_id, dead_job) == 1, dead_job
    await flush_redis(fleet, r, private_redis, tmp_path / "fleet")
    second = await app.run(kill_at=("batch.committed", 2))
    assert second.trace == [*committed(1), *committed(2)], second.describe()

    async def dead_run_aborted() -> list[Aborted] | None:
        evs = [e for e in await app_events(r, fleet, app.app_id) if isinstance(e, Aborted)]
        return evs if {e.dataset for e in evs} == set(app.datasets) else None

    evs = await wait_for(dead_run_aborted, timeout=60, what="the dead run of batch 1 aborted")
    assert {e.job for e in evs} == {dead_job} and all(e.reason.startswith("cancelled") for e in evs), evs
    await wait_for(lambda: no_open_work(store, app), timeout=60, what="batch 2's commit finished")
    assert await r.exists(stream_run_key(fleet.keys, app.app_id)), "the app's last run, in Redis"

    # 2. Killed after the fleet committed batch 2, before Spark's commit log; Redis flushed again:
    # the replay of batch 2 is skipped on the store's record alone, batch 3 commits.
    await flush_redis(fleet, r, private_redis, tmp_path / "fleet")
    assert not await r.exists(stream_run_key(fleet.keys, app.app_id))
    third = await app.run()
    third.assert_completed()
    assert third.trace == [*skipped(2), *committed(3)], third.describe()
    assert [(o.batch, o.skipped) for o in third.outcomes] == [(2, True), (3, False)]
    assert {first.query, second.query, third.query} == {first.query}
    await assert_exactly_once(app, store, r, query=first.query, announced_from=3)
    assert await keys_under(store, "_staging/") == [], "nothing staged is left"


def _flushall(url: str) -> Any:
    client = redis.Redis.from_url(url)
    try:
        return client.flushall()
    finally:
        client.close()
