"""Per micro-batch overhead of a Structured Streaming query committed through a fleet: the benchmark
(run as ``python -m tests.bench.streaming_overhead``).

One local SparkSession, one fleet of processes (a coordinator and ``--workers``
workers) per store, the same source for every query: ``rate-micro-batch`` with
``--rows`` rows in each of P partitions per batch (no shuffle: P tasks write P
files). For each P of ``--partitions`` it runs one query per side, each on a
fresh checkpoint, the sides interleaved ``--rounds`` times (their batches
pooled):

- ``parquet``: Spark's own file sink, ``writeStream.format("parquet")``;
- ``fleet``: ``foreachBatch(commit_batches(...))``: every batch staged by the
  executors' task writer and committed exactly once by the fleet, the driver
  waiting for the outcome before Spark moves on;
- ``fleet-cloud`` (latency store only): the same with the producer on the
  latency model too (below).

Each query runs ``--warmup`` batches that are not counted, then ``--batches``
that are. A batch's duration is Spark's own figure from
``StreamingQueryListener.onQueryProgress`` (``durationMs.triggerExecution``:
the whole micro-batch, checkpoint writes included; ``addBatch``: the sink's
part). The fleet side also times its phases (:data:`PHASES`) through the
committer's probe, a mark in the write function, the ``committed`` admin
events (the commit's own duration, when it was announced) and the result
records' time, so the driver's polling delay is measured, not guessed. Every
counted fleet batch is checked committed (its manifest), every parquet
query's rows counted.

Two stores (``--stores``):

- ``local``: local files on disk for everything (the sink's output, the
  checkpoints, the fleet's store);
- ``latency``: the fleet's store on /dev/shm behind ``store.model_latency_ms``
  (lognormal, median ``--latency-ms``, p99 ``--latency-p99-ms``), the sink's
  output and checkpoints on /dev/shm too. Spark's file sink writes through
  Hadoop's local file system, which cannot be given the model; so the
  ``fleet`` side's producer (driver and executors) writes the store without
  it, as the sink does, and the modelled round trips are what the fleet adds:
  its commit. ``fleet-cloud`` runs the producer on the model too (every
  task's staged write pays it), which is what a cloud store would cost the
  fleet's side; the file sink's own writes would pay a cloud's latency too,
  which is not modelled.

On the latency store the commit's critical path is measured (one streaming
commit of P files alone through the commit core, lock to release: its
``CountingStore`` rounds, its round trips with the waves of parallel copies,
its p50 on the model) and the report gives (fleet p50 - parquet p50) /
(round trips x latency), the issue's target being at most 1.5. The defaults
(P = 1, 10, 100, 2 rounds of 50 batches) take about 50 minutes on 2 cores::

    .venv/bin/python -m tests.bench.streaming_overhead --partitions 1,10,100 --stores local,latency
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from shared import Settings, load_settings
from shared.commit import CommitRequest, WinningAttempt, commit_dataset, read_manifest
from shared.events import Committed, StagedFile, StreamBatch, lock_name, staged_key
from shared.fleet import FleetRegistry
from shared.locks import StorageLock
from shared.queue import Keys, SyncPublisher, connect, connect_sync, ensure_fleet_sync, read_admin_range
from shared.spark import ProducerConfig, commit_batches, local_spark_session
from shared.storage import CountingStore, LatencyModel, LatencyStore, open_store
from tests._support.processes import FleetProcess, ThrowawayRedis, write_config

SHARDS = 8
SIDES = ("parquet", "fleet", "fleet-cloud")
MODELLED_ONLY = ("fleet-cloud",)
"""Sides that run only on the latency store (elsewhere they are the same as ``fleet``)."""
STORES = ("local", "latency")
_SHM = Path("/dev/shm") if Path("/dev/shm").is_dir() else None


@dataclass(frozen=True, slots=True)
class Options:
    """What to run (the command line's options)."""

    batches: int = 50
    warmup: int = 3
    partitions: tuple[int, ...] = (1, 10, 100)
    rows: int = 100
    stores: tuple[str, ...] = STORES
    latency_ms: float = 20.0
    latency_p99_ms: float = 0.0
    workers: int = 2
    master: str = "local[2]"
    redis_url: str = ""
    sides: tuple[str, ...] = SIDES
    rounds: int = 2
    """Each P's sides run this many times, interleaved; their batches are pooled."""
    warm: bool = True
    """First run every side once, uncounted, on the first P (JIT, Python workers, cached clients)."""

    @property
    def p99_ms(self) -> float:
        """The modelled p99 (5 x the median unless given)."""
        return self.latency_p99_ms or 5 * self.latency_ms


PHASES = {
    "setup": "batch.start -> the user's write begins (the run record, JobStarted, the preflight, heartbeat)",
    "write": "the user's write -> batch.staged (the Spark action: tasks stage and publish)",
    "wait": "batch.staged -> batch.committed (JobFinished, the fleet's commit, the driver's wait)",
    "fleet": "batch.staged -> the result record written (the fleet's part of the wait)",
    "commit": "the commit's own time under the lock, its claim and release not in it (committed.duration_s)",
    "record": "committed announced -> the result record written (the worker's status save)",
    "poll": "the result record written -> seen by the driver (its polling delay)",
}
"""The fleet side's phases of a batch (ms), measured through the probe, the write function, the
``committed`` events and the result records."""


@dataclass(slots=True)
class Batch:
    """One counted micro-batch: Spark's figures, and on the fleet side its phases (see PHASES)."""

    batch: int
    trigger_ms: float
    add_ms: float
    phases: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Run:
    """One query's counted batches."""

    store: str
    side: str
    partitions: int
    batches: list[Batch] = field(default_factory=list)


@dataclass(slots=True)
class Report:
    """Every run, and per P the commit's critical path (latency store only)."""

    options: Options
    runs: list[Run] = field(default_factory=list)
    paths: dict[int, CriticalPath] = field(default_factory=dict)
    """Per P (latency store only): the commit's counted rounds and round trips."""

    def add(self, run: Run) -> None:
        """Pool ``run``'s batches with an earlier run of the same (store, side, P)."""
        known = self.run(run.store, run.side, run.partitions)
        if known is None:
            self.runs.append(run)
        else:
            known.batches += run.batches

    def run(self, store: str, side: str, partitions: int) -> Run | None:
        """Return the run of (store, side, P), if it was measured."""
        return next(
            (r for r in self.runs if (r.store, r.side, r.partitions) == (store, side, partitions)), None
        )


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of ``values`` (with fewer than 100 values p99 is the max)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# -- Spark's progress ------------------------------------------------------------


class ProgressLog:
    """The session's ``onQueryProgress`` events, per query id (a StreamingQueryListener's body)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_query: dict[str, list[tuple[int, dict[str, int]]]] = {}

    def add(self, query: str, batch: int, duration: dict[str, int]) -> None:
        with self._lock:
            self._by_query.setdefault(query, []).append((batch, duration))

    def of(self, query: str) -> list[tuple[int, dict[str, int]]]:
        with self._lock:
            return sorted(self._by_query.get(query, []))


def add_listener(spark: Any, log: ProgressLog) -> None:
    """Register a listener that records every query's progress into ``log``."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Listener(StreamingQueryListener):  # type: ignore[misc]
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            if p.numInputRows:  # a batch that ran (not an idle trigger)
                log.add(str(p.id), int(p.batchId), dict(p.durationMs))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    spark.streams.addListener(Listener())


# -- the fleet -------------------------------------------------------------------


@dataclass
class BenchFleet:
    """A running fleet: its settings, the producer config for it, its processes."""

    settings: Settings
    procs: list[FleetProcess]

    def producer(self, side: str) -> ProducerConfig:
        """The producer's config of ``side``: ``fleet-cloud`` with the fleet's latency model, ``fleet``
        on the plain store."""
        store = self.settings.store if side == "fleet-cloud" else _plain(self.settings)
        cfg = ProducerConfig.from_settings(self.settings, job_timeout=60.0, app="bench")
        return msgspec.structs.replace(cfg, store=store, wait_timeout=120.0)

    def logs(self) -> str:
        return "".join(f"\n===== {p.name} ({p.kind}) =====\n{p.output()[-4000:]}" for p in self.procs)


def bench_settings(redis_url: str, root: Path, latency_ms: float, p99_ms: float) -> Settings:
    """The fleet's settings: defaults but for the fleet's name, Redis, store and a quiet log."""
    return load_settings(
        env={},
        overrides={
            "fleet": {"name": f"sbench-{secrets.token_hex(3)}", "shards": SHARDS},
            "redis": {"url": redis_url},
            "store": {
                "url": root.as_uri(),
                "model_latency_ms": latency_ms,
                "model_latency_p99_ms": p99_ms if latency_ms else 0.0,
            },
            "coordinator": {"tick": 0.2, "http_port": 0},
            "log": {"level": "WARNING", "format": "json"},
        },
    )


@contextlib.contextmanager
def running_fleet(settings: Settings, workers: int, work: Path) -> Iterator[BenchFleet]:
    """Start a coordinator and ``workers`` workers; yield once every shard has a settled owner."""
    config = write_config(settings, work / f"{settings.fleet.name}.toml")
    client = connect_sync(settings.redis)
    try:
        ensure_fleet_sync(client, settings.fleet.name, SHARDS)
    finally:
        client.close()
    procs = [FleetProcess("coordinator", "c1", config, work)]
    procs += [FleetProcess("worker", f"w{i}", config, work) for i in range(workers)]
    fleet = BenchFleet(settings, procs)
    try:
        asyncio.run(_settled(settings, {f"w{i}" for i in range(workers)}, procs))
        yield fleet
    except BaseException:
        sys.stderr.write(fleet.logs())
        raise
    finally:
        for p in procs:
            p.close()


async def _settled(settings: Settings, workers: set[str], procs: list[FleetProcess]) -> None:
    r = connect(settings.redis)
    registry = FleetRegistry(r, Keys(settings.fleet.name))
    deadline = time.monotonic() + 60
    try:
        while True:
            for p in procs:
                if p.proc.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.proc.returncode}")
            a = await registry.assignment(SHARDS)
            if set(a.owners()) == workers and all(s.owner in workers and not s.moving_to for s in a.slots):
                tokens = await registry.owner_tokens(SHARDS)
                if all(t is not None for t in tokens):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("the fleet did not settle within 60 s")
            await asyncio.sleep(0.1)
    finally:
        await r.aclose()


