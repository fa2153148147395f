"""A streaming job's commit on every store: the record of the last batch is written with the data,
a batch it covers is refused under the lock (after a dead run's log is rolled forward), and the
operator's reset. Every check reads the real store back."""

from __future__ import annotations

import msgspec

from shared.commit import (
    CommitStep,
    CommitStepFailed,
    StepContext,
    StepRegistry,
    audit,
    commit_dataset,
    read_manifest,
    read_stream_records,
    read_watermarks_doc,
    reset_stream,
    skip_quarantined,
)
from shared.events import StreamBatch, staging_prefix
from shared.storage import ObjectStore
from tests._support.commit import ManualLease, StagedJob, fast_settings, keys, stage_job
from tests._support.emulators import StoreTarget
from tests._support.fault_store import FaultStore, expect_crash

SETTINGS = fast_settings()
Q1, Q2 = "3f0c7a52-1f6e-4d0b-9a57-5b1a0c2e7d11", "8a6d2b90-55e1-4c3f-b2a4-0e9f7c1d3b22"


async def stage(
    store: ObjectStore, dataset: str, job: str, batch: int, query: str = Q1, seed: int = 0
) -> StagedJob:
    staged = await stage_job(store, dataset, job, seed=seed)
    req = msgspec.structs.replace(staged.req, stream=StreamBatch(app_id="ingest", batch=batch, query=query))
    return StagedJob(req=req, winners=staged.winners, losers=staged.losers)


async def published_jobs(store: ObjectStore, dataset: str) -> set[str]:
    """The jobs whose files are published in ``dataset`` (from the published keys' names)."""
    return {
        k.rsplit("/", 1)[1].split("~", 1)[0]
        for k in await keys(store, f"{dataset}/")
        if "/_commits/" not in k
    }


async def test_the_record_is_written_with_the_data_and_a_covered_batch_is_refused(
    any_store: ObjectStore,
) -> None:
    a = await stage(any_store, "events", "ingest-b1-aaaaaaaa", 1)
    res = await commit_dataset(any_store, a.req, ManualLease("events", 1), SETTINGS)
    assert res.ok
    doc = await read_watermarks_doc(any_store, "events")
    assert doc is not None and doc.values == {"p0": 100, "p1": 200}
    rec = doc.streams["ingest"]
    assert (rec.batch, rec.query, rec.job) == (1, Q1, "ingest-b1-aaaaaaaa")

    # A rerun of batch 1 (its driver did not see the commit): refused, its staged files deleted.
    b = await stage(any_store, "events", "ingest-b1-bbbbbbbb", 1, seed=1)
    refused = await commit_dataset(any_store, b.req, ManualLease("events", 2), SETTINGS)
    assert refused.status == "refused" and not refused.ok
    assert refused.refused is not None and "already committed" in refused.refused
    assert refused.files_deleted == len(b.winners) + len(b.losers)
    assert await keys(any_store, staging_prefix(b.req.job, "events")) == []
    assert await read_manifest(any_store, "events", b.req.job) is None
    assert await published_jobs(any_store, "events") == {a.req.job}

    # The next batch commits; the record moves forward.
    c = await stage(any_store, "events", "ingest-b2-cccccccc", 2, seed=2)
    assert (await commit_dataset(any_store, c.req, ManualLease("events", 3), SETTINGS)).ok
    assert (await read_stream_records(any_store, "ingest"))["events"].batch == 2
    assert (await audit(any_store)).ok


async def test_a_restarted_query_is_refused_until_the_operator_resets_the_app(any_store: ObjectStore) -> None:
    a = await stage(any_store, "events", "ingest-b4-aaaaaaaa", 4)
    assert (await commit_dataset(any_store, a.req, ManualLease("events", 1), SETTINGS)).ok
    b = await stage(any_store, "events", "ingest-b0-bbbbbbbb", 0, query=Q2, seed=1)
    refused = await commit_dataset(any_store, b.req, ManualLease("events", 2), SETTINGS)
    assert refused.status == "refused"
    assert refused.refused is not None and "commitfleet stream reset ingest" in refused.refused

    removed = await reset_stream(any_store, "events", "ingest")
    assert removed is not None and removed.batch == 4
    assert await reset_stream(any_store, "events", "ingest") is None
    doc = await read_watermarks_doc(any_store, "events")
    assert doc is not None and doc.streams == {} and doc.values == {"p0": 100, "p1": 200}

    c = await stage(any_store, "events", "ingest-b0-cccccccc", 0, query=Q2, seed=2)
    assert (await commit_dataset(any_store, c.req, ManualLease("events", 3), SETTINGS)).ok
    rec = (await read_stream_records(any_store, "ingest", ["events"]))["events"]
    assert (rec.batch, rec.query) == (0, Q2)
    assert await published_jobs(any_store, "events") == {a.req.job, c.req.job}


