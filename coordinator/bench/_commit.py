"""``commitfleet bench commit``: commit throughput against a sequential single driver, same store, same run.

Three ways to commit the same work, D datasets of F staged files each (one
task per file), each on freshly staged files of one job:

- ``baseline``: what a single Spark driver does without commitfleet: one
  dataset after the other, copy and delete each file in turn, then write one
  manifest. Same storage port, so the same adapter and the same latency.
- ``core``: the commit core in this process, as a worker runs it: per
  dataset the storage lock, the WAL, the steps (bounded parallel copies and
  deletes), the manifest, the release; ``--inflight`` datasets at a time.
- ``fleet``: a coordinator and ``--workers`` worker processes: the events go
  through the publisher and Redis; timed from the first ``job_finished``
  published to the last ``committed`` admin event.

Every mode is checked after it ran (every file published once, no staged file
left, a manifest per dataset), so a fast wrong run cannot pass for a fast one.
With ``--latency-ms`` every store request of every mode (the fleet's worker
processes too, through ``store.model_latency_ms``) waits a lognormal time
like a cloud store's round trip: there the round trips, not the CPU, are the
cost. The figures are ratios against the baseline of the same run.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec

from shared import Settings
from shared.commit import CommitRequest, WinningAttempt, commit_dataset, for_each_bounded
from shared.events import (
    StagedFile,
    lock_name,
    manifest_key,
    published_key,
    staged_key,
    staging_prefix,
)
from shared.locks import StorageLock
from shared.storage import CountingStore, ObjectStore, open_store
from shared.tracing import NO_TRACER, Tracer

MODES = ("baseline", "core", "fleet")


@dataclass(frozen=True, slots=True)
class Workload:
    """D datasets of F files of ``size`` bytes; ``tag`` keeps runs apart in one store."""

    datasets: int
    files: int
    size: int
    tag: str = field(default_factory=lambda: secrets.token_hex(3))

    def names(self, mode: str) -> list[str]:
        """Return the dataset names of ``mode``'s run."""
        return [f"bench-{self.tag}-{mode}-{i:05d}" for i in range(self.datasets)]

    def job(self, mode: str) -> str:
        """Return the job id of ``mode``'s run."""
        return f"bench-{self.tag}-{mode}"


@dataclass(slots=True)
class ModeResult:
    """One mode's figures: wall time, requests per dataset and sequential rounds per dataset."""

    mode: str
    seconds: float
    datasets: int
    requests_per_dataset: float | None = None
    rounds_per_dataset: float | None = None
    cpu_seconds: float | None = None
    latency_p50_s: float | None = None
    """Fleet only: p50 from ``job_finished`` to ``committed`` of one 4-file dataset alone."""
    commit_p50_s: float | None = None
    """Fleet only: p50 of those commits' own duration (``committed.duration``)."""

    @property
    def rate(self) -> float:
        """Return datasets committed per second."""
        return self.datasets / self.seconds if self.seconds > 0 else float("inf")


def _attempt(task: int, size: int) -> WinningAttempt:
    return WinningAttempt(task=task, attempt=0, files=[StagedFile(path=f"part-{task:05d}.bin", size=size)])


async def stage(store: ObjectStore, w: Workload, mode: str) -> dict[str, list[WinningAttempt]]:
    """Write ``mode``'s staged files (not timed); return each dataset's winning attempts."""
    payload = os.urandom(w.size)
    job = w.job(mode)
    winners = {ds: [_attempt(t, w.size) for t in range(w.files)] for ds in w.names(mode)}

    async def put(item: tuple[str, WinningAttempt]) -> None:
        ds, a = item
        await store.write(staged_key(job, ds, a.task, 0, a.files[0].path), payload)

    await for_each_bounded([(ds, a) for ds, atts in winners.items() for a in atts], put, 64)
    return winners