async def committed_events(settings: Settings, prefix: str) -> dict[str, tuple[float, float]]:
    """Return job -> (announced at, from the entry id; the commit's own seconds) of jobs starting with
    ``prefix``."""
    r = connect(settings.redis)
    try:
        out: dict[str, tuple[float, float]] = {}
        for entry_id, ev in await read_admin_range(r, Keys(settings.fleet.name)):
            if isinstance(ev, Committed) and ev.job.startswith(prefix):
                out[ev.job] = (int(entry_id.split(b"-")[0]) / 1000, ev.duration_s)
        return out
    finally:
        await r.aclose()


@dataclass(frozen=True, slots=True)
class CriticalPath:
    """One streaming commit of P files alone (lock to release), as the commit core runs it in a worker."""

    rounds: int
    """Sequential rounds as ``CountingStore`` counts them (busy periods)."""
    widths: list[int]
    requests: int
    trips: float
    """Round trips on the critical path: the parallel copies and deletes run in waves of
    ``commit.publish_concurrency``, so a busy period of more files than that is several trips.
    Measured: (wall time with a constant modelled latency - without) / that latency."""
    core_ms: list[float]
    """The same commit's wall times on the lognormal model (the core alone, no fleet)."""


async def critical_path(
    settings: Settings, files: int, *, trip_s: float = 0.05, samples: int = 11
) -> CriticalPath:
    """Measure one streaming commit of ``files`` staged files, lock to release, in this process.

    Micro-batches of one app are committed one after the other through the
    commit core (the stream gate reads the record under the lock, as in a
    worker); the first (it creates the dataset's documents) is not measured.
    """
    app, ds = f"rounds{secrets.token_hex(3)}", f"rounds-{secrets.token_hex(3)}"
    batch = 0

    async with open_store(settings.store.url, _plain(settings)) as raw:

        async def commit(store: Any) -> float:
            nonlocal batch
            job = f"{app}-b{batch}-{secrets.token_hex(4)}"
            winners = []
            for t in range(files):
                await raw.write(staged_key(job, ds, t, 0, "part-0.parquet"), b"x" * 64)
                winners.append(
                    WinningAttempt(task=t, attempt=0, files=[StagedFile(path="part-0.parquet", size=64)])
                )
            req = CommitRequest(
                dataset=ds,
                job=job,
                winners=winners,
                expected_tasks=files,
                stream=StreamBatch(app_id=app, batch=batch, query="q-rounds"),
            )
            batch += 1
            t0 = time.perf_counter()
            lock = StorageLock(store, lock_name(ds), owner="bench-rounds", settings=settings.lock)
            async with lock.hold() as lease:
                result = await commit_dataset(store, req, lease, settings)
            seconds = time.perf_counter() - t0
            if result.status != "committed":
                raise RuntimeError(f"the measured commit did not commit: {result.status}")
            return seconds

        await commit(raw)
        counting = CountingStore(raw)
        await commit(counting)
        plain = min([await commit(raw) for _ in range(3)])
        constant = LatencyStore(raw, LatencyModel(trip_s, trip_s))
        slow = min([await commit(constant) for _ in range(3)])
        model = LatencyModel(
            settings.store.model_latency_ms / 1000, settings.store.model_latency_p99_ms / 1000
        )
        core = [await commit(LatencyStore(raw, model)) * 1000 for _ in range(samples)]
    return CriticalPath(
        rounds=counting.rounds,
        widths=list(counting.widths),
        requests=counting.total,
        trips=(slow - plain) / trip_s,
        core_ms=core,
    )


