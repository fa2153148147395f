"""Commits into Iceberg tables: real pyiceberg with a SQLite catalog, on local files and the S3 emulator.

Every check reads the table back with pyiceberg into Arrow and counts the snapshots carrying each job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from shared import Fenced
from shared.commit import CommitProbe, abort_dataset, audit, commit_dataset, list_unfinished, recover_dataset
from shared.events import TableBinding, published_key, staged_key
from shared.settings import StoreSettings
from shared.storage import ObjectStore
from tests._support.commit import ManualLease, assert_exactly_once
from tests._support.emulators import MakeTarget, StoreTarget
from tests._support.fault_store import FaultStore, SimulatedCrash, expect_crash
from tests._support.tables import job_snapshots, sorted_rows, stage_parquet_job, table_rows, table_settings

TABLE = "lake.orders"


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, make_target: MakeTarget) -> StoreTarget:
    return make_target(request.param)


def _catalog_crash(when: str) -> tuple[CommitProbe, list[int]]:
    """A probe that crashes the first catalog commit ``before`` or ``after`` it is made, and its call log."""
    calls: list[int] = []

    def probe(point: str) -> None:
        if point == "table.commit":
            calls.append(1)
            if len(calls) == 1 and when == "before":
                raise SimulatedCrash("crash before the catalog commit")
        elif point == "table.committed" and len(calls) == 1 and when == "after":
            raise SimulatedCrash("crash after the catalog commit")

    return probe, calls


async def _next_owner(store: ObjectStore, req: Any, dataset: str, settings: Any, step: Any) -> Any:
    """Commit as the next owner (epoch 2); once more with epoch 3 if fenced.

    A crashed holder's write that was in flight (the fence, started next to
    the deletes) may still land after the crash, just after the next owner
    read the log: that owner is fenced and the work is retried under a new
    epoch, as the worker does.
    """
    try:
        return await commit_dataset(store, req, ManualLease(dataset, 2), settings, extra_steps=[step])
    except Fenced:
        return await commit_dataset(store, req, ManualLease(dataset, 3), settings, extra_steps=[step])


async def test_a_bound_commit_lands_as_one_snapshot_and_a_replay_adds_none(
    target: StoreTarget, tmp_path: Path
) -> None:
    settings = table_settings(target, tmp_path)
    binding = TableBinding(table=TABLE, mode="create")
    async with target.open() as store:
        jobs = [await stage_parquet_job(store, "orders", f"job-{i}") for i in range(2)]
        for i, job in enumerate(jobs):
            lease = ManualLease("orders", i + 1)
            res = await commit_dataset(store, job.req, lease, settings, extra_steps=[job.step(binding)])
            assert res.ok, res
        again = await commit_dataset(
            store, jobs[0].req, ManualLease("orders", 9), settings, extra_steps=[jobs[0].step(binding)]
        )
        assert again.already_committed
        await assert_exactly_once(store, *(j.staged for j in jobs))
        assert job_snapshots(settings, store.url, TABLE) == [("orders", "job-0"), ("orders", "job-1")]
        assert table_rows(settings, store.url, TABLE) == sorted_rows(*(j.rows for j in jobs))


async def _storage_ops_of_a_bound_commit(store: ObjectStore, settings: Any) -> int:
    probe = await stage_parquet_job(store, "probe", "job-1")
    counting = FaultStore(store)
    step = probe.step(TableBinding(table="lake.probe", mode="create"))
    assert (
        await commit_dataset(counting, probe.req, ManualLease("probe", 1), settings, extra_steps=[step])
    ).ok
    return len(counting.calls)


@pytest.mark.parametrize("when", ["before", "after"])
async def test_crash_at_every_storage_and_catalog_operation_then_another_owner_recovers(
    target: StoreTarget, tmp_path: Path, when: str
) -> None:
    settings = table_settings(target, tmp_path)
    async with target.open() as store:
        n = await _storage_ops_of_a_bound_commit(store, settings)
        # Storage boundaries (every one locally, a spread on S3), then the catalog commit itself.
        points: list[int | str] = (
            list(range(1, n + 1)) if target.backend == "local" else [1, n // 2, n - 2, n]
        )
        points.append("catalog")
        winners = []
        for k, point in enumerate(points):
            # One table per crash point for the create-mode ones, and one shared appended table.
            dataset = f"ds{k}"
            # Every third job sends its files' statistics (the table step then reads no footer).
            job = await stage_parquet_job(store, dataset, "job-1", stats=k % 3 == 1)
            # The shared table, once created, takes appends (the lean path, prepared ahead: _iceberg_append).
            shared_mode = "create" if k == 1 else "append"
            binding = (
                TableBinding(table="lake.shared", mode=shared_mode)
                if k % 2
                else TableBinding(table=f"lake.t{k}", mode="create")
            )
            step = job.step(binding)
            if point == "catalog":
                probe, calls = _catalog_crash(when)
                await expect_crash(
                    commit_dataset(
                        store, job.req, ManualLease(dataset, 1), settings, extra_steps=[step], probe=probe
                    )
                )
                assert calls == [1]
            else:
                crashing = FaultStore(store, crash_at=point, crash_when=when)
                await expect_crash(
                    commit_dataset(crashing, job.req, ManualLease(dataset, 1), settings, extra_steps=[step])
                )
            # Another owner: a fresh commit call of the same request (recovers the log when there is one).
            res = await _next_owner(store, job.req, dataset, settings, step)
            assert res.ok, (point, res)
            winners.append((binding.table, job))
        await assert_exactly_once(store, *(j.staged for _, j in winners))
        assert (await audit(store, settings=settings)).ok
        for table in {t for t, _ in winners}:
            mine = [j for t, j in winners if t == table]
            snaps = job_snapshots(settings, store.url, table)
            assert sorted(snaps) == sorted((j.req.dataset, j.req.job) for j in mine), table
            assert table_rows(settings, store.url, table) == sorted_rows(*(j.rows for j in mine))


async def test_create_a_failed_first_job_leaves_no_table(target: StoreTarget, tmp_path: Path) -> None:
    settings = table_settings(target, tmp_path)
    async with target.open() as store:
        await stage_parquet_job(store, "orders", "job-1")
        res = await abort_dataset(store, "orders", "job-1", ManualLease("orders", 1), settings)
        assert res.status == "aborted" and res.files_deleted > 0
        assert table_rows(settings, store.url, TABLE) is None


@pytest.mark.parametrize("gate_at", [1, 2, 4, 6])
async def test_create_a_job_cancelled_mid_commit_leaves_no_table_unless_its_log_won(
    tmp_path: Path, make_target: MakeTarget, gate_at: int
) -> None:
    target = make_target("local")
    settings = table_settings(target, tmp_path)
    binding = TableBinding(table=TABLE, mode="create")
    async with target.open() as store:
        job = await stage_parquet_job(store, "orders", "job-1")
        gated = FaultStore(store, gate_at=gate_at)
        task = asyncio.create_task(
            commit_dataset(
                gated, job.req, ManualLease("orders", 1), settings, extra_steps=[job.step(binding)]
            )
        )
        await asyncio.wait_for(gated.parked.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        logs = await list_unfinished(store, "orders")
        if not logs:
            # The log never landed: the job is aborted like any failed job; no table.
            await abort_dataset(store, "orders", "job-1", ManualLease("orders", 2), settings)
            assert table_rows(settings, store.url, TABLE) is None
            assert (await audit(store)).ok
            return
        # The log won: the job commits, whoever finishes it.
        got = await recover_dataset(store, "orders", ManualLease("orders", 2), settings)
        assert got.blocked_by is None and [r.ok for r in got.results] == [True]
        await assert_exactly_once(store, job.staged)
        assert job_snapshots(settings, store.url, TABLE) == [("orders", "job-1")]
        assert table_rows(settings, store.url, TABLE) == sorted_rows(job.rows)


async def test_a_cancelled_catalog_call_ends_before_the_step_returns_and_recovery_rechecks(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    target = make_target("local")
    settings = table_settings(target, tmp_path)
    binding = TableBinding(table=TABLE, mode="create")
    entered, release = threading.Event(), threading.Event()

    def slow(point: str) -> None:
        # In the catalog's thread, just before the catalog commit: hold it there.
        if point == "table.commit":
            entered.set()
            assert release.wait(20)

    async with target.open() as store:
        job = await stage_parquet_job(store, "orders", "job-1")
        task = asyncio.create_task(
            commit_dataset(
                store,
                job.req,
                ManualLease("orders", 1),
                settings,
                extra_steps=[job.step(binding)],
                probe=slow,
            )
        )
        await asyncio.to_thread(entered.wait, 10)
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The call in flight ended before the cancel went through: its snapshot is there.
        assert job_snapshots(settings, store.url, TABLE) == [("orders", "job-1")]
        got = await recover_dataset(store, "orders", ManualLease("orders", 2), settings)
        assert [r.ok for r in got.results] == [True]
        assert job_snapshots(settings, store.url, TABLE) == [("orders", "job-1")]
        await assert_exactly_once(store, job.staged)


@pytest.mark.parametrize("crash", [None, "after"])
async def test_overwrite_keeps_only_the_last_jobs_rows_and_a_crash_before_the_manifest_recovers(
    target: StoreTarget, tmp_path: Path, crash: str | None
) -> None:
    settings = table_settings(target, tmp_path)
    async with target.open() as store:
        first = await stage_parquet_job(store, "orders", "job-1")
        step = first.step(TableBinding(table=TABLE, mode="create"))
        assert (
            await commit_dataset(store, first.req, ManualLease("orders", 1), settings, extra_steps=[step])
        ).ok
        last = await stage_parquet_job(store, "orders", "job-2", tasks=3, n=2)
        step = last.step(TableBinding(table=TABLE, mode="overwrite"))
        if crash is not None:
            probe, _ = _catalog_crash(crash)
            await expect_crash(
                commit_dataset(
                    store, last.req, ManualLease("orders", 2), settings, extra_steps=[step], probe=probe
                )
            )
            # The overwrite landed, the manifest did not: the table already shows job-2 only.
            assert table_rows(settings, store.url, TABLE) == sorted_rows(last.rows)
        res = await commit_dataset(store, last.req, ManualLease("orders", 3), settings, extra_steps=[step])
        assert res.ok, res
        await assert_exactly_once(store, first.staged, last.staged)
        assert (await audit(store, settings=settings, tables={"orders": TABLE})).ok
        assert job_snapshots(settings, store.url, TABLE) == [("orders", "job-1"), ("orders", "job-2")]
        assert table_rows(settings, store.url, TABLE) == sorted_rows(last.rows)


async def test_a_schema_mismatch_quarantines_the_sequence_with_the_reason(
    target: StoreTarget, tmp_path: Path
) -> None:
    settings = table_settings(target, tmp_path)
    async with target.open() as store:
        first = await stage_parquet_job(store, "orders", "job-1")
        step = first.step(TableBinding(table=TABLE, mode="create"))
        assert (
            await commit_dataset(store, first.req, ManualLease("orders", 1), settings, extra_steps=[step])
        ).ok
        bad = await stage_parquet_job(store, "orders", "job-2", extra=True)
        step = bad.step(TableBinding(table=TABLE, mode="append"))
        res = await commit_dataset(store, bad.req, ManualLease("orders", 2), settings, extra_steps=[step])
        assert res.status == "quarantined"
        assert (
            res.quarantined is not None and "schema mismatch" in res.quarantined and "note" in res.quarantined
        )
        assert job_snapshots(settings, store.url, TABLE) == [("orders", "job-1")]
        assert table_rows(settings, store.url, TABLE) == sorted_rows(first.rows)


async def test_append_to_a_missing_table_quarantines(tmp_path: Path, make_target: MakeTarget) -> None:
    target = make_target("local")
    settings = table_settings(target, tmp_path)
    async with target.open() as store:
        job = await stage_parquet_job(store, "orders", "job-1")
        step = job.step(TableBinding(table=TABLE, mode="append"))
        res = await commit_dataset(store, job.req, ManualLease("orders", 1), settings, extra_steps=[step])
        assert res.status == "quarantined" and res.quarantined is not None
        assert "does not exist" in res.quarantined
        assert table_rows(settings, store.url, TABLE) is None


class _ParkingLease(ManualLease):
    """A lease whose check, when the catalog thread calls it just before committing, parks until released."""

    def __init__(self, name: str, epoch: int) -> None:
        super().__init__(name, epoch)
        self.parked = threading.Event()
        self.go = threading.Event()

    def check(self) -> None:
        super().check()
        if threading.current_thread() is not threading.main_thread():
            self.parked.set()
            assert self.go.wait(20), "never released"


async def _until(cond: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + 20
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


_ORDERS = st.permutations(["a_read", "a_commit", "b_read", "b_commit"]).filter(
    lambda p: p.index("a_read") < p.index("a_commit") and p.index("b_read") < p.index("b_commit")
)


_HOLDERS = {
    "order": _ORDERS,
    "mode": st.sampled_from(["append", "create", "overwrite"]),
    "table_first": st.booleans(),
    "ahead": st.booleans(),
}
_FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@hyp_settings(max_examples=8, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(**_HOLDERS)
async def test_two_holders_interleaved_land_one_snapshot_never_two(
    tmp_path_factory: pytest.TempPathFactory, order: list[str], mode: str, table_first: bool, ahead: bool
) -> None:
    await _two_holders(tmp_path_factory, order, mode, table_first, ahead)


@pytest.mark.stress
@hyp_settings(max_examples=60, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(**_HOLDERS)
async def test_two_holders_interleaved_many_examples(
    tmp_path_factory: pytest.TempPathFactory, order: list[str], mode: str, table_first: bool, ahead: bool
) -> None:
    await _two_holders(tmp_path_factory, order, mode, table_first, ahead)


async def _ensure(step: Any, ctx: Any, ahead: bool) -> bool:
    """Run ``step.ensure``; with ``ahead``, after its preparation ran as a run's head start does."""
    from shared.commit import HeadStarts

    if not ahead:
        return bool(await step.ensure(ctx))
    starts = HeadStarts()
    ctx = dataclasses.replace(ctx, head_starts=starts)
    starts.start([step], ctx)
    try:
        return bool(await step.ensure(ctx))
    finally:
        assert await starts.close() is None


