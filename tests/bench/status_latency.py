"""Status latency benchmark (a script, not a test): how long `commitfleet status` takes at N datasets.

Starts a private redis-server, fills it with what a fleet of N datasets leaves
behind, then runs the real ``commitfleet status`` (and ``--json``) as a
subprocess ``--runs`` times, next to ``python -c pass``, ``python -c 'import
shared'`` and the third-party floor of any Typer + redis-py command (``import
typer, pydantic, rich.console, redis.asyncio, msgspec``), in interleaved rounds,
and prints wall and CPU time (median and max) and the line count::

    .venv/bin/python -m tests.bench.status_latency --datasets 100000
    # before/after in the same run: another checkout's status timed in the same rounds
    git archive HEAD~1 | tar -x -C /tmp/before
    .venv/bin/python -m tests.bench.status_latency --datasets 100000 --compare /tmp/before

The state is written by the project's own code, in batches, as the workers
write it (no hand-written keys): 4 workers registered and assigned the shards
(``FleetRegistry``); every job's events published by the producer
(``AsyncPublisher``), delivered through the consumer group (``ShardConsumer``),
decoded (``decode_entry``), decided and folded into the shard state
(``decide``, ``ShardJobs.apply``) and saved with their acknowledgements
(``ShardStateStore.save``); every dataset of the ended jobs committed (its
status, result record and the job's ended record saved as ``_set_status``
builds them, one save per job and shard) and announced once
(``AdminPublisher.publish_outcome``: the admin stream, the outcome markers and
counts); acknowledged entries trimmed (``trim_acknowledged``). The last
``--open-jobs`` jobs stay open: a fifth of their datasets waiting for a task,
the rest committing, 32 per worker of them running on the in-flight board
(``InFlightBoard``), the others queued; the newest job's events are partly
delivered and not acknowledged (pending) and partly not delivered (lag).

No storage is written: ``status`` reads Redis only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis.asyncio

from coordinator.admin import fleet_summary
from shared import Settings
from shared.events import (
    Committed,
    DatasetExpectation,
    JobFinished,
    JobStarted,
    QueueEvent,
    StagedFile,
    TaskFinished,
    ValidationLimits,
    decode_entry,
    manifest_key,
)
from shared.fleet import Assignment, FleetRegistry, Slot, balanced_targets, worker_info
from shared.queue import (
    AdminPublisher,
    AsyncPublisher,
    DatasetResult,
    Keys,
    ShardConsumer,
    ensure_fleet,
    trim_acknowledged,
)
from tests._support.fleet import fleet_settings
from tests._support.processes import ThrowawayRedis
from workers._core import ShardJobs, decide
from workers._inflight import InFlight, InFlightBoard, work_label
from workers._state_store import Batch, ShardStateStore, attempt_fields, dataset_fields

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 4
FLOOR = "import typer, pydantic, rich.console, redis.asyncio, msgspec"
RUNNING_PER_WORKER = 32  # worker.max_inflight's default: at most this many commits run per worker


class Owner:
    """One shard's owner, as far as its state in Redis goes: intake and status changes."""

    def __init__(self, r: redis.asyncio.Redis, keys: Keys, shard: int, worker: str, token: bytes) -> None:
        self.worker = worker
        self.store = ShardStateStore(r, keys, shard, token)
        self.consumer = ShardConsumer(r, keys, shard, consumer=worker)
        self.state = ShardJobs()
        self.board = InFlightBoard(r, keys, shard)

    async def intake(self, limits: ValidationLimits, settings: Settings) -> int:
        """Read, decide and save every delivered entry (as workers/_intake.py does); return how many."""
        n = 0
        while entries := await self.consumer.read(1000, 1):
            batch = Batch()
            now = time.time()
            for entry in entries:
                ev = decode_entry(entry.fields, limits=limits, stream=self.consumer.stream, entry_id=entry.id)
                d = decide(self.state, ev, now=now, default_timeout=settings.worker.job_timeout)
                self.state.apply(d)
                if d.job is not None:
                    batch.jobs.add(d.job.job)
                batch.datasets.update((d.job_id, name) for name in d.datasets or ())
                if d.attempt is not None:
                    ds, rec = d.attempt
                    batch.attempts[(d.job_id, ds, rec.task, rec.attempt)] = rec
                batch.ack.append(entry.id)
            await self.store.save(batch, self.state)
            n += len(entries)
        return n

    async def commit_all(self, job: str) -> list[str]:
        """Mark every dataset of ``job`` here committed, with its result, and end the job (one save,
        as workers/_ledger.py ``ShardLedger.set_status`` builds it per dataset); return the datasets."""
        meta = self.state.jobs.get(job)
        if meta is None:
            return []
        batch = Batch()
        now = time.time()
        names = list(meta.datasets)
        for name in names:
            assert self.state.set_status(job, name, "committed") is not None
            winners = self.state.winners(job, name) or []
            batch.results[(job, name)] = DatasetResult(
                status="committed",
                files=sum(len(a.files) for a in winners),
                bytes=sum(f.size for a in winners for f in a.files),
                manifest=manifest_key(name, job),
                at=now,
            )
        done = self.state.job_done(job)
        assert done == "committed", done
        batch.drop_attempts.extend(attempt_fields(self.state, job))
        batch.drop_datasets.extend(dataset_fields(self.state, job))
        self.state.end_job(job, done, now)
        batch.ended.add(job)
        await self.store.save(batch, self.state)
        return names