# -- one query -------------------------------------------------------------------


def write_one(dataset: str, probe: Probe) -> Callable[[Any, Any, int], None]:
    """The user's ``write``: the batch as one dataset, one staged file per partition."""

    def write(job: Any, df: Any, batch_id: int) -> None:
        probe("write.begin", batch_id)
        job.write_dataset(df, dataset)

    return write


Probe = Callable[[str, int], None]


@dataclass
class Marks:
    """The probe's timestamps per batch: point -> (perf_counter, wall time)."""

    at: dict[int, dict[str, tuple[float, float]]] = field(default_factory=dict)

    def probe(self, point: str, batch_id: int) -> None:
        self.at.setdefault(batch_id, {})[point] = (time.perf_counter(), time.time())


def run_query(
    spark: Any,
    log: ProgressLog,
    *,
    p: int,
    opts: Options,
    where: Path,
    sink: Callable[[Any], Any],
    counted: int,
) -> tuple[str, list[tuple[int, dict[str, int]]]]:
    """Start a query on the rate-micro-batch source with ``sink`` (``df -> DataStreamWriter``), wait
    for ``opts.warmup + counted`` batches, stop it; return its id and the progress of the counted ones.

    Raises:
        RuntimeError: the query ended by itself (its error), or did not get that far in time.
    """
    df = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", opts.rows * p)
        .option("numPartitions", p)
        .load()
        .selectExpr("value AS id", "timestamp AS ts", "concat('row-', CAST(value AS STRING)) AS name")
    )
    total = opts.warmup + counted
    query = sink(df).option("checkpointLocation", str(where / "checkpoint")).start()
    qid = str(query.id)
    deadline = time.monotonic() + 120 + total * (2 + p * 0.2)
    try:
        while len(log.of(qid)) < total:
            if not query.isActive:
                raise RuntimeError(f"query {qid} ended: {query.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"query {qid}: {len(log.of(qid))} of {total} batches in time")
            time.sleep(0.05)
    finally:
        query.stop()
    progress = [(b, d) for b, d in log.of(qid) if opts.warmup <= b < total]
    return qid, progress


def parquet_run(spark: Any, log: ProgressLog, store: str, p: int, opts: Options, where: Path) -> Run:
    """Spark's own file sink."""

    def sink(df: Any) -> Any:
        return df.writeStream.format("parquet").option("path", str(where / "out"))

    _qid, progress = run_query(spark, log, p=p, opts=opts, where=where, sink=sink, counted=opts.batches)
    run = Run(store, "parquet", p)
    run.batches = [Batch(b, d["triggerExecution"], d["addBatch"]) for b, d in progress]
    rows = spark.read.parquet(str(where / "out")).count()
    if rows < opts.rows * p * (opts.warmup + opts.batches):
        raise RuntimeError(f"parquet sink wrote {rows} rows, fewer than its batches hold")
    return run


def fleet_run(
    spark: Any, log: ProgressLog, fleet: BenchFleet, store: str, side: str, p: int, opts: Options, where: Path
) -> Run:
    """The fleet's committer in ``foreachBatch``; every counted batch checked committed (manifest)."""
    app = f"sb{secrets.token_hex(3)}"
    dataset = f"stream-{app}"
    config = fleet.producer(side)
    marks = Marks()
    committer = commit_batches(
        write_one(dataset, marks.probe), app_id=app, datasets=[dataset], config=config, probe=marks.probe
    )
    total = opts.warmup + opts.batches
    written: dict[int, float] = {}

    def each(df: Any, batch_id: int) -> None:
        if batch_id < total:  # batches after the counted ones (before the stop) commit nothing
            committer(df, batch_id)
            last = committer.last
            assert last is not None and last.batch_id == batch_id and not last.skipped
            written[batch_id] = last.results[dataset].at

    def sink(df: Any) -> Any:
        return df.writeStream.foreachBatch(each)

    _qid, progress = run_query(spark, log, p=p, opts=opts, where=where, sink=sink, counted=opts.batches)
    events = asyncio.run(committed_events(fleet.settings, f"{app}-b"))
    by_batch = {int(job[len(app) + 2 :].split("-")[0]): (job, ev) for job, ev in events.items()}
    asyncio.run(_check_manifests(fleet.settings, dataset, [by_batch[b][0] for b, _ in progress], p))
    run = Run(store, side, p)
    points = ("batch.start", "write.begin", "batch.staged", "batch.committed")
    for b, d in progress:
        start, begin, staged, done = (marks.at[b][k] for k in points)
        announced, own = by_batch[b][1]
        phases = {
            "setup": begin[0] - start[0],
            "write": staged[0] - begin[0],
            "wait": done[0] - staged[0],
            "fleet": written[b] - staged[1],
            "commit": own,
            "record": written[b] - announced,
            "poll": done[1] - written[b],
        }
        run.batches.append(
            Batch(b, d["triggerExecution"], d["addBatch"], {k: v * 1000 for k, v in phases.items()})
        )
    return run


async def _check_manifests(settings: Settings, dataset: str, jobs: list[str], p: int) -> None:
    async with open_store(settings.store.url, _plain(settings)) as store:
        for job in jobs:
            manifest = await read_manifest(store, dataset, job)
            if manifest is None or len(manifest.files) != p:
                raise RuntimeError(f"{dataset} job {job}: no manifest of {p} files")


def _plain(settings: Settings) -> Any:
    return msgspec.structs.replace(settings.store, model_latency_ms=0.0, model_latency_p99_ms=0.0)


# -- the whole run ---------------------------------------------------------------


def run(opts: Options, out: TextIO) -> Report:
    """Run every (store, P, side) of ``opts``; print and return the report."""
    report = Report(opts)
    work = Path(tempfile.mkdtemp(prefix="cf-stream-bench-"))
    cleanup = [work]
    server: ThrowawayRedis | None = None
    spark: Any = None
    try:
        redis_url = opts.redis_url
        if not redis_url:
            server = ThrowawayRedis(work)
            redis_url = server.url
        t0 = time.monotonic()
        spark = local_spark_session("bench-streaming", master=opts.master, tmp_dir=work / "spark")
        # Stopping a query interrupts the batch after the counted ones, whose tasks log their abort
        # as errors; a real failure surfaces as the query's exception (run_query raises it).
        spark.sparkContext.setLogLevel("OFF")
        log = ProgressLog()
        add_listener(spark, log)
        out.write(f"session ready in {time.monotonic() - t0:.1f}s\n")
        for store in opts.stores:
            base = work
            if store == "latency" and _SHM is not None:
                base = Path(tempfile.mkdtemp(prefix="cf-stream-bench-", dir=_SHM))
                cleanup.append(base)
            root = base / "store"
            root.mkdir()
            lat = opts.latency_ms if store == "latency" else 0.0
            settings = bench_settings(redis_url, root, lat, opts.p99_ms)
            logs = base / f"logs-{store}"
            logs.mkdir()
            with running_fleet(settings, opts.workers, logs) as fleet:
                sides = [x for x in opts.sides if lat or x not in MODELLED_ONLY]
                warm = dataclasses.replace(opts, batches=1, warmup=2)
                for side in sides if opts.warm else []:
                    _one(spark, log, fleet, store, side, opts.partitions[0], warm, base / f"warm-{side}")
                for p in opts.partitions:
                    if lat:
                        report.paths[p] = asyncio.run(critical_path(settings, p))
                    for i in range(opts.rounds):
                        for side in sides:
                            r = _one(spark, log, fleet, store, side, p, opts, base / f"{side}-{p}-{i}")
                            out.write(_line(r) + "\n")
                            out.flush()
                            report.add(r)
            print_report(report, out, store)
        return report
    finally:
        if spark is not None:
            spark.stop()
            SyncPublisher.close_cached()
        if server is not None:
            server.stop()
        for path in cleanup:
            shutil.rmtree(path, ignore_errors=True)


def _one(
    spark: Any, log: ProgressLog, fleet: BenchFleet, store: str, side: str, p: int, opts: Options, where: Path
) -> Run:
    if side == "parquet":
        return parquet_run(spark, log, store, p, opts, where)
    return fleet_run(spark, log, fleet, store, side, p, opts, where)


def _line(r: Run) -> str:
    trig = [b.trigger_ms for b in r.batches]
    return (
        f"  {r.store:7s} P={r.partitions:<4d} {r.side:11s} n={len(trig)} batch p50 "
        f"{statistics.median(trig):7.1f} ms p99 {pct(trig, 99):7.1f} ms"
    )


def _ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.0f} / {pct(values, 99):.0f}" if values else "-"


