"""Jobs that share datasets bound to Iceberg and Delta tables, and each table's job order read back.

For the order tests (issue 31 item 2): a bound dataset's task stages real Parquet (the table step reads
it), an unbound one's stages bytes as :func:`tests._support.fleet_jobs.good_job` does. The order of a
table is read as its readers see it: Iceberg's snapshots along the parent chain from the current
snapshot (pyiceberg, the fleet's catalog), Delta's versions from delta-rs' history, each version's
``txn`` from the log file itself.
"""

from __future__ import annotations

import io
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

import msgspec
import pyarrow.parquet as pq
from deltalake import DeltaTable

from shared import Settings
from shared.commit import JOB_PROPERTY, audit, load_table, open_catalog, read_manifest
from shared.events import (
    CommitStarted,
    DatasetExpectation,
    JobFinished,
    JobStarted,
    QueueEvent,
    StagedFile,
    TableBinding,
    TaskFinished,
    staged_key,
)
from shared.storage import ObjectStore
from tests._support.delta import local_root
from tests._support.fleet_checks import admin_events, committed
from tests._support.fleet_jobs import stage_task
from tests._support.process_fleet import Fleet, assert_exactly_once
from tests._support.tables import rows
from tests._support.wait import wait_for


def order_bindings(datasets: Sequence[str], iceberg: int, delta: int) -> dict[str, TableBinding]:
    """Bind the first ``iceberg`` of ``datasets`` to Iceberg tables (one each), the next ``delta`` to Delta.

    Iceberg tables are ``lake.<dataset>``, created by their first commit; a Delta table is created by its
    first append.
    """
    out: dict[str, TableBinding] = {}
    for ds in datasets[:iceberg]:
        out[ds] = TableBinding(table=f"lake.{ds}", mode="create")
    for ds in datasets[iceberg : iceberg + delta]:
        out[ds] = TableBinding(delta=True, mode="append")
    return out


async def _stage_parquet(store: ObjectStore, job: str, dataset: str) -> TaskFinished:
    buf = io.BytesIO()
    pq.write_table(rows(job, 0, 2), buf)
    body = buf.getvalue()
    await store.write(staged_key(job, dataset, 0, 0, "part-0.parquet"), body)
    return TaskFinished(
        job=job,
        dataset=dataset,
        task=0,
        attempt=0,
        files=[StagedFile(path="part-0.parquet", size=len(body))],
        watermarks={"p0": 0},
        finished_at=time.time(),
    )


async def bound_job(
    store: ObjectStore, job: str, datasets: Sequence[str], bindings: Mapping[str, TableBinding]
) -> list[QueueEvent]:
    """Return the events of a one-task-per-dataset job whose ``bindings`` datasets land in their tables."""
    evs: list[QueueEvent] = [
        JobStarted(
            job=job,
            datasets=list(datasets),
            timeout_s=600,
            started_at=time.time(),
            tables={ds: b for ds, b in bindings.items() if ds in datasets},
        )
    ]
    for ds in datasets:
        evs.append(
            await _stage_parquet(store, job, ds) if ds in bindings else await stage_task(store, job, ds, 0, 0)
        )
    expect = {ds: DatasetExpectation(tasks=1, winners=[0]) for ds in datasets}
    evs.append(JobFinished(job=job, datasets=expect, finished_at=time.time()))
    return evs


def iceberg_job_order(settings: Settings, store_url: str, table: str) -> list[str]:
    """Return the jobs of the table's snapshots, oldest first, along the parent chain of the current one.

    Asserts that the chain holds every snapshot of the table (one linear history) and that its sequence
    numbers and snapshot-log order agree with it.
    """
    tbl = load_table(open_catalog(settings, store_url), table)
    assert tbl is not None, f"{table}: no table"
    by_id = {s.snapshot_id: s for s in tbl.metadata.snapshots}
    chain = []
    snap = tbl.current_snapshot()
    while snap is not None:
        chain.append(snap)
        parent = snap.parent_snapshot_id
        snap = by_id.get(parent) if parent is not None else None
    chain.reverse()
    assert len(chain) == len(by_id), f"{table}: {len(by_id) - len(chain)} snapshots off the current chain"
    seqs = [s.sequence_number for s in chain]
    assert seqs == sorted(set(seqs)), f"{table}: sequence numbers {seqs} along the chain"
    assert [e.snapshot_id for e in tbl.metadata.snapshot_log] == [s.snapshot_id for s in chain], (
        f"{table}: the snapshot log disagrees with the parent chain"
    )
    return [(s.summary.get(JOB_PROPERTY, "") if s.summary is not None else "") for s in chain]


