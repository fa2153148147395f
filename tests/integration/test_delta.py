"""Commits into Delta Lake tables: the dataset's own folder, one Delta version per job, on the four stores.

Every check reads the table back with delta-rs (``deltalake``) and counts the versions carrying each job.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from shared import Fenced
from shared.commit import (
    CommitRequest,
    CommitStepFailed,
    CommitToDelta,
    StepContext,
    audit,
    commit_dataset,
    decode_sequence,
    read_state,
    recover_dataset,
    table_step,
)
from shared.events import TableBinding, published_key, staged_key, wal_key
from shared.settings import StoreSettings
from shared.storage import ObjectStore
from tests._support.commit import ManualLease, assert_exactly_once, fast_settings, keys
from tests._support.delta import (
    DeltaJob,
    delta_jobs,
    delta_rows,
    local_root,
    log_names,
    open_delta,
    sorted_rows,
    stage_delta_job,
)
from tests._support.emulators import BACKENDS, MakeTarget, StoreTarget
from tests._support.fault_store import FaultStore, expect_crash


@pytest.fixture(params=BACKENDS)
def target(request: pytest.FixtureRequest, make_target: MakeTarget) -> StoreTarget:
    return make_target(request.param)


async def _next_owner(store: ObjectStore, req: Any, dataset: str, step: Any, *, recover: bool = False) -> Any:
    """Commit as the next owner (epoch 2); again with epoch 3 if fenced (a crashed holder's late write).

    With ``recover``, the next owner first recovers the dataset from its log alone (as a worker that took
    the shard over does, without the request), then the job's commit comes again and finds it done.
    """
    settings = fast_settings()
    for epoch in (2, 3):
        try:
            if recover:
                got = await recover_dataset(store, dataset, ManualLease(dataset, epoch), settings)
                assert got.blocked_by is None and all(r.ok for r in got.results), got
            return await commit_dataset(store, req, ManualLease(dataset, epoch), settings, extra_steps=[step])
        except Fenced:
            if epoch == 3:
                raise
    raise AssertionError("unreachable")


def _commits(n: int) -> list[str]:
    return [f"{v:020d}.json" for v in range(n)]


async def test_a_delta_bound_commit_lands_as_one_version_and_a_replay_adds_none(
    target: StoreTarget, tmp_path: Path
) -> None:
    settings = fast_settings()
    async with target.open() as store:
        jobs = [await stage_delta_job(store, "sales", f"job-{i}") for i in range(2)]
        for i, job in enumerate(jobs):
            res = await commit_dataset(
                store, job.req, ManualLease("sales", i + 1), settings, extra_steps=[job.step()]
            )
            assert res.ok, res
        again = await commit_dataset(
            store, jobs[0].req, ManualLease("sales", 9), settings, extra_steps=[jobs[0].step()]
        )
        assert again.already_committed
        # The step alone, run again by a later holder: the log says the job is there.
        ctx = StepContext(store=store, lease=ManualLease("sales", 10), settings=settings)
        assert await jobs[1].step().ensure(ctx) is False
        await assert_exactly_once(store, *(j.staged for j in jobs))
        assert await log_names(store, "sales") == _commits(2)
        assert (await audit(store)).ok
        dt = await open_delta(store, target, "sales", tmp_path)
        assert delta_jobs(dt) == [(0, "job-0"), (1, "job-1")]
        assert dt.transaction_version("commitfleet/sales") == 1
        assert delta_rows(dt) == sorted_rows(*(j.rows for j in jobs))
        # pyarrow through delta-rs: the dataset API sees the same rows.
        ds = dt.to_pyarrow_dataset()
        assert pa.table(ds.to_table()).select(["id", "amount"]).sort_by("id") == delta_rows(dt)
        adds = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
        assert adds["num_records"] == [3, 3, 3, 3]
        assert sorted(adds["min.amount"]) == [0, 0, 1000, 1000]


async def _storage_ops_of_a_delta_commit(store: ObjectStore) -> int:
    probe = await stage_delta_job(store, "probe", "job-1")
    counting = FaultStore(store)
    res = await commit_dataset(
        counting, probe.req, ManualLease("probe", 1), fast_settings(), extra_steps=[probe.step()]
    )
    assert res.ok, res
    return len(counting.calls)


@pytest.mark.parametrize("when", ["before", "after"])
async def test_crash_at_every_storage_operation_then_another_owner_recovers(
    target: StoreTarget, tmp_path: Path, when: str
) -> None:
    async with target.open() as store:
        n = await _storage_ops_of_a_delta_commit(store)
        # Every mutating store call locally (the log's create among them), a spread on the emulators.
        points = list(range(1, n + 1)) if target.backend == "local" else sorted({1, n // 2, n - 3, n - 2, n})
        shared_jobs = []
        for k, point in enumerate(points):
            # One fresh table per odd point, and one shared table that each even point appends to.
            dataset = "shared" if k % 2 == 0 else f"t{k}"
            job = await stage_delta_job(store, dataset, f"job-{k}")
            step = job.step()
            crashing = FaultStore(store, crash_at=point, crash_when=when)
            await expect_crash(
                commit_dataset(
                    crashing, job.req, ManualLease(dataset, 1), fast_settings(), extra_steps=[step]
                )
            )
            res = await _next_owner(store, job.req, dataset, step, recover=k % 3 == 2)
            assert res.ok, (point, res)
            await assert_exactly_once(store, *([] if dataset == "shared" else [job.staged]))
            if dataset == "shared":
                shared_jobs.append(job)
            else:
                assert await log_names(store, dataset) == _commits(1), point
        await assert_exactly_once(store, *(j.staged for j in shared_jobs))
        assert (await audit(store)).ok
        # Exactly one version per job, in commit order, and nothing else in the log.
        assert await log_names(store, "shared") == _commits(len(shared_jobs))
        dt = await open_delta(store, target, "shared", tmp_path)
        assert delta_jobs(dt) == [(v, j.req.job) for v, j in enumerate(shared_jobs)]
        assert delta_rows(dt) == sorted_rows(*(j.rows for j in shared_jobs))


async def test_the_log_create_lost_in_flight_is_found_by_the_next_owner(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    """Each store call in turn lands but its answer is lost (OutcomeUnknown): re-checked, never twice."""
    target = make_target("local")
    async with target.open() as store:
        n = await _storage_ops_of_a_delta_commit(store)
        for k in range(1, n + 1):
            flaky = FaultStore(store, unknown_at=k, unknown_when="after")
            job = await stage_delta_job(store, "sales", f"job-u{k}")
            res = await commit_dataset(
                flaky, job.req, ManualLease("sales", k), fast_settings(), extra_steps=[job.step()]
            )
            assert res.ok, (k, res)
        dt = await open_delta(store, target, "sales", tmp_path)
        assert [j for _, j in delta_jobs(dt)] == [f"job-u{k}" for k in range(1, n + 1)]
        assert (await audit(store)).ok


@pytest.mark.parametrize("crash", [None, "log"])
async def test_overwrite_removes_exactly_the_files_of_the_previous_versions(
    target: StoreTarget, tmp_path: Path, crash: str | None
) -> None:
    settings = fast_settings()
    async with target.open() as store:
        first = [await stage_delta_job(store, "sales", f"job-{i}") for i in range(2)]
        for job in first:
            res = await commit_dataset(
                store, job.req, ManualLease("sales", 1), settings, extra_steps=[job.step()]
            )
            assert res.ok
        last = await stage_delta_job(store, "sales", "job-9", tasks=3, n=2)
        step = last.step("overwrite")
        if crash is not None:
            # Crash just after the log entry landed (the overwrite is visible), before the manifest.
            fault = FaultStore(store)
            probe_calls: list[str] = []

            def probe(point: str) -> None:
                probe_calls.append(point)
                if point == "table.committed":
                    from tests._support.fault_store import SimulatedCrash

                    raise SimulatedCrash("crash after the log entry")

            await expect_crash(
                commit_dataset(
                    fault, last.req, ManualLease("sales", 2), settings, extra_steps=[step], probe=probe
                )
            )
            dt = await open_delta(store, target, "sales", tmp_path)
            assert delta_rows(dt) == sorted_rows(last.rows)
        res = await commit_dataset(store, last.req, ManualLease("sales", 3), settings, extra_steps=[step])
        assert res.ok, res
        await assert_exactly_once(store, *(j.staged for j in first), last.staged)
        assert (await audit(store)).ok
        dt = await open_delta(store, target, "sales", tmp_path)
        assert delta_jobs(dt) == [(0, "job-0"), (1, "job-1"), (2, "job-9")]
        assert delta_rows(dt) == sorted_rows(last.rows)
        # The overwrite's removes: exactly every file the earlier versions added.
        state = await read_state(store, "sales")
        assert state is not None
        earlier = {k[len("sales/") :] for j in first for k in _published(j)}
        log = (await store.read("sales/_delta_log/00000000000000000002.json")).data.decode()
        removed = {line.split('"path":"')[1].split('"')[0] for line in log.splitlines() if '"remove"' in line}
        assert removed == earlier
        assert set(state.files) == {k[len("sales/") :] for k in _published(last)}


def _published(job: Any) -> list[str]:
    return [
        published_key(job.req.dataset, job.req.job, w.task, f.path) for w in job.req.winners for f in w.files
    ]


async def test_vacuum_and_delta_readers_leave_the_commits_folder_alone(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    target = make_target("local")
    settings = fast_settings()
    async with target.open() as store:
        jobs = [await stage_delta_job(store, "sales", f"job-{i}") for i in range(2)]
        modes = ["append", "overwrite"]
        for job, mode in zip(jobs, modes, strict=True):
            res = await commit_dataset(
                store, job.req, ManualLease("sales", 1), settings, extra_steps=[job.step(mode)]
            )
            assert res.ok
        manifests = {k: (await store.read(k)).data for k in await keys(store, "sales/_commits/")}
        assert len(manifests) == 2
        dt = await open_delta(store, target, "sales", tmp_path)
        deleted = dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        # Vacuum deleted the overwritten job's files, nothing else: the manifests are there, byte for byte.
        assert sorted(deleted) == sorted(k[len("sales/") :] for k in _published(jobs[0]))
        assert {k: (await store.read(k)).data for k in await keys(store, "sales/_commits/")} == manifests
        assert delta_rows(DeltaTable(str(local_root(store) / "sales"))) == sorted_rows(jobs[1].rows)
        # The audit: files an overwrite removed may be gone; the vacuum's own log entries are not the fleet's.
        report = await audit(store)
        assert report.ok, report.violations
        # The fleet goes on committing after delta-rs wrote its VACUUM versions.
        more = await stage_delta_job(store, "sales", "job-2")
        assert (
            await commit_dataset(
                store, more.req, ManualLease("sales", 2), settings, extra_steps=[more.step()]
            )
        ).ok
        dt = DeltaTable(str(local_root(store) / "sales"))
        assert [j for _, j in delta_jobs(dt)] == ["job-0", "job-1", "job-2"]
        assert delta_rows(dt) == sorted_rows(jobs[1].rows, more.rows)
        assert (await audit(store)).ok


async def test_a_schema_mismatch_quarantines_the_sequence_with_the_reason(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    target = make_target("local")
    settings = fast_settings()
    async with target.open() as store:
        first = await stage_delta_job(store, "sales", "job-1")
        assert (
            await commit_dataset(
                store, first.req, ManualLease("sales", 1), settings, extra_steps=[first.step()]
            )
        ).ok
        bad = await stage_delta_job(store, "sales", "job-2", extra=True)
        res = await commit_dataset(
            store, bad.req, ManualLease("sales", 2), settings, extra_steps=[bad.step()]
        )
        assert res.status == "quarantined"
        assert (
            res.quarantined is not None and "schema mismatch" in res.quarantined and "note" in res.quarantined
        )
        assert await log_names(store, "sales") == _commits(1)
        dt = await open_delta(store, target, "sales", tmp_path)
        assert delta_rows(dt) == sorted_rows(first.rows)


async def test_partition_folders_become_the_tables_partition_columns(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    target = make_target("local")
    settings = fast_settings()
    async with target.open() as store:
        jobs = [
            await stage_delta_job(store, "sales", "job-1", folder="day=2024-01-01"),
            await stage_delta_job(store, "sales", "job-2", folder="day=2024-01-02"),
        ]
        for i, job in enumerate(jobs):
            res = await commit_dataset(
                store, job.req, ManualLease("sales", i + 1), settings, extra_steps=[job.step()]
            )
            assert res.ok, res
        dt = await open_delta(store, target, "sales", tmp_path)
        assert dt.metadata().partition_columns == ["day"]
        got = pa.table(dt.to_pyarrow_table()).sort_by("id")
        assert got.column("day").to_pylist() == ["2024-01-01"] * 6 + ["2024-01-02"] * 6
        assert got.select(["id", "amount"]) == sorted_rows(*(j.rows for j in jobs))
        # A job with no partition folder does not fit the table: quarantined, the log unchanged.
        flat = await stage_delta_job(store, "sales", "job-3")
        res = await commit_dataset(
            store, flat.req, ManualLease("sales", 3), settings, extra_steps=[flat.step()]
        )
        assert res.status == "quarantined" and res.quarantined is not None
        assert "partition" in res.quarantined
        assert await log_names(store, "sales") == _commits(2)


async def test_the_fleet_appends_to_a_table_delta_rs_created(tmp_path: Path, make_target: MakeTarget) -> None:
    target = make_target("local")
    async with target.open() as store:
        root = local_root(store)
        assert root is not None
        seed = pa.table({"id": pa.array(["seed"], pa.string()), "amount": pa.array([7], pa.int64())})
        write_deltalake(str(root / "sales"), seed)
        job = await stage_delta_job(store, "sales", "job-1")
        res = await commit_dataset(
            store, job.req, ManualLease("sales", 1), fast_settings(), extra_steps=[job.step()]
        )
        assert res.ok, res
        dt = DeltaTable(str(root / "sales"))
        assert dt.version() == 1 and delta_jobs(dt) == [(1, "job-1")]
        assert delta_rows(dt) == sorted_rows(seed, job.rows)


_ORDERS = st.permutations(["a_read", "a_commit", "b_read", "b_commit"]).filter(
    lambda p: p.index("a_read") < p.index("a_commit") and p.index("b_read") < p.index("b_commit")
)
_FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@hyp_settings(max_examples=10, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(order=_ORDERS, mode=st.sampled_from(["append", "overwrite"]), table_first=st.booleans())
async def test_two_holders_interleaved_land_one_version_never_two(
    tmp_path_factory: pytest.TempPathFactory, order: list[str], mode: str, table_first: bool
) -> None:
    """Holders a and b run the same Delta step, each parked before its log create; ``order`` interleaves."""
    tmp = tmp_path_factory.mktemp("two")
    target = StoreTarget("local", (tmp / "store").as_uri(), StoreSettings())
    settings = fast_settings()
    async with target.open() as store:
        prior = await stage_delta_job(store, "sales", "job-0")
        if table_first:
            res = await commit_dataset(
                store, prior.req, ManualLease("sales", 1), settings, extra_steps=[prior.step()]
            )
            assert res.ok
        job = await stage_delta_job(store, "sales", "job-1")
        for w in job.req.winners:
            for f in w.files:
                src = staged_key("job-1", "sales", w.task, w.attempt, f.path)
                await store.copy(src, published_key("sales", "job-1", w.task, f.path))
        step = job.step(mode)
        gated = {"a": FaultStore(store, gate_at=1), "b": FaultStore(store, gate_at=1)}
        tasks: dict[str, asyncio.Task[bool]] = {}
        for event in order:
            who, what = event.split("_")
            if what == "read":
                ctx = StepContext(store=gated[who], lease=ManualLease("sales", 2), settings=settings)
                tasks[who] = asyncio.create_task(step.ensure(ctx))
                parked = asyncio.ensure_future(gated[who].parked.wait())
                await asyncio.wait({parked, tasks[who]}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
                parked.cancel()
                assert gated[who].parked.is_set() or tasks[who].done()
            else:
                gated[who].gate.set()
                await asyncio.wait_for(asyncio.shield(tasks[who]), 20)
        landed = sorted([await tasks["a"], await tasks["b"]])
        assert landed == [False, True], (order, landed)
        dt = DeltaTable(str(local_root(store) / "sales"))
        assert [j for _, j in delta_jobs(dt)].count("job-1") == 1
        want = [job.rows] if mode == "overwrite" or not table_first else [prior.rows, job.rows]
        assert delta_rows(dt) == sorted_rows(*want)


async def test_the_audit_checks_the_log_against_the_manifests(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    target = make_target("local")
    settings = fast_settings()
    async with target.open() as store:
        bound = await stage_delta_job(store, "sales", "job-1")
        assert (
            await commit_dataset(
                store, bound.req, ManualLease("sales", 1), settings, extra_steps=[bound.step()]
            )
        ).ok
        assert (await audit(store)).ok
        # A commit of the dataset that did not go through the table: its manifest has no version.
        unbound = await stage_delta_job(store, "sales", "job-2")
        assert (await commit_dataset(store, unbound.req, ManualLease("sales", 2), settings)).ok
        report = await audit(store)
        assert [(v.kind, v.key) for v in report.violations] == [
            ("missing_snapshot", "sales/_commits/job-2.json")
        ]
        # A version whose sequence is open is in flight; once the log is gone it has no manifest.
        third = await stage_delta_job(store, "sales", "job-3")

        def crash_after(point: str) -> None:
            if point == "table.committed":
                from tests._support.fault_store import SimulatedCrash

                raise SimulatedCrash("after the log entry")

        await expect_crash(
            commit_dataset(
                store,
                third.req,
                ManualLease("sales", 3),
                settings,
                extra_steps=[third.step()],
                probe=crash_after,
            )
        )
        report = await audit(store)
        assert {v.kind for v in report.violations} == {"unfinished_sequence", "missing_snapshot"}
        await store.delete("_wal/sales/job-3.json")
        report = await audit(store)
        assert ("snapshot_without_manifest", "sales/_commits/job-3.json") in [
            (v.kind, v.key) for v in report.violations
        ]
        # A job's version written twice (by hand): duplicate.
        body = (await store.read("sales/_delta_log/00000000000000000000.json")).data
        await store.write("sales/_delta_log/00000000000000000002.json", body)
        report = await audit(store)
        assert ("duplicate_snapshot", "sales/_commits/job-1.json") in [
            (v.kind, v.key) for v in report.violations
        ]


async def test_a_fresh_worker_replays_a_checkpoint_delta_rs_wrote(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    """delta-rs checkpoints the table, its older JSON commits are cleaned up: the fleet starts from there."""
    target = make_target("local")
    settings = fast_settings()
    async with target.open() as store:
        root = local_root(store)
        assert root is not None
        jobs = [await stage_delta_job(store, "sales", f"job-{i}") for i in range(3)]
        for job in jobs:
            res = await commit_dataset(
                store, job.req, ManualLease("sales", 1), settings, extra_steps=[job.step()]
            )
            assert res.ok
        DeltaTable(str(root / "sales")).create_checkpoint()
        for v in range(2):  # what cleanup_metadata does once they are past the log retention
            await store.delete(f"sales/_delta_log/{v:020d}.json")
        state = await read_state(store, "sales", cached=False)
        assert state is not None and state.version == 2
        assert len(state.files) == 6 and state.txns == {"commitfleet/sales": 2}
        # The newest fleet commit's own file is still there: the done check reads it.
        ctx = StepContext(store=store, lease=ManualLease("sales", 2), settings=settings)
        assert await jobs[2].step().ensure(ctx) is False
        more = await stage_delta_job(store, "sales", "job-3")
        assert (
            await commit_dataset(
                store, more.req, ManualLease("sales", 2), settings, extra_steps=[more.step()]
            )
        ).ok
        dt = DeltaTable(str(root / "sales"))
        assert dt.version() == 3
        assert delta_rows(dt) == sorted_rows(*(j.rows for j in [*jobs, more]))
        # The audit cannot see the versions cleaned up; it does not call their manifests missing.
        assert (await audit(store)).ok


async def test_delta_rs_lands_a_repeated_txn_twice_the_fleet_lands_a_repeated_job_once(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    """The hole the fleet closes: delta-rs does not refuse a commit whose (appId, version) the table holds."""
    from deltalake import CommitProperties, Transaction

    plain = tmp_path / "plain"
    seed = pa.table({"id": pa.array(["x"], pa.string()), "amount": pa.array([1], pa.int64())})
    for _ in range(2):
        txn = CommitProperties(app_transactions=[Transaction("commitfleet/plain", 0)])
        write_deltalake(str(plain), seed, mode="append", commit_properties=txn)
    assert DeltaTable(str(plain)).to_pyarrow_table().num_rows == 2, "delta-rs landed the repeat"
    target = make_target("local")
    async with target.open() as store:
        job = await stage_delta_job(store, "sales", "job-1")
        step = job.step()
        assert (
            await commit_dataset(store, job.req, ManualLease("sales", 1), fast_settings(), extra_steps=[step])
        ).ok
        ctx = StepContext(store=store, lease=ManualLease("sales", 2), settings=fast_settings())
        assert await step.ensure(ctx) is False, "the fleet refuses the repeat under its lock"
        dt = await open_delta(store, target, "sales", tmp_path)
        assert dt.version() == 0 and delta_rows(dt) == sorted_rows(job.rows)


async def test_a_table_deleted_and_made_again_is_replayed_afresh(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    """A replayed state is a start only while the listing shows its newest commit file unchanged."""
    target = make_target("local")
    settings = fast_settings()
    async with target.open() as store:
        root = local_root(store)
        assert root is not None
        jobs = [await stage_delta_job(store, "sales", f"job-{i}") for i in range(2)]
        for job in jobs:
            assert (
                await commit_dataset(
                    store, job.req, ManualLease("sales", 1), settings, extra_steps=[job.step()]
                )
            ).ok
        state = await read_state(store, "sales")
        assert state is not None and state.version == 1 and len(state.files) == 4
        for key in await keys(store, "sales/"):  # the table and its manifests gone
            await store.delete(key)
        # Made again by another writer, up to the same version: versions 0 and 1 exist again, other files.
        seed = pa.table({"id": pa.array(["x"], pa.string()), "amount": pa.array([1], pa.int64())})
        for _ in range(2):
            write_deltalake(str(root / "sales"), seed, mode="append")
        state = await read_state(store, "sales")
        assert state is not None and state.version == 1
        assert len(state.files) == 2 and state.fleet_commits == {}, (
            "replayed afresh, not the remembered table"
        )


@pytest.mark.parametrize("crash_in_checkpoint", [False, True])
async def test_every_tenth_version_gets_a_checkpoint_delta_rs_and_a_fresh_worker_read(
    tmp_path: Path, make_target: MakeTarget, crash_in_checkpoint: bool
) -> None:
    """The holder that lands version 10 writes its checkpoint; a crash in that write loses only that."""
    from tests._support.fault_store import Fault, SimulatedCrash

    target = make_target("local")
    settings = fast_settings()
    async with target.open() as store:
        root = local_root(store)
        assert root is not None
        jobs = [await stage_delta_job(store, "sales", f"job-{i:02d}", n=2) for i in range(12)]
        for i, job in enumerate(jobs):
            crashing = i == 10 and crash_in_checkpoint
            faults = [Fault("write_if_absent", SimulatedCrash, when=lambda b: b.startswith(b"PAR1"))]
            holder: ObjectStore = FaultStore(store, faults=faults) if crashing else store
            run = commit_dataset(
                holder, job.req, ManualLease("sales", i + 1), settings, extra_steps=[job.step()]
            )
            if crashing:
                await expect_crash(run)
                got = await recover_dataset(store, "sales", ManualLease("sales", 100), settings)
                assert [r.ok for r in got.results] == [True], got
                res = await commit_dataset(
                    store, job.req, ManualLease("sales", 100), settings, extra_steps=[job.step()]
                )
            else:
                res = await run
            assert res.ok, (i, res)
        names = await log_names(store, "sales")
        checkpoint = f"{10:020d}.checkpoint.parquet"
        assert [n for n in names if not n.endswith(".json")] == (
            [] if crash_in_checkpoint else [checkpoint, "_last_checkpoint"]
        )
        assert [n for n in names if n.endswith(".json")] == _commits(12)
        if crash_in_checkpoint:
            return
        # Older commits cleaned up: delta-rs and a fresh worker must start from the fleet's checkpoint.
        for v in range(10):
            await store.delete(f"sales/_delta_log/{v:020d}.json")
        dt = DeltaTable(str(root / "sales"))
        assert dt.version() == 11 and dt.transaction_version("commitfleet/sales") == 11
        assert delta_rows(dt) == sorted_rows(*(j.rows for j in jobs))
        state = await read_state(store, "sales", cached=False)
        assert state is not None and state.version == 11 and len(state.files) == 24
        more = await stage_delta_job(store, "sales", "job-12", n=2)
        assert (
            await commit_dataset(
                store, more.req, ManualLease("sales", 20), settings, extra_steps=[more.step()]
            )
        ).ok
        assert delta_rows(DeltaTable(str(root / "sales"))) == sorted_rows(*(j.rows for j in [*jobs, more]))
        assert (await audit(store)).ok


async def test_a_remembered_state_behind_cleaned_up_commits_gives_way_to_the_checkpoint(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    target = make_target("local")
    settings = fast_settings()
    async with target.open() as store:
        root = local_root(store)
        assert root is not None
        jobs = [await stage_delta_job(store, "sales", f"job-{i}", n=1) for i in range(3)]
        for job in jobs:
            assert (
                await commit_dataset(
                    store, job.req, ManualLease("sales", 1), settings, extra_steps=[job.step()]
                )
            ).ok
        state = await read_state(store, "sales")  # remembered at version 2
        assert state is not None and state.version == 2
        seed = pa.table({"id": pa.array(["x"], pa.string()), "amount": pa.array([1], pa.int64())})
        for _ in range(
            3
        ):  # versions 3 to 5 by another writer, a checkpoint at 5, the older commits cleaned up
            write_deltalake(str(root / "sales"), seed, mode="append")
        DeltaTable(str(root / "sales")).create_checkpoint()
        for v in range(5):
            await store.delete(f"sales/_delta_log/{v:020d}.json")
        state = await read_state(store, "sales")
        assert state is not None and state.version == 5 and len(state.files) == 2 * 3 + 3


class _CountingStore:
    """A store that counts its listings and reads under a prefix (every call passed on)."""

    def __init__(self, inner: ObjectStore, prefix: str) -> None:
        self.inner = inner
        self.prefix = prefix
        self.lists = 0
        self.reads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def list(self, prefix: str = "", *, page_size: int = 1000) -> Any:
        if prefix.startswith(self.prefix):
            self.lists += 1
        return self.inner.list(prefix, page_size=page_size)

    async def read(self, key: str) -> Any:
        if key.startswith(self.prefix):
            self.reads.append(key)
        return await self.inner.read(key)


async def test_a_holder_starts_from_the_version_it_landed_and_sees_another_writers_next(
    target: StoreTarget, tmp_path: Path
) -> None:
    """The next commit checks the landed state with two heads (no listing); a newer version makes it list."""
    settings = fast_settings()
    async with target.open() as store:
        jobs = [await stage_delta_job(store, "sales", f"job-{i}") for i in range(4)]
        for i, job in enumerate(jobs[:2]):
            res = await commit_dataset(
                store, job.req, ManualLease("sales", i + 1), settings, extra_steps=[job.step()]
            )
            assert res.ok, res
        counting = _CountingStore(store, "sales/_delta_log/")
        res = await commit_dataset(
            counting,  # type: ignore[arg-type]
            jobs[2].req,
            ManualLease("sales", 3),
            settings,
            extra_steps=[jobs[2].step()],
        )
        assert res.ok, res
        assert (counting.lists, counting.reads) == (0, []), "the landed state, checked without a listing"
        # Another writer lands version 3 (a commit with only commitInfo, as a Delta writer may write).
        await store.write_if_absent(
            "sales/_delta_log/" + _commits(4)[3], b'{"commitInfo":{"operation":"X"}}\n'
        )
        counting = _CountingStore(store, "sales/_delta_log/")
        res = await commit_dataset(
            counting,  # type: ignore[arg-type]
            jobs[3].req,
            ManualLease("sales", 4),
            settings,
            extra_steps=[jobs[3].step()],
        )
        assert res.ok, res
        assert counting.lists >= 1 and counting.reads == ["sales/_delta_log/" + _commits(4)[3]]
        assert [n for n in await log_names(store, "sales") if n.endswith(".json")] == _commits(5)
        dt = await open_delta(store, target, "sales", tmp_path)
        assert delta_jobs(dt) == [(0, "job-0"), (1, "job-1"), (2, "job-2"), (4, "job-3")]
        assert delta_rows(dt) == sorted_rows(*(j.rows for j in jobs))


def _sequenced(job: DeltaJob, seq: int) -> tuple[CommitRequest, Any]:
    """The job's request carrying its sequence for the dataset (a worker's ``fin``), and its Delta step."""
    req = msgspec.structs.replace(job.req, seq=seq)
    return req, table_step(req, TableBinding(delta=True, mode="append"))


def _txns(root: Path, dataset: str) -> list[int | None]:
    """The fleet ``txn`` version delta-rs reads at each version of the table."""
    latest = DeltaTable(str(root / dataset)).version()
    return [
        DeltaTable(str(root / dataset), version=v).transaction_version(f"commitfleet/{dataset}")
        for v in range(latest + 1)
    ]


async def test_the_txn_version_is_the_jobs_sequence_and_rises_in_job_order(
    target: StoreTarget, tmp_path: Path
) -> None:
    """Sequences 5 and 9, then 3 (a shard whose sequence restarted lower), then 0 (a plan made before the
    field): delta-rs reads 5, 9, 10, 11 under the app id; a repeat finds each job done."""
    settings = fast_settings()
    async with target.open() as store:
        jobs = [await stage_delta_job(store, "sales", f"job-{i}") for i in range(4)]
        planned = [_sequenced(job, seq) for job, seq in zip(jobs, [5, 9, 3, 0], strict=True)]
        for i, (req, step) in enumerate(planned):
            res = await commit_dataset(store, req, ManualLease("sales", i + 1), settings, extra_steps=[step])
            assert res.ok, res
        for i, (req, step) in enumerate(planned):
            again = await commit_dataset(
                store, req, ManualLease("sales", 10 + i), settings, extra_steps=[step]
            )
            assert again.already_committed, (i, again)
        ctx = StepContext(store=store, lease=ManualLease("sales", 20), settings=settings)
        assert await planned[3][1].ensure(ctx) is False
        fresh = await read_state(store, "sales", cached=False)
        assert fresh is not None and fresh.txns == {"commitfleet/sales": 11}
        assert await planned[3][1].is_done(ctx)
        assert not await planned[2][1].is_done(ctx)
        await assert_exactly_once(store, *(j.staged for j in jobs))
        assert (await audit(store)).ok
        dt = await open_delta(store, target, "sales", tmp_path)
        assert delta_jobs(dt) == [(v, f"job-{v}") for v in range(4)]
        assert dt.transaction_version("commitfleet/sales") == 11
        if target.backend == "local":
            root = local_root(store)
            assert root is not None
            assert _txns(root, "sales") == [5, 9, 10, 11]


async def test_a_write_ahead_log_planned_without_the_sequence_still_recovers(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    """A sequence planned before the step had ``seq`` (its JSON without the field), crashed at the log's
    create: the next owner recovers it from the log alone, one version, its txn one above the latest."""
    from tests._support.fault_store import Fault, SimulatedCrash

    target = make_target("local")
    settings = fast_settings()
    async with target.open() as store:
        root = local_root(store)
        assert root is not None
        first, second = [await stage_delta_job(store, "sales", f"job-{i}") for i in range(2)]
        req, step = _sequenced(first, 7)
        assert (await commit_dataset(store, req, ManualLease("sales", 1), settings, extra_steps=[step])).ok
        req, step = _sequenced(second, 8)
        crash = Fault("write_if_absent", SimulatedCrash, when=lambda b: b.startswith(b'{"commitInfo"'))
        await expect_crash(
            commit_dataset(
                FaultStore(store, faults=[crash]), req, ManualLease("sales", 2), settings, extra_steps=[step]
            )
        )
        key = wal_key("sales", "job-1")
        doc = msgspec.json.decode((await store.read(key)).data)
        (delta,) = [s for s in doc["steps"] if s["kind"] == "delta"]
        # Written by this version (v2: a Delta step with its seq), now made as an older one wrote it.
        assert (doc["v"], delta.pop("seq")) == (2, 8)
        doc["v"] = 1
        await store.write(key, msgspec.json.encode(doc))
        old = decode_sequence((await store.read(key)).data)
        assert [s.seq for s in old.steps if isinstance(s, CommitToDelta)] == [0]
        got = await recover_dataset(store, "sales", ManualLease("sales", 3), settings)
        assert got.blocked_by is None and [r.ok for r in got.results] == [True], got
        again = await commit_dataset(store, req, ManualLease("sales", 4), settings, extra_steps=[step])
        assert again.already_committed
        await assert_exactly_once(store, first.staged, second.staged)
        assert delta_jobs(DeltaTable(str(root / "sales"))) == [(0, "job-0"), (1, "job-1")]
        assert _txns(root, "sales") == [7, 8]  # the old plan's txn: one above the latest
        assert (await audit(store)).ok


async def test_the_done_check_finds_the_commit_behind_a_checkpoint_that_set_the_txn(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    """The fleet checkpoints version 10, delta-rs appends 11-20 (no txn) and checkpoints 20, versions 0-9 are
    cleaned up: a fresh worker's state has the txn from the checkpoint, the done check reads back to 10;
    a job whose sequence is above the latest txn is not done, without a read."""
    target = make_target("local")
    settings = fast_settings()
    async with target.open() as store:
        root = local_root(store)
        assert root is not None
        jobs = [await stage_delta_job(store, "sales", f"job-{i:02d}", n=1) for i in range(11)]
        planned = [_sequenced(job, 100 + 2 * i) for i, job in enumerate(jobs)]
        for i, (req, step) in enumerate(planned):
            assert (
                await commit_dataset(store, req, ManualLease("sales", i + 1), settings, extra_steps=[step])
            ).ok
        seed = pa.table({"id": pa.array(["x"], pa.string()), "amount": pa.array([1], pa.int64())})
        for _ in range(10):
            write_deltalake(str(root / "sales"), seed, mode="append")
        DeltaTable(str(root / "sales")).create_checkpoint()
        for v in range(10):
            await store.delete(f"sales/_delta_log/{v:020d}.json")
        state = await read_state(store, "sales", cached=False)
        assert state is not None and (state.version, state.checkpoint, state.txn_at) == (20, 20, {})
        assert state.txns == {"commitfleet/sales": 120}
        ctx = StepContext(store=store, lease=ManualLease("sales", 30), settings=settings)
        assert await planned[10][1].is_done(ctx)
        assert not await planned[9][1].is_done(ctx)
        later = _sequenced(await stage_delta_job(store, "sales", "job-11", n=1), 121)[1]
        counting = _CountingStore(store, "sales/_delta_log/")
        ctx_counting = StepContext(store=counting, lease=ManualLease("sales", 30), settings=settings)  # type: ignore[arg-type]
        assert not await later.is_done(ctx_counting)
        assert (counting.lists, counting.reads) == (0, [])
        assert await planned[10][1].ensure(ctx) is False
        # With the fleet's commit 10 gone too, no job can be told done: the sequence is set aside, not re-run.
        await store.delete(f"sales/_delta_log/{10:020d}.json")
        state = await read_state(store, "sales", cached=False)
        assert state is not None
        with pytest.raises(CommitStepFailed, match="is gone"):
            await planned[10][1].is_done(ctx)