def print_report(report: Report, out: TextIO, store: str) -> None:
    """The tables of ``store`` (printed when it is done): per P, each side's batch p50/p99 and the
    fleet's against the parquet sink, the fleet's phases, the commit's critical path."""
    opts = report.options
    modelled = store == "latency"
    out.write(
        f"\n{store}: batches of {opts.rows} rows per partition, {opts.batches} counted per query after "
        f"{opts.warmup} warm-up (x {opts.rounds} interleaved rounds), master {opts.master}, "
        f"{opts.workers} workers"
        + (f"; latency model median {opts.latency_ms:g} ms p99 {opts.p99_ms:g} ms" if modelled else "")
        + "\np50 / p99 in ms; batch = durationMs.triggerExecution, sink = durationMs.addBatch; "
        "added = the side's batch p50 - parquet's"
        + (
            "; trips = the commit's round trips on its critical path; core = the same commit's p50 on the "
            "model, the commit core alone in this process"
            if modelled
            else ""
        )
        + "\n\n"
    )
    head = ["store", "P", "side", "batch p50 / p99", "sink p50 / p99", "x parquet (p50)", "added p50"]
    if modelled:
        head += ["trips x latency", "added / (trips x latency)", "core p50", "added / core p50"]
    out.write("| " + " | ".join(head) + " |\n|" + " --- |" * len(head) + "\n")
    for p in opts.partitions:
        base = report.run(store, "parquet", p)
        path = report.paths.get(p) if modelled else None
        for side in SIDES:
            r = report.run(store, side, p)
            if r is None:
                continue
            trig = [b.trigger_ms for b in r.batches]
            row = [store, str(p), side, _ms(trig), _ms([b.add_ms for b in r.batches])]
            if side == "parquet" or base is None:
                row += ["1.00"] + ["-"] * (len(head) - len(row) - 1)
            else:
                b50 = statistics.median(b.trigger_ms for b in base.batches)
                added = statistics.median(trig) - b50
                row += [f"{statistics.median(trig) / b50:.2f}", f"{added:.0f}"]
                if path is not None:
                    floor = path.trips * opts.latency_ms
                    core = statistics.median(path.core_ms)
                    row += [
                        f"{path.trips:.1f} x {opts.latency_ms:g} = {floor:.0f}",
                        f"{added / floor:.2f}",
                        f"{core:.0f}",
                        f"{added / core:.2f}",
                    ]
                elif modelled:
                    row += ["-"] * 4
            out.write("| " + " | ".join(row) + " |\n")
    out.write("\nthe fleet's batches, phases (p50 / p99 ms):\n")
    for name, what in PHASES.items():
        out.write(f"  {name}: {what}\n")
    out.write("\n| store | P | side | " + " | ".join(PHASES) + " |\n|" + " --- |" * (3 + len(PHASES)) + "\n")
    for r in report.runs:
        if r.side == "parquet" or r.store != store:
            continue
        cells = [_ms([b.phases[k] for b in r.batches]) for k in PHASES]
        out.write(f"| {r.store} | {r.partitions} | {r.side} | " + " | ".join(cells) + " |\n")
    if modelled and report.paths:
        out.write(
            "\none streaming commit of P files alone, lock to release, the commit core in this process:\n"
        )
        for p, path in sorted(report.paths.items()):
            floor = path.trips * opts.latency_ms
            out.write(
                f"  P={p}: {path.requests} requests in {path.rounds} rounds (widths {path.widths}), "
                f"{path.trips:.1f} round trips on the critical path; on the model p50 / p99 "
                f"{_ms(path.core_ms)} ms = {statistics.median(path.core_ms) / floor:.2f} x trips x latency\n"
            )
    out.flush()


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of counts >= 1")
    return values