async def _two_holders(
    tmp_path_factory: pytest.TempPathFactory, order: list[str], mode: str, table_first: bool, ahead: bool
) -> None:
    """Holder a and b run the same table step; ``order`` interleaves their reads and commits.

    ``ahead``: each holder's step was prepared first (read, staged and its files written) as a run's
    head start does, so its "read" ends parked just before moving the catalog's pointer.
    """
    from shared.commit import StepContext

    tmp = tmp_path_factory.mktemp("two")
    target = StoreTarget("local", (tmp / "store").as_uri(), StoreSettings())
    settings = table_settings(target, tmp)
    async with target.open() as store:
        prior = await stage_parquet_job(store, "orders", "job-0")
        if table_first or mode != "create":
            step0 = prior.step(TableBinding(table=TABLE, mode="create"))
            assert (
                await commit_dataset(
                    store, prior.req, ManualLease("orders", 1), settings, extra_steps=[step0]
                )
            ).ok
        job = await stage_parquet_job(store, "orders", "job-1")
        # Publish the job's files as a commit does, then let two holders race the table step alone.
        for w in job.req.winners:
            for f in w.files:
                src = staged_key("job-1", "orders", w.task, w.attempt, f.path)
                await store.copy(src, published_key("orders", "job-1", w.task, f.path))
        step = job.step(TableBinding(table=TABLE, mode=mode))  # type: ignore[arg-type]
        leases = {"a": _ParkingLease("orders", 2), "b": _ParkingLease("orders", 3)}
        tasks: dict[str, asyncio.Task[bool]] = {}
        for event in order:
            who, what = event.split("_")
            lease = leases[who]
            if what == "read":
                ctx = StepContext(store=store, lease=lease, settings=settings)
                tasks[who] = asyncio.create_task(_ensure(step, ctx, ahead))
                await _until(lambda t=tasks[who], lease=lease: lease.parked.is_set() or t.done())  # type: ignore[misc]
            else:
                lease.go.set()
                await _until(tasks[who].done)
        landed = [await tasks["a"], await tasks["b"]]
        assert sorted(landed) == [False, True], (order, landed)
        snaps = job_snapshots(settings, store.url, TABLE)
        assert snaps.count(("orders", "job-1")) == 1, snaps
        had_prior = table_first or mode != "create"
        want = [job.rows] if mode == "overwrite" or not had_prior else [prior.rows, job.rows]
        assert table_rows(settings, store.url, TABLE) == sorted_rows(*want)