def _points(n: int, backend: str) -> list[int]:
    return list(range(1, n + 1)) if backend == "local" else sorted({1, n // 2, n - 1, n})


async def test_a_dead_runs_half_done_commit_is_finished_first_and_the_rerun_refused(
    any_store: ObjectStore, store_target: StoreTarget
) -> None:
    """Redis lost the dead run (flushed): the rerun's commit rolls its log forward, then is refused.

    Crash the first run's commit at every store mutation; the rerun (a new job, the same batch) then
    commits the dataset: exactly one of the two jobs is published, the record names it, and audit is clean.
    """
    probe = await stage(any_store, "probe", "ingest-b0-00000000", 0)
    counting = FaultStore(any_store)
    assert (await commit_dataset(counting, probe.req, ManualLease("probe", 1), SETTINGS)).ok
    n = len(counting.calls)
    assert n >= 12
    seen: set[str] = set()
    for k in _points(n, store_target.backend):
        ds = f"ev{k}"
        dead = await stage(any_store, ds, f"ingest-b7-{k:08x}", 7, seed=k)
        await expect_crash(
            commit_dataset(FaultStore(any_store, crash_at=k), dead.req, ManualLease(ds, 1), SETTINGS)
        )
        rerun = await stage(any_store, ds, f"ingest-b7-{k + 0x10000000:08x}", 7, seed=k + 1000)
        res = await commit_dataset(any_store, rerun.req, ManualLease(ds, 2), SETTINGS)
        seen.add(res.status)
        winner = (await read_stream_records(any_store, "ingest", [ds]))[ds].job
        if res.ok:
            assert winner == rerun.req.job and res.recovered_jobs == []
            # The dead run had not written its log: it is never committed (its staging stays for its abort).
            assert await read_manifest(any_store, ds, dead.req.job) is None
        else:
            assert res.status == "refused" and winner == dead.req.job, (k, res)
            assert await keys(any_store, staging_prefix(rerun.req.job, ds)) == []
        assert await published_jobs(any_store, ds) == {winner}, k
        assert await read_manifest(any_store, ds, winner) is not None
    assert seen == {"committed", "refused"}  # both sides of the log's creation were crashed at


async def test_plain_commits_keep_no_stream_record(any_store: ObjectStore) -> None:
    a = await stage_job(any_store, "plain", "job-1")
    assert (await commit_dataset(any_store, a.req, ManualLease("plain", 1), SETTINGS)).ok
    doc = await read_watermarks_doc(any_store, "plain")
    assert doc is not None and doc.streams == {}
    assert await read_stream_records(any_store, "ingest") == {}


class FailsAfterTheRecord(CommitStep, frozen=True, kw_only=True, tag="test-fails-after-the-record"):
    """An apply step after the watermarks step that can never succeed: the commit is quarantined."""

    async def is_done(self, ctx: StepContext) -> bool:
        return False

    async def execute(self, ctx: StepContext) -> None:
        raise CommitStepFailed("the table refuses this batch (test)")


async def test_an_operators_skip_puts_the_record_back_so_the_rerun_commits(any_store: ObjectStore) -> None:
    registry = StepRegistry([FailsAfterTheRecord])
    first = await stage(any_store, "events", "ingest-b3-aaaaaaaa", 3)
    assert (await commit_dataset(any_store, first.req, ManualLease("events", 1), SETTINGS)).ok
    bad = await stage(any_store, "events", "ingest-b4-bbbbbbbb", 4, seed=1)
    bad = StagedJob(
        req=msgspec.structs.replace(
            bad.req, winners=[msgspec.structs.replace(w, watermarks={}) for w in bad.req.winners]
        ),
        winners=bad.winners,
        losers=bad.losers,
    )
    res = await commit_dataset(
        any_store,
        bad.req,
        ManualLease("events", 2),
        SETTINGS,
        registry=registry,
        extra_steps=[FailsAfterTheRecord()],
    )
    assert res.status == "quarantined"
    rec = (await read_stream_records(any_store, "ingest"))["events"]
    assert (rec.batch, rec.job) == (4, bad.req.job)  # the record was written before the failing step

    skipped = await skip_quarantined(
        any_store, "events", bad.req.job, ManualLease("events", 3), SETTINGS, registry=registry
    )
    assert skipped.outcome == "rolled_back"
    rec = (await read_stream_records(any_store, "ingest"))["events"]
    assert (rec.batch, rec.query, rec.job) == (3, Q1, "")
    assert await published_jobs(any_store, "events") == {first.req.job}

    # Spark's rerun of batch 4 commits it (the record no longer covers it).
    rerun = await stage(any_store, "events", "ingest-b4-cccccccc", 4, seed=2)
    assert (await commit_dataset(any_store, rerun.req, ManualLease("events", 4), SETTINGS)).ok
    assert await published_jobs(any_store, "events") == {first.req.job, rerun.req.job}
    assert (await audit(any_store)).ok