def _stores(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values or any(v not in STORES for v in values):
        raise argparse.ArgumentTypeError(f"a comma-separated list of {', '.join(STORES)}")
    return values


def _sides(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values or any(v not in SIDES for v in values):
        raise argparse.ArgumentTypeError(f"a comma-separated list of {', '.join(SIDES)}")
    return tuple(v for v in SIDES if v in values)


def parse(argv: Sequence[str] | None = None) -> Options:
    """The command line's options."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    d = Options()
    parser.add_argument("--batches", type=int, default=d.batches, help="counted batches per query")
    parser.add_argument("--warmup", type=int, default=d.warmup, help="uncounted batches first, per query")
    parser.add_argument("--partitions", type=_ints, default=d.partitions, help="P per batch, e.g. 1,10,100")
    parser.add_argument("--rows", type=int, default=d.rows, help="rows per partition")
    parser.add_argument("--stores", type=_stores, default=d.stores, help="local,latency (either or both)")
    parser.add_argument("--latency-ms", type=float, default=d.latency_ms, help="modelled median (latency)")
    parser.add_argument("--latency-p99-ms", type=float, default=0.0, help="modelled p99 (5x median)")
    parser.add_argument("--workers", type=int, default=d.workers, help="worker processes")
    parser.add_argument("--master", default=d.master, help="Spark master (local[2])")
    parser.add_argument("--redis-url", default="", help="a Redis to use (else a throwaway redis-server)")
    parser.add_argument("--sides", type=_sides, default=d.sides, help=f"any of {','.join(SIDES)}")
    parser.add_argument("--rounds", type=int, default=d.rounds, help="interleaved runs of each P's sides")
    a = parser.parse_args(argv)
    if min(a.batches, a.rows, a.workers, a.rounds) < 1 or a.warmup < 0 or a.latency_ms <= 0:
        parser.error("--batches, --rows, --workers, --rounds >= 1, --warmup >= 0, --latency-ms > 0")
    return Options(
        batches=a.batches,
        warmup=a.warmup,
        partitions=a.partitions,
        rows=a.rows,
        stores=a.stores,
        latency_ms=a.latency_ms,
        latency_p99_ms=a.latency_p99_ms,
        workers=a.workers,
        master=a.master,
        redis_url=a.redis_url,
        sides=a.sides,
        rounds=a.rounds,
    )


def main(argv: Sequence[str] | None = None) -> None:
    run(parse(argv), sys.stdout)