async def delta_job_order(store: ObjectStore, dataset: str) -> list[str]:
    """Return the jobs of the Delta table's versions, oldest first, as delta-rs' history names them.

    Asserts each version's log file holds one ``txn`` of the dataset's binding (``commitfleet/<dataset>``,
    docs/tables.md), whose version (the job's sequence) grows with the table's, and names the same job in
    its ``commitInfo``. Local stores only (delta-rs opens the folder in place).
    """
    app_id = f"commitfleet/{dataset}"
    root = local_root(store)
    assert root is not None, "a local store"
    history = sorted(
        (int(h["version"]), str(h["commitfleet"]["job"]))
        for h in DeltaTable(str(root / dataset)).history()
        if isinstance(h.get("commitfleet"), dict)
    )
    assert [v for v, _ in history] == list(range(len(history))), f"{dataset}: versions {history}"
    last_txn = -1
    for version, job in history:
        body = (await store.read(f"{dataset}/_delta_log/{version:020d}.json")).data
        actions = [msgspec.json.decode(line) for line in body.splitlines() if line.strip()]
        txns = [(a["txn"]["appId"], a["txn"]["version"]) for a in actions if "txn" in a]
        assert len(txns) == 1 and txns[0][0] == app_id, f"{dataset} v{version}: txn {txns}"
        assert txns[0][1] > last_txn, f"{dataset} v{version}: txn version {txns[0][1]} after {last_txn}"
        last_txn = txns[0][1]
        infos = [a["commitInfo"]["commitfleet"]["job"] for a in actions if "commitInfo" in a]
        assert infos == [job], f"{dataset} v{version}: commitInfo {infos}, history {job}"
    return [job for _, job in history]


async def assert_job_order(
    fleet: Fleet, jobs: Sequence[str], datasets: Sequence[str], bindings: Mapping[str, TableBinding]
) -> None:
    """Assert every dataset's commits, and every bound table's snapshots or versions, are in ``jobs`` order.

    ``jobs`` is the order the jobs' ``job_finished`` were published in (on every shard). A dataset's
    commits are ordered by the lock epoch each manifest was planned under (one commit per lock hold);
    a table's by its own history. A violation names the datasets and every table out of order, with the
    order found.
    """
    want = list(jobs)
    out_of_order: dict[str, list[str]] = {}
    for ds in datasets:
        manifests = [await read_manifest(fleet.store, ds, job) for job in want]
        epochs = [m.epoch for m in manifests if m is not None]
        assert len(set(epochs)) == len(want), f"{ds}: one commit per job, each under its own lock hold"
        order = [job for _epoch, job in sorted(zip(epochs, want, strict=True))]
        if order != want:
            out_of_order[ds] = order
    tables_out: dict[str, list[str]] = {}
    for ds, b in bindings.items():
        if b.table is not None:
            got = iceberg_job_order(fleet.settings, fleet.settings.store.url, b.table)
        else:
            got = await delta_job_order(fleet.store, ds)
        if got != want:
            tables_out[f"{ds} ({b.table or 'delta'})"] = got
    assert not out_of_order and not tables_out, (
        f"{len(out_of_order)} of {len(datasets)} datasets committed out of job order"
        f"{', e.g. ' + str(next(iter(out_of_order.items()))) if out_of_order else ''}; "
        f"{len(tables_out)} of {len(bindings)} tables out of job order: {tables_out}"
    )


async def jobs_sharing_bound_datasets(
    fleet: Fleet,
    jobs: Sequence[str],
    datasets: Sequence[str],
    bindings: Mapping[str, TableBinding],
    disrupt: Callable[[Fleet], Awaitable[None]],
) -> float:
    """Run ``jobs`` (each on every one of ``datasets``) through a 2-worker fleet while ``disrupt`` runs.

    Each job's ``job_finished`` is published after the previous job's; ``disrupt`` is awaited once the
    events are published (it kills and replaces whatever it likes). Asserts every commit exactly once,
    the audit (tables too) clean and :func:`assert_job_order`. Returns the seconds from the publish to
    the last commit.
    """
    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    fleet.start("worker", "w2")
    await wait_for(lambda: fleet.owners_settled({"w1", "w2"}), timeout=60, what="2 workers")
    events: list[QueueEvent] = []
    for job in jobs:  # each job's job_finished after the previous job's, on every shard
        events += await bound_job(fleet.store, job, datasets, bindings)
    started = time.monotonic()
    await fleet.publisher.publish_many(events)
    await disrupt(fleet)
    for job in jobs:
        await wait_for(
            lambda job=job: committed(fleet.store, datasets, job), timeout=150, interval=0.5, what=f"{job}"
        )
    took = time.monotonic() - started
    await assert_exactly_once(fleet, {(ds, job) for ds in datasets for job in jobs})
    iceberg = {ds: b.table for ds, b in bindings.items() if b.table is not None}
    rep = await audit(fleet.store, settings=fleet.settings, tables=iceberg)
    assert rep.ok, rep.violations[:20]
    await assert_job_order(fleet, jobs, datasets, bindings)
    return took


async def commits_started_by(fleet: Fleet, worker: str, at_least: int) -> bool:
    """Return True once ``worker`` has announced ``at_least`` commit_started events."""
    evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
    return sum(isinstance(e, CommitStarted) and e.worker == worker for e in evs) >= at_least
