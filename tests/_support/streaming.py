"""Structured Streaming end to end: a file source, the driver script, its runs from a checkpoint, the checks.

tests/e2e/test_streaming.py (the fast cases) and tests/e2e/test_streaming_crashes.py
(the crash matrix, marker ``streaming``) run real streaming queries through a
real fleet (``spark_fleet.run_e2e_fleet``: a coordinator and two worker processes,
a local-files store):

- the **source** (:func:`write_source`) is a folder of JSON-lines files of known
  integer ids, one file per micro-batch (``maxFilesPerTrigger`` 1, the files'
  modification times one second apart, so batch *k* reads file *k*);
- the **driver** is this module run as a script (``python -m
  tests._support.streaming SPEC.json``), a separate process the test can SIGKILL:
  a local[2] session, ``readStream.json(source)`` with ``trigger(availableNow=True)``
  (the query ends once the source is consumed), ``foreachBatch`` given
  ``shared.spark.commit_batches``. Its probe appends every point it reaches to a
  trace file and kills its own process (SIGKILL) at the one ``(point, batch)`` the
  spec names: crash points are deterministic, never timed. ``write`` writes the
  batch to two datasets, all rows (bound to an Iceberg table when the spec names
  one: ``create`` for batch 0, then ``append``) and the even ids, and raises after
  the first one in the batch the spec names;
- :class:`StreamApp` is one application (app id, source, checkpoint); each
  :meth:`StreamApp.run` starts the driver from that checkpoint, waits for it to end
  and then ends whatever it left (the JVM, Python workers: found by a marker in
  their environment, killed by pid) before the next run may start;
- the readers (:func:`published_batches`, :func:`table_snapshots`,
  :func:`table_ids`) and :func:`assert_exactly_once` check the outcome: one
  manifest per (batch, dataset), batch *k*'s published rows are file *k*'s, every
  id once in the files and in the table, one snapshot per batch, the stream
  records, nothing staged, no open sequence, the audit clean.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import secrets
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
import redis.asyncio

from shared.commit import JOB_PROPERTY, audit, load_table, open_catalog, read_manifest, read_stream_records
from shared.events import Aborted, AdminEvent, Committed
from shared.fleet import FleetRegistry
from shared.settings import Settings, secret_enc_hook
from shared.storage import ObjectStore
from tests._support.cli import cli_env
from tests._support.demo_processes import MARKER_VAR, kill_all, marked_processes
from tests._support.fleet_checks import admin_events, nothing_under
from tests._support.spark_fleet import SHARDS, WORKERS, E2EFleet, keys_under, md5
from tests._support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
SCHEMA = "id long, name string"
ROWS_PER_FILE = 25
POINTS = ("batch.start", "batch.staged", "batch.committed", "batch.skipped")
# What the snapshot summary of a stream's commit to a bound dataset carries (docs/streaming.md).
STREAM_BATCH = "commitfleet.stream.batch"
STREAM_APP = "commitfleet.stream.app"
STREAM_QUERY = "commitfleet.stream.query"
DRIVER_TIMEOUT = 240.0  # one run of the driver, JVM start included (10-15 s here, 30 under load)


# -- the source ------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A folder of JSON-lines files; ``files[k]`` holds the ids of file k (= micro-batch k)."""

    folder: Path
    files: list[list[int]]

    @property
    def ids(self) -> list[int]:
        return [i for f in self.files for i in f]


def write_source(folder: Path, files: int, rows: int = ROWS_PER_FILE) -> Source:
    """Write ``files`` files of ``rows`` consecutive ids each (``{"id": i, "name": "n<i>"}``).

    Their modification times are one second apart, oldest first: the file source
    takes the oldest files first, so with ``maxFilesPerTrigger`` 1 batch k reads file k.
    """
    folder.mkdir(parents=True)
    start = time.time() - files - 60
    out: list[list[int]] = []
    for k in range(files):
        ids = list(range(k * rows, (k + 1) * rows))
        path = folder / f"part-{k:04d}.json"
        path.write_text("".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in ids))
        os.utime(path, (start + k, start + k))
        out.append(ids)
    return Source(folder, out)


