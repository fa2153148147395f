"""End to end: real Structured Streaming queries committed through a real fleet (the fast cases).

The driver is a separate process (``tests/_support/streaming.py`` run as a
script: a local[2] session, a file source of JSON files read one file per
micro-batch, ``trigger(availableNow=True)``, ``foreachBatch`` given
``commit_batches``); the fleet is a coordinator and two worker processes on a
local-files store and the session's redis-server, started once for the module.
Every test has its own app id and datasets. In the default run: a clean run
(one driver start) and a batch whose ``write`` raises (two). Under the marker
``streaming`` (``make streaming``) with the crash matrix of
test_streaming_crashes.py: a restart without the checkpoint (three).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio

from shared.commit import audit, read_manifest, read_stream_records
from shared.events import Aborted, JobStarted, StreamBatch, StreamReset
from shared.queue import read_outcome
from shared.storage import ObjectStore
from tests._support.cli import cli
from tests._support.fleet_checks import admin_events
from tests._support.processes import write_config
from tests._support.redis_server import RedisHandle
from tests._support.spark_fleet import (  # noqa: F401 - the store and fleet fixtures
    SHARDS,
    E2EFleet,
    e2e_store,
    events_of,
    run_e2e_fleet,
    settled_fleet,
)
from tests._support.streaming import (
    StreamApp,
    app_events,
    assert_exactly_once,
    batch_of,
    evens,
    no_open_work,
    published_batches,
    table_ids,
    write_source,
)
from tests._support.wait import wait_for

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def e2e(redis_server: RedisHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EFleet]:
    with run_e2e_fleet(tmp_path_factory.mktemp("stream-fleet"), redis_server.url, app="stream") as fleet:
        yield fleet


@pytest.fixture
async def r(e2e: E2EFleet) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(e2e.settings.redis.url)
    try:
        yield client
    finally:
        await client.aclose()


def new_app(fleet: E2EFleet, tmp_path: Path, files: int, *, table: bool = False) -> StreamApp:
    tag = secrets.token_hex(3)
    app_id = f"app{tag}"
    return StreamApp(
        fleet,
        tmp_path,
        app_id,
        write_source(tmp_path / "source", files),
        (f"all_{tag}", f"even_{tag}"),
        table=f"lake.s_{tag}" if table else None,
    )


@pytest.mark.timeout(300)
async def test_a_clean_run_commits_each_batch_once_and_publishes_the_source_row_for_row(
    fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore, tmp_path: Path
) -> None:
    app = new_app(fleet, tmp_path, files=4, table=True)
    run = await app.run()
    run.assert_completed()
    assert [o.batch for o in run.outcomes] == [0, 1, 2, 3]
    assert not any(o.skipped for o in run.outcomes)
    assert all(set(o.results.values()) == {"committed"} for o in run.outcomes)
    commits = await assert_exactly_once(app, store, r, query=run.query)
    # Each batch's job told the fleet which batch of which query it commits.
    for c in commits[app.datasets[0]]:
        starts = [e for e in await events_of(r, fleet, c.job) if isinstance(e, JobStarted)]
        assert starts, c.job
        assert {e.stream for e in starts} == {StreamBatch(app_id=app.app_id, batch=c.batch, query=run.query)}


@pytest.mark.timeout(300)
async def test_a_batch_whose_write_raises_is_rolled_back_and_committed_once_on_the_restart(
    fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore, tmp_path: Path
) -> None:
    app = new_app(fleet, tmp_path, files=3, table=True)
    failed = await app.run(fail_at=1)
    assert failed.rc == 1, failed.describe()
    assert "InjectedBatchFailure: injected failure in batch 1" in failed.failure, failed.describe()
    # Batch 1 ran its write (no `batch.staged`: write raised) and went no further.
    assert failed.trace == [
        ("batch.start", 0),
        ("batch.staged", 0),
        ("batch.committed", 0),
        ("batch.start", 1),
    ], failed.describe()
    assert [o.batch for o in failed.outcomes] == [0]

    # The fleet rolls batch 1's job back: both datasets aborted (the raise came after the first
    # was written), nothing of it published, its staging deleted.
    async def aborted() -> list[Aborted] | None:
        evs = [e for e in await app_events(r, fleet, app.app_id) if isinstance(e, Aborted)]
        return evs if {e.dataset for e in evs} == set(app.datasets) else None

    evs = await wait_for(aborted, timeout=60, what="the failed batch's job aborted on both datasets")
    jobs = {e.job for e in evs}
    assert len(jobs) == 1, evs
    job = jobs.pop()
    assert batch_of(app.app_id, job) == 1, evs
    assert all(e.reason.startswith("failed:") and "injected failure in batch 1" in e.reason for e in evs)
    assert {e.dataset: e.files_deleted for e in evs}[app.datasets[0]] >= 1, "the first dataset was staged"
    outcome = await read_outcome(r, fleet.keys, SHARDS, job, app.datasets)
    assert {ds: res.status for ds, res in outcome.results.items()} == dict.fromkeys(app.datasets, "aborted")
    await wait_for(lambda: no_open_work(store, app), timeout=60, what="the failed batch's staging gone")
    for ds in app.datasets:
        assert await read_manifest(store, ds, job) is None
        assert [c.batch for c in await published_batches(store, ds, app.app_id)] == [0]
    assert table_ids(fleet.settings, app.table or "") == app.source.files[0], "the table has batch 0 only"

    # The restart from the same checkpoint replays batch 1 and commits it once, then batch 2.
    again = await app.run()
    again.assert_completed()
    assert again.query == failed.query
    assert [(o.batch, o.skipped) for o in again.outcomes] == [(1, False), (2, False)]
    commits = await assert_exactly_once(app, store, r, query=again.query)
    assert job not in {c.job for c in commits[app.datasets[0]]}


# Three driver runs (~30 s on a quiet 2-core machine, a minute under load): with the crash matrix.
@pytest.mark.streaming
@pytest.mark.timeout(300)
async def test_a_restart_without_the_checkpoint_is_refused_until_the_app_is_reset(
    fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore, tmp_path: Path
) -> None:
    app = new_app(fleet, tmp_path, files=2)
    first = await app.run()
    first.assert_completed()
    before = {ds: await published_batches(store, ds, app.app_id) for ds in app.datasets}
    assert [c.batch for c in before[app.datasets[0]]] == [0, 1]

    # A new checkpoint: a new query whose batch ids begin again at 0 under the same app id.
    app.forget_checkpoint()
    refused = await app.run()
    assert refused.rc == 1, refused.describe()
    assert refused.query != first.query
    assert "StreamConflict" in refused.failure, refused.describe()
    assert f"streaming app '{app.app_id}'" in refused.failure, refused.describe()
    assert f"commitfleet stream reset {app.app_id}" in refused.failure, refused.describe()
    assert refused.trace == [("batch.start", 0)] and refused.outcomes == [], refused.describe()
    await wait_for(lambda: no_open_work(store, app), timeout=60, what="nothing open or staged")
    for ds in app.datasets:
        assert await published_batches(store, ds, app.app_id) == before[ds], "nothing new published"
        record = (await read_stream_records(store, app.app_id, [ds]))[ds]
        assert (record.batch, record.query) == (1, first.query)

    # The operator forgets the old query's records (audited); the same restart then commits.
    config = write_config(fleet.settings, tmp_path / "cli.toml")
    res = await cli("stream", "reset", app.app_id, "--yes", "--config", config)
    assert res.rc == 0, res
    assert await read_stream_records(store, app.app_id, app.datasets) == {}
    resets = [
        e
        for e in await admin_events(r, fleet.settings.fleet.name)
        if isinstance(e, StreamReset) and e.app_id == app.app_id
    ]
    assert [e.datasets for e in resets] == [dict.fromkeys(app.datasets, 1)]

    again = await app.run()
    again.assert_completed()
    assert again.query == refused.query, "the same new checkpoint"
    assert [(o.batch, o.skipped) for o in again.outcomes] == [(0, False), (1, False)]
    # Each query's batches committed once: the old query's output stays, the new one's is the source again.
    new_jobs = {o.job for o in again.outcomes}
    for ds, keep in zip(app.datasets, (list, evens), strict=True):
        commits = await published_batches(store, ds, app.app_id)
        assert [c for c in commits if c.job not in new_jobs] == before[ds]
        new = [c for c in commits if c.job in new_jobs]
        assert [c.batch for c in new] == [0, 1]
        assert sorted(i for c in new for i in c.ids) == keep(app.source.ids)
        record = (await read_stream_records(store, app.app_id, [ds]))[ds]
        assert (record.batch, record.query, record.job) == (1, again.query, new[-1].job)
    report = await audit(store, ended_jobs=new_jobs)
    assert report.ok, report.violations