def job_events(job: str, names: list[str], tasks: int, *, skip_tasks_of: int = 0) -> list[QueueEvent]:
    """Return a finished job's events; the first ``skip_tasks_of`` datasets report no task (waiting)."""
    now = time.time()
    evs: list[QueueEvent] = [JobStarted(job=job, datasets=names, timeout_s=86400, started_at=now)]
    staged = [StagedFile(path="part-0.bin", size=64)]
    for name in names[skip_tasks_of:]:
        evs += [
            TaskFinished(job=job, dataset=name, task=t, attempt=0, files=staged, finished_at=now)
            for t in range(tasks)
        ]
    expect = {n: DatasetExpectation(tasks=tasks) for n in names}
    evs.append(JobFinished(job=job, datasets=expect, finished_at=now))
    return evs


async def fill(args: argparse.Namespace, settings: Settings, r: redis.asyncio.Redis) -> None:
    """Write the state a fleet of ``args.datasets`` datasets leaves behind (see the module doc)."""
    fleet, shards = settings.fleet.name, settings.fleet.shards
    keys = Keys(fleet)
    await ensure_fleet(r, fleet, shards)
    registry = FleetRegistry(r, keys)
    names = [f"w{i}" for i in range(WORKERS)]
    for w in names:
        await registry.register(worker_info(w, time.time()), 3600)
    targets = balanced_targets(shards, {}, names)
    assignment = Assignment(epoch=1, slots=tuple(Slot(owner=targets[s]) for s in range(shards)))
    assert await registry.replace_assignment(Assignment.empty(shards), assignment)
    await registry.set_leader("c0", 3600)
    owners = [
        Owner(r, keys, s, targets[s], await registry.set_owner_token(s, targets[s], 1)) for s in range(shards)
    ]
    for o in owners:
        await o.consumer.ensure_group()
    limits = ValidationLimits.from_settings(settings.security, fleet=fleet)
    pub = AsyncPublisher(r, fleet, shards)
    admin = AdminPublisher(r, keys)
    jobs = -(-args.datasets // args.per_job)
    open_from = max(0, jobs - args.open_jobs)
    t0 = time.monotonic()
    gate = asyncio.Semaphore(64)
    for j in range(jobs):
        job = f"job-{j:05d}"
        ds = [f"ds{i:07d}" for i in range(j * args.per_job, min(args.datasets, (j + 1) * args.per_job))]
        last = j == jobs - 1 and args.open_jobs > 0
        evs = job_events(job, ds, args.tasks, skip_tasks_of=len(ds) // 5 if j >= open_from else 0)
        await pub.publish_many(evs)
        if last:
            # The newest job: partly delivered (pending, not acknowledged), partly not (lag).
            await asyncio.gather(*(o.consumer.read(max(1, len(evs) // (2 * shards)), 1) for o in owners))
            continue
        # The shards' owners work concurrently, as they do in a fleet (and a loaded machine's
        # round trips are slow one by one).
        await asyncio.gather(*(o.intake(limits, settings) for o in owners))
        if j >= open_from:
            continue
        committed = await asyncio.gather(*(o.commit_all(job) for o in owners))

        async def announce(worker: str, dataset: str, job: str = job) -> None:
            ev = Committed(
                at=time.time(), worker=worker, dataset=dataset, job=job, files=1, bytes=64, duration_s=0.1
            )
            async with gate:
                await admin.publish_outcome(ev, dataset=dataset, job=job, outcome="committed")

        await asyncio.gather(
            *(announce(o.worker, d) for o, done in zip(owners, committed, strict=True) for d in done)
        )
        if (j + 1) % 10 == 0:
            print(f"  {j + 1}/{jobs} jobs written ({time.monotonic() - t0:.0f} s)", flush=True)
    # The open jobs' committing datasets: the first 32 per worker run, the others are queued.
    running: dict[str, int] = {}
    for o in owners:
        for meta in o.state.jobs.values():
            for name, d in meta.datasets.items():
                if d.status != "committing" or running.get(o.worker, 0) >= RUNNING_PER_WORKER:
                    continue
                running[o.worker] = running.get(o.worker, 0) + 1
                now = time.time()
                rec = InFlight(
                    work="commit",
                    dataset=name,
                    job=meta.job,
                    worker=o.worker,
                    state="running",
                    since=now,
                    state_since=now,
                    attempts=1,
                )
                o.board.put(work_label(("commit", meta.job, name)), rec)
    for o in owners:
        await o.board.flush()
    for s in range(shards):
        await trim_acknowledged(r, keys.events(s))


def timed(argv: list[str], code: Path, runs: int) -> tuple[list[float], list[float], str]:
    """Run ``argv`` ``runs`` times with the checkout ``code`` as its folder and path (``python -m``
    puts the folder first on the path); return (wall seconds, CPU seconds of the child, the last stdout).

    Raises:
        RuntimeError: a run exited non-zero (its stderr is in the message).
    """
    walls: list[float] = []
    cpus: list[float] = []
    out = ""
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        res = subprocess.run(argv, env=_env(code), cwd=code, capture_output=True, text=True, timeout=300)
        if res.returncode:
            raise RuntimeError(f"{argv} in {code} exited {res.returncode}: {res.stderr.strip()[-2000:]}")
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        out = res.stdout
    return walls, cpus, out


async def main(args: argparse.Namespace) -> int:
    """Fill, measure, print; return the exit code (0 when this checkout's status met < 60 lines and
    a median under 1 s)."""
    others = [Path(c).resolve() for c in args.compare]
    with tempfile.TemporaryDirectory(prefix="commitfleet-status-bench-") as work:
        server = ThrowawayRedis(Path(work))
        try:
            fleet = "st" + secrets.token_hex(3)
            settings = fleet_settings(server.url, Path(work) / "store", fleet, shards=args.shards)
            # What an operator's status needs, and no more: a --compare checkout may not know newer settings.
            config = Path(work) / "fleet.toml"
            config.write_text(f'[fleet]\nname = "{fleet}"\n\n[redis]\nurl = "{server.url}"\n')
            r = redis.asyncio.Redis.from_url(server.url)
            try:
                t = time.monotonic()
                print(
                    f"status latency: filling {args.datasets} datasets x {args.tasks} tasks, "
                    f"{args.per_job} a job, {args.shards} shards, {args.open_jobs} jobs left open",
                    flush=True,
                )
                await fill(args, settings, r)
                used = int((await r.info("memory"))["used_memory"]) / 1e6
                print(f"filled in {time.monotonic() - t:.0f} s; Redis used_memory {used:.1f} MB", flush=True)
                t = time.perf_counter()
                doc = await fleet_summary(r, Keys(fleet), settings)
                inproc = time.perf_counter() - t
            finally:
                await r.aclose()
            status = [sys.executable, "-m", "coordinator", "status", "--config", str(config)]
            commands = [
                ("python -c pass", ROOT, [sys.executable, "-c", "pass"]),
                ("python -c 'import shared'", ROOT, [sys.executable, "-c", "import shared"]),
                # The floor: what any Typer + redis-py command pays (typer builds its options with pydantic).
                ("import typer/pydantic/redis", ROOT, [sys.executable, "-c", FLOOR]),
                ("commitfleet status", ROOT, status),
                ("commitfleet status --json", ROOT, [*status, "--json"]),
            ]
            for i, other in enumerate(others, 1):
                commands += [
                    (f"[{i}] status", other, status),
                    (f"[{i}] status --json", other, [*status, "--json"]),
                ]
            load0 = os.getloadavg()[0]
            rows: dict[str, tuple[list[float], list[float], str]] = {}
            # Interleaved rounds: a change in the machine's load hits every command alike.
            for _ in range(args.runs):
                for label, code, argv in commands:
                    w, c, out = timed(argv, code, 1)
                    walls, cpus, _ = rows.get(label, ([], [], ""))
                    rows[label] = (walls + w, cpus + c, out)
            load1 = os.getloadavg()[0]
        finally:
            server.stop()
    lines = len(rows["commitfleet status"][2].splitlines())
    print(
        f"\nstatus summary: {doc['totals']['open_jobs']} open jobs, {doc['totals']['datasets']} open "
        f"datasets, {len(doc['in_flight'])} in flight, counters {doc['counters']}; "
        f"computed in-process in {inproc:.3f} s"
    )
    print(f"timed: this checkout ({ROOT})" + "".join(f", [{i}] {o}" for i, o in enumerate(others, 1)))
    print(f"{args.runs} runs each, interleaved; load average {load0:.1f} -> {load1:.1f}")
    print(
        f"{'command':<28} {'wall median':>11} {'wall max':>9} {'cpu median':>10} {'x bare':>7} {'lines':>6}"
    )
    bare = statistics.median(rows["python -c pass"][0])
    for label, (walls, cpus, out) in rows.items():
        med = statistics.median(walls)
        shown = len(out.splitlines()) if "status" in label and "--json" not in label else ""
        print(
            f"{label:<28} {med:>10.3f}s {max(walls):>8.3f}s {statistics.median(cpus):>9.3f}s "
            f"{med / bare:>6.1f}x {shown:>6}"
        )
    med = statistics.median(rows["commitfleet status"][0])
    ok = lines < 60 and med < 1.0
    verdict = "OK" if ok else "OVER"
    print(f"status: {lines} lines, median {med:.2f} s -> {verdict} (targets: < 60 lines, < 1 s)")
    return 0 if ok else 1


def _env(code: Path) -> dict[str, str]:
    """Return the environment a timed command runs in: ``code`` first on the path, no fleet settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMITFLEET_") and k != "REDIS_URL"}
    env["PYTHONPATH"] = str(code)
    env["COLUMNS"] = "160"
    return env


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command line's options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", type=int, default=100_000)
    p.add_argument("--per-job", type=int, default=1000, help="datasets per job")
    p.add_argument("--tasks", type=int, default=1, help="tasks per dataset")
    p.add_argument("--shards", type=int, default=64)
    p.add_argument("--open-jobs", type=int, default=13, help="the newest jobs left open")
    p.add_argument("--runs", type=int, default=7, help="runs of each timed command")
    p.add_argument(
        "--compare",
        action="append",
        default=[],
        help="another checkout whose status is timed in the same rounds (e.g. the code before a change)",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