async def verify(store: ObjectStore, w: Workload, mode: str) -> None:
    """Check ``mode``'s run: F published files and one manifest per dataset, nothing staged.

    Raises:
        AssertionError: naming every dataset that is wrong.
    """
    job = w.job(mode)
    problems: list[str] = []

    async def one(ds: str) -> None:
        keys = [i.key async for i in store.list(f"{ds}/")]
        data = [k for k in keys if "/_commits/" not in k]
        if len(data) != w.files:
            problems.append(f"{ds}: {len(data)} published files, expected {w.files}")
        if manifest_key(ds, job) not in keys:
            problems.append(f"{ds}: no manifest")
        staged = [i.key async for i in store.list(staging_prefix(job, ds))]
        if staged:
            problems.append(f"{ds}: {len(staged)} staged files left")

    await for_each_bounded(w.names(mode), one, 32)
    if problems:
        raise AssertionError(f"{mode} run is wrong: " + "; ".join(sorted(problems)[:10]))


async def run_baseline(store: ObjectStore, w: Workload, winners: dict[str, list[WinningAttempt]]) -> None:
    """The single driver: per dataset, copy then delete each file in turn, then one manifest."""
    job = w.job("baseline")
    for ds, atts in winners.items():
        listed = []
        for a in atts:
            rel = a.files[0].path
            src = staged_key(job, ds, a.task, 0, rel)
            dst = published_key(ds, job, a.task, rel)
            await store.copy(src, dst)
            await store.delete(src)
            listed.append({"key": dst, "size": a.files[0].size})
        await store.write(manifest_key(ds, job), msgspec.json.encode({"job": job, "files": listed}))


async def run_core(
    store: ObjectStore,
    settings: Settings,
    w: Workload,
    winners: dict[str, list[WinningAttempt]],
    inflight: int,
    *,
    tracer: Tracer = NO_TRACER,
) -> None:
    """The commit core as a worker runs it: lock, commit_dataset, release; ``inflight`` at a time.

    ``tracer``: record the spans a worker records around it (the commit, the
    lock wait, the phases), for the tracing overhead (tests/bench/tracing_overhead.py).

    Raises:
        RuntimeError: a dataset did not commit (quarantined or blocked).
    """
    job = w.job("core")

    async def one(item: tuple[str, list[WinningAttempt]]) -> None:
        ds, atts = item
        req = CommitRequest(dataset=ds, job=job, winners=atts, expected_tasks=len(atts))
        lock = StorageLock(store, lock_name(ds), owner="bench", settings=settings.lock)
        attrs = {"commitfleet.job": job, "commitfleet.dataset": ds} if tracer.enabled else None
        with tracer.span("commitfleet.commit", attributes=attrs) as span:
            waited = time.time_ns()
            async with lock.hold() as lease:
                if tracer.enabled:
                    tracer.record(
                        "commitfleet.lock_wait", start_ns=waited, end_ns=time.time_ns(), attributes=attrs
                    )
                result = await commit_dataset(store, req, lease, settings, tracer=tracer)
            span.set("commitfleet.status", result.status)
        if result.status != "committed":
            raise RuntimeError(f"{ds}: {result.status} ({result.quarantined})")

    await for_each_bounded(list(winners.items()), one, inflight)


async def timed_inprocess(
    mode: str,
    store: ObjectStore,
    raw: ObjectStore,
    w: Workload,
    body: Callable[[ObjectStore, dict[str, list[WinningAttempt]]], Awaitable[None]],
) -> ModeResult:
    """Stage on ``raw`` (no modelled latency), run ``body`` on ``store`` counted, verify on ``raw``."""
    winners = await stage(raw, w, mode)
    counting = CountingStore(store)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    await body(counting, winners)
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    await verify(raw, w, mode)
    return ModeResult(
        mode=mode,
        seconds=seconds,
        datasets=w.datasets,
        requests_per_dataset=counting.total / w.datasets,
        rounds_per_dataset=counting.rounds / w.datasets if mode == "baseline" else None,
        cpu_seconds=cpu,
    )


def open_raw(settings: Settings) -> ObjectStore:
    """Return the configured store without modelled latency or faults (staging and checks)."""
    plain = msgspec.structs.replace(settings.store, model_latency_ms=0.0, chaos_fault_rate=0.0)
    return open_store(settings.store.url, plain)


__all__ = [
    "MODES",
    "ModeResult",
    "Workload",
    "open_raw",
    "run_baseline",
    "run_core",
    "stage",
    "timed_inprocess",
    "verify",
]