def evens(ids: Iterable[int]) -> list[int]:
    """The ids the second dataset holds (the driver writes ``id % 2 = 0`` there)."""
    return [i for i in ids if i % 2 == 0]


# -- the driver's spec and one run of it ----------------------------------------


class DriverSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one run of the driver script needs (JSON file, its only argument)."""

    app_id: str
    producer: dict[str, Any]  # a ProducerConfig, secrets written out
    source: str
    checkpoint: str
    scratch: str
    datasets: tuple[str, str]  # (all rows, even ids)
    table: str | None = None  # the first dataset's Iceberg table
    max_files: int = 1
    kill_at: tuple[str, int] | None = None  # (probe point, batch id): SIGKILL itself there
    fail_at: int | None = None  # this batch's write raises after the first dataset
    trace: str
    outcomes: str


class BatchLine(msgspec.Struct, frozen=True):
    """What ``BatchCommitter.last`` said after a batch returned to Spark (the driver's outcomes file)."""

    batch: int
    job: str | None  # None when skipped
    skipped: bool
    results: dict[str, str]  # dataset -> status
    manifests: dict[str, str]  # dataset -> the manifest's key (of the job that committed the batch)


@dataclass
class DriverRun:
    """What one run of the driver did: exit code, log, the probe points reached, the batches returned."""

    n: int
    rc: int
    log: str
    trace: list[tuple[str, int]]
    query: str  # the streaming query's id (the same on every run from one checkpoint)
    outcomes: list[BatchLine]
    seconds: float

    @property
    def killed(self) -> bool:
        return self.rc == -signal.SIGKILL

    def describe(self) -> str:
        return f"run {self.n}: rc {self.rc} after {self.seconds:.1f}s, trace {self.trace}\n{self.log[-6000:]}"

    def assert_killed_at(self, point: str, batch: int) -> None:
        """The run ended by its own SIGKILL at ``(point, batch)``: the last probe point it reached."""
        assert self.killed, self.describe()
        assert self.trace and self.trace[-1] == (point, batch), self.describe()

    @property
    def failure(self) -> str:
        """What the driver printed about the query's failure ("" when it did not fail): the exception
        ``awaitTermination`` raised, which carries the batch's Python traceback and error."""
        _, found, rest = self.log.partition("query failed: ")
        return rest if found else ""

    def assert_completed(self) -> None:
        """The run consumed the source and exited 0."""
        assert self.rc == 0 and "query done" in self.log, self.describe()


def _processes_gone(marker: str, work: Path) -> bool:
    left = marked_processes(marker, work)
    kill_all(left)
    return not left


@dataclass
class StreamApp:
    """One streaming application: its id, source, checkpoint and datasets, and every run of its driver."""

    fleet: E2EFleet
    work: Path
    app_id: str
    source: Source
    datasets: tuple[str, str]
    table: str | None = None
    runs: list[DriverRun] = field(default_factory=list)

    @property
    def checkpoint(self) -> Path:
        return self.work / "checkpoint"

    def spec(self, n: int, **extra: Any) -> DriverSpec:
        producer = msgspec.to_builtins(self.fleet.producer, enc_hook=secret_enc_hook)
        run_dir = self.work / f"run-{n}"
        return DriverSpec(
            app_id=self.app_id,
            producer=producer,
            source=str(self.source.folder),
            checkpoint=str(self.checkpoint),
            scratch=str(run_dir / "spark"),
            datasets=self.datasets,
            table=self.table,
            trace=str(run_dir / "trace"),
            outcomes=str(run_dir / "outcomes.jsonl"),
            **extra,
        )

    async def run(
        self,
        *,
        kill_at: tuple[str, int] | None = None,
        fail_at: int | None = None,
        timeout: float = DRIVER_TIMEOUT,
    ) -> DriverRun:
        """Run the driver from the app's checkpoint until it exits; end what it left; return the run.

        ``kill_at``: the driver SIGKILLs itself at that probe point of that batch.
        ``fail_at``: that batch's ``write`` raises after writing the first dataset.
        """
        assert kill_at is None or kill_at[0] in POINTS, kill_at
        n = len(self.runs) + 1
        run_dir = self.work / f"run-{n}"
        run_dir.mkdir(parents=True)
        spec = self.spec(n, kill_at=kill_at, fail_at=fail_at)
        spec_path = run_dir / "spec.json"
        spec_path.write_bytes(msgspec.json.encode(spec))
        marker = secrets.token_hex(8)
        env = cli_env(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **{MARKER_VAR: marker})
        log_path = run_dir / "driver.log"
        started = time.monotonic()
        with open(log_path, "wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests._support.streaming",
                str(spec_path),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                cwd=run_dir,
                env=env,
                start_new_session=True,
            )
            try:
                async with asyncio.timeout(timeout):
                    rc = await proc.wait()
            except TimeoutError:
                rc = None
            finally:
                # The driver's JVM and Python workers outlive a killed driver for a moment: none may
                # still touch the checkpoint when the next run starts.
                if proc.returncode is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    await proc.wait()
                await wait_for(
                    lambda: asyncio.to_thread(_processes_gone, marker, run_dir),
                    timeout=30,
                    interval=0.2,
                    what=f"the processes of driver run {n} to end",
                )
        seconds = time.monotonic() - started
        log_text = log_path.read_text(errors="replace")
        trace_lines = Path(spec.trace).read_text().splitlines() if Path(spec.trace).exists() else []
        query = next((line.split()[1] for line in trace_lines if line.startswith("query ")), "")
        trace = [(p, int(b)) for p, b in (line.split() for line in trace_lines if line.startswith("batch."))]
        outcomes_path = Path(spec.outcomes)
        outcomes = [
            msgspec.json.decode(line, type=BatchLine)
            for line in (outcomes_path.read_bytes().splitlines() if outcomes_path.exists() else [])
            if line.strip()
        ]
        if rc is None:
            raise AssertionError(f"driver run {n} ran longer than {timeout}s\n{log_text[-6000:]}")
        run = DriverRun(n, rc, log_text, trace, query, outcomes, seconds)
        self.runs.append(run)
        sys.stderr.write(f"[figure] {self.app_id} run {n}: rc {rc}, {seconds:.1f}s, trace {trace}\n")
        return run

    def forget_checkpoint(self) -> None:
        """Delete the checkpoint folder (the next run is a new query from batch 0)."""
        shutil.rmtree(self.checkpoint)


# -- readers ---------------------------------------------------------------------


@dataclass(frozen=True)
class BatchCommit:
    """One manifest of a stream's batch: the job that committed it and the ids its files hold."""

    batch: int
    job: str
    ids: list[int]


def batch_of(app_id: str, job: str) -> int | None:
    """The batch id of a job ``<app_id>-b<batch>-<8 hex>``, or None for another app's job."""
    m = re.fullmatch(re.escape(app_id) + r"-b(\d+)-[0-9a-f]{8}", job)
    return int(m.group(1)) if m else None


async def published_batches(store: ObjectStore, dataset: str, app_id: str) -> list[BatchCommit]:
    """Every manifest of ``app_id``'s jobs in ``dataset`` with the ids of the Parquet files it lists.

    The files' sizes and MD5s are checked against the manifest; every published
    file of the dataset (outside ``_commits/``) must be listed by one of its manifests.
    """
    out: list[BatchCommit] = []
    listed: set[str] = set()
    for key in await keys_under(store, f"{dataset}/_commits/"):
        job = key.rsplit("/", 1)[1].removesuffix(".json")
        manifest = await read_manifest(store, dataset, job)
        assert manifest is not None, key
        listed |= {f.key for f in manifest.files}
        batch = batch_of(app_id, job)
        if batch is None:
            continue
        ids: list[int] = []
        for f in manifest.files:
            data = (await store.read(f.key)).data
            assert (len(data), md5(data)) == (f.size, f.md5), f.key
            ids += pq.read_table(io.BytesIO(data)).column("id").to_pylist()
        out.append(BatchCommit(batch, job, ids))
    published = {k for k in await keys_under(store, f"{dataset}/") if "/_commits/" not in k}
    assert published == listed, f"{dataset}: published files not listed by a manifest: {published - listed}"
    return sorted(out, key=lambda c: (c.batch, c.job))


def table_snapshots(settings: Settings, table: str) -> list[dict[str, str]]:
    """The summaries of the table's snapshots, oldest first."""
    tbl = load_table(open_catalog(settings, settings.store.url), table)
    assert tbl is not None, f"table {table} does not exist"
    return [dict(s.summary.additional_properties) for s in tbl.metadata.snapshots if s.summary is not None]


def table_ids(settings: Settings, table: str) -> list[int]:
    """Every id the table's current snapshot holds (duplicates kept), sorted."""
    tbl = load_table(open_catalog(settings, settings.store.url), table)
    assert tbl is not None, f"table {table} does not exist"
    return sorted(tbl.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


async def app_events(r: redis.asyncio.Redis, fleet: E2EFleet, app_id: str) -> list[AdminEvent]:
    """The admin events (commits, aborts) of the app's jobs."""
    return [
        e
        for e in await admin_events(r, fleet.settings.fleet.name)
        if isinstance(e, Committed | Aborted) and batch_of(app_id, e.job) is not None
    ]


async def fleet_settled(fleet: E2EFleet, r: redis.asyncio.Redis) -> bool:
    """True when both workers own every shard, none moving, their tokens in place (as the ``fleet``
    fixture of spark_fleet waits for); a fleet process that exited fails the test."""
    for p in fleet.procs:
        assert p.proc.poll() is None or p.proc.returncode == 0, f"{p.name} exited with {p.proc.returncode}"
    registry = FleetRegistry(r, fleet.keys)
    a = await registry.assignment(SHARDS)
    if set(a.owners()) != WORKERS or any(s.owner not in WORKERS or s.moving_to for s in a.slots):
        return False
    tokens = await registry.owner_tokens(SHARDS)
    return all(
        t is not None and t.decode().split("@")[0] == s.owner for s, t in zip(a.slots, tokens, strict=True)
    )


async def no_open_work(store: ObjectStore, app: StreamApp) -> bool:
    """True when no commit sequence of the app's datasets is open and nothing of its jobs is staged."""
    for ds in app.datasets:
        if not await nothing_under(store, f"_wal/{ds}/"):
            return False
    staged = await keys_under(store, "_staging/")
    return not [k for k in staged if batch_of(app.app_id, k.split("/")[1]) is not None]


# -- the checks ------------------------------------------------------------------


async def assert_exactly_once(
    app: StreamApp,
    store: ObjectStore,
    r: redis.asyncio.Redis,
    *,
    query: str,
    batches: int | None = None,
    announced_from: int = 0,
) -> dict[str, list[BatchCommit]]:
    """Check a stream that consumed its source: every id once, one manifest per (batch, dataset).

    ``query``: the query id every commit's record must name. ``batches``: how
    many batches (default: one per source file). Checked: no open sequence and
    nothing staged for the app's jobs; per dataset, exactly one manifest per
    batch, batch k's ids are file k's (the evens of it for the second dataset),
    every source id once; the stream record names the last batch, its job and
    ``query``; one ``committed`` admin event per manifest (of the batches from
    ``announced_from`` on: the admin stream of a flushed Redis forgot the earlier
    ones; none twice), none for another job of the app; the table (if bound)
    holds every id once, in one snapshot per batch carrying the app, batch and
    query; the audit is clean. Returns the commits per dataset.
    """
    n = len(app.source.files) if batches is None else batches
    await wait_for(lambda: no_open_work(store, app), timeout=60, what=f"{app.app_id}: nothing open or staged")
    out: dict[str, list[BatchCommit]] = {}
    for ds, keep in zip(app.datasets, (list, evens), strict=True):
        commits = await published_batches(store, ds, app.app_id)
        assert [c.batch for c in commits] == list(range(n)), f"{ds}: one manifest per batch: {commits}"
        for c in commits:
            assert sorted(c.ids) == keep(app.source.files[c.batch]), f"{ds} batch {c.batch}: {c.ids}"
        ids = sorted(i for c in commits for i in c.ids)
        assert ids == keep(app.source.ids), f"{ds}: every id exactly once"
        record = (await read_stream_records(store, app.app_id, [ds])).get(ds)
        assert record is not None, f"{ds}: no stream record for {app.app_id}"
        assert (record.batch, record.query, record.job) == (n - 1, query, commits[-1].job), record
        out[ds] = commits
    every = {(ds, c.job) for ds, commits in out.items() for c in commits}
    jobs = {(ds, job) for ds, job in every if (batch_of(app.app_id, job) or 0) >= announced_from}

    async def announced() -> bool:
        evs = await app_events(r, app.fleet, app.app_id)
        return jobs <= {(e.dataset, e.job) for e in evs if isinstance(e, Committed)}

    await wait_for(announced, timeout=60, what=f"{app.app_id}: every commit announced")
    evs = await app_events(r, app.fleet, app.app_id)
    counts = Counter((e.dataset, e.job) for e in evs if isinstance(e, Committed))
    assert jobs <= set(counts) <= every and set(counts.values()) == {1}, f"committed events: {counts}"
    tables: dict[str, str] = {}
    if app.table is not None:
        tables[app.datasets[0]] = app.table
        assert table_ids(app.fleet.settings, app.table) == app.source.ids, "the table holds every id once"
        snapshots = table_snapshots(app.fleet.settings, app.table)
        ours = [s for s in snapshots if batch_of(app.app_id, s.get(JOB_PROPERTY, "")) is not None]
        marks = [(s.get(STREAM_APP), s.get(STREAM_BATCH), s[JOB_PROPERTY], s.get(STREAM_QUERY)) for s in ours]
        want = [(app.app_id, str(c.batch), c.job, query) for c in out[app.datasets[0]]]
        assert marks == want, ours
    ended = {e.job for e in evs} | {c.job for commits in out.values() for c in commits}
    report = await audit(store, ended_jobs=ended, settings=app.fleet.settings, tables=tables)
    assert report.ok, report.violations
    return out


# -- the driver script -----------------------------------------------------------


class InjectedBatchFailure(RuntimeError):
    """Raised by the driver's ``write`` in the batch the spec's ``fail_at`` names."""


def main(spec_path: str) -> int:
    """Run the spec's streaming query from its checkpoint: 0 once the source is consumed, 1 if it failed."""
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import DataFrame

    from shared.settings import secret_dec_hook
    from shared.spark import ProducerConfig, commit_batches, local_spark_session, max_watermark

    spec = msgspec.json.decode(Path(spec_path).read_bytes(), type=DriverSpec)
    config = msgspec.convert(spec.producer, ProducerConfig, dec_hook=secret_dec_hook)
    trace = open(spec.trace, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    outcomes = open(spec.outcomes, "ab", buffering=0)  # noqa: SIM115

    def probe(point: str, batch_id: int) -> None:
        trace.write(f"{point} {batch_id}\n")
        trace.flush()
        if spec.kill_at is not None and (point, batch_id) == tuple(spec.kill_at):
            os.kill(os.getpid(), signal.SIGKILL)

    def write(job: Any, df: DataFrame, batch_id: int) -> None:
        everything, even = spec.datasets
        mode = "create" if batch_id == 0 else "append"
        job.write_dataset(df, everything, watermarks=max_watermark("id"), table=spec.table, mode=mode)
        if batch_id == spec.fail_at:
            raise InjectedBatchFailure(f"injected failure in batch {batch_id}")
        job.write_dataset(df.where("id % 2 = 0"), even, watermarks=max_watermark("id"))

    committer = commit_batches(
        write, app_id=spec.app_id, datasets=list(spec.datasets), config=config, probe=probe
    )

    def on_batch(df: DataFrame, batch_id: int) -> None:
        committer(df, batch_id)
        last = committer.last
        assert last is not None
        statuses = {k: v.status for k, v in last.results.items()}
        manifests = {k: v.manifest for k, v in last.results.items()}
        line = BatchLine(last.batch_id, last.job_id, last.skipped, statuses, manifests)
        outcomes.write(msgspec.json.encode(line) + b"\n")

    spark = local_spark_session(f"stream-{spec.app_id}", master="local[2]", tmp_dir=spec.scratch)
    spark.sparkContext.setLogLevel("ERROR")
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", spec.max_files)
        .json(spec.source)
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", spec.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    trace.write(f"query {query.id} {query.runId}\n")
    try:
        query.awaitTermination()
    except StreamingQueryException as exc:  # what the batch raised is in its text
        sys.stderr.write(f"query failed: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
        spark.stop()
        return 1
    sys.stdout.write("query done\n")
    sys.stdout.flush()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