async def test_the_audit_checks_each_manifest_has_one_snapshot_and_each_snapshot_a_manifest(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    target = make_target("local")
    settings = table_settings(target, tmp_path)
    async with target.open() as store:
        bound = await stage_parquet_job(store, "orders", "job-1")
        step = bound.step(TableBinding(table=TABLE, mode="create"))
        assert (
            await commit_dataset(store, bound.req, ManualLease("orders", 1), settings, extra_steps=[step])
        ).ok
        assert (await audit(store, settings=settings, tables={"orders": TABLE})).ok
        # A commit of the dataset that did not go through the table: its manifest has no snapshot.
        unbound = await stage_parquet_job(store, "orders", "job-2")
        assert (await commit_dataset(store, unbound.req, ManualLease("orders", 2), settings)).ok
        report = await audit(store, settings=settings, tables={"orders": TABLE})
        assert [(v.kind, v.key) for v in report.violations] == [
            ("missing_snapshot", "orders/_commits/job-2.json")
        ]
        # A snapshot whose sequence is open is in flight, not a violation; once the log is gone it is.
        third = await stage_parquet_job(store, "orders", "job-3")
        probe, _ = _catalog_crash("after")
        step3 = third.step(TableBinding(table=TABLE, mode="append"))
        await expect_crash(
            commit_dataset(
                store, third.req, ManualLease("orders", 3), settings, extra_steps=[step3], probe=probe
            )
        )
        report = await audit(store, settings=settings)  # the open log's table step names the table
        assert {v.kind for v in report.violations} == {"unfinished_sequence", "missing_snapshot"}
        await store.delete("_wal/orders/job-3.json")
        report = await audit(store, settings=settings, tables={"orders": TABLE})
        assert ("snapshot_without_manifest", "orders/_commits/job-3.json") in [
            (v.kind, v.key) for v in report.violations
        ]
