"""The commands that start processes of their own or build things: ``demo``, ``bench``, ``pack``."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from ._common import ConfigOpt, err, out, run_or_exit, settings_or_exit

if TYPE_CHECKING:
    from shared import Settings

T = TypeVar("T")


def demo(
    root: Annotated[Path | None, typer.Option(help="Store root folder (default: a temporary one).")] = None,
    keep: Annotated[bool, typer.Option(help="Keep the store root afterwards.")] = False,
    streaming: Annotated[
        bool,
        typer.Option(help="A Structured Streaming query instead: a driver kill, its restart, the audit."),
    ] = False,
) -> None:
    """Run the end-to-end demo: a fleet, a real PySpark job, a failed job, the audit."""
    from coordinator.demo import run_demo

    code = _stopping_children(
        "demo", lambda: run_demo(root=root, keep=keep, console=out, streaming=streaming)
    )
    raise typer.Exit(code)


def _stopping_children(what: str, body: Callable[[], T]) -> T:
    """Run ``body``; every process it starts is stopped on the way out, SIGTERM and Ctrl-C included.

    Raises:
        typer.Exit: 128 + the signal's number when SIGTERM or SIGINT stopped it.
    """
    from coordinator.demo import Interrupted, children_stopped

    try:
        with children_stopped():
            return body()
    except Interrupted as exc:
        err.print(
            f"commitfleet: {what} stopped by {exc}; every process it started is stopped",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(exc.exit_code) from None


def bench(
    what: Annotated[str, typer.Argument(help="intake, commit, or cluster.")] = "intake",
    events_n: Annotated[int, typer.Option("--events", help="intake: events to push through.")] = 20000,
    datasets: Annotated[int, typer.Option(help="commit: datasets per mode.")] = 200,
    files: Annotated[int, typer.Option(help="commit: files per dataset.")] = 8,
    size: Annotated[int, typer.Option(help="commit: bytes per file.")] = 64 * 1024,
    modes: Annotated[
        str, typer.Option(help="commit: baseline,core,fleet (any of them).")
    ] = "baseline,core,fleet",
    latency_ms: Annotated[float, typer.Option(help="commit: modelled store latency median (0 = off).")] = 0.0,
    latency_p99_ms: Annotated[
        float, typer.Option(help="commit: modelled latency p99 (default 5x median).")
    ] = 0.0,
    workers: Annotated[int, typer.Option(help="commit: worker processes of the fleet mode.")] = 2,
    inflight: Annotated[int, typer.Option(help="commit: datasets at a time in the core mode.")] = 32,
    worker_counts: Annotated[
        str, typer.Option(help="cluster: worker processes per run, on one node and on the cluster.")
    ] = "2,4,8",
    rounds: Annotated[int, typer.Option(help="cluster: rounds per run (the table shows the median).")] = 3,
    s3_emulator: Annotated[
        bool, typer.Option("--s3-emulator", help="commit: on a throwaway moto S3 server instead.")
    ] = False,
    durability: Annotated[
        str,
        typer.Option(
            help="intake, commit: each of these redis.durability levels (replicas,aof,aof+replicas or all) "
            "against memory, on a throwaway master with one replica (--rounds rounds)."
        ),
    ] = "",
    redis_server: Annotated[
        str, typer.Option(help="--durability: the redis-server to start (7.2+ for the aof levels).")
    ] = "",
    appendfsync: Annotated[
        str, typer.Option(help="--durability: the servers' appendfsync with an aof level (everysec, always).")
    ] = "everysec",
    config: ConfigOpt = None,
) -> None:
    """Benchmarks: intake (worker events/s against raw XREADGROUP+XACK), commit (fleet and commit
    core against a sequential single driver on the configured store; a temporary local one by default),
    or cluster (the fleet mode on one Redis node and on a throwaway 3-master Redis Cluster, per worker
    count). With --durability, intake or commit at each durability level against memory."""
    import msgspec

    s = settings_or_exit(config)
    if durability:
        sizes = (events_n, datasets, files, size, workers, rounds)
        _durability_bench(s, what, durability, redis_server, appendfsync, sizes)
        return
    if what == "intake":
        from coordinator.bench import run_bench
        from workers import tune_gc

        tune_gc()  # the worker runs in this process: set it up as `commitfleet worker` does
        _stopping_children("bench", lambda: run_or_exit(run_bench(s, events_n, console=out)))
        return
    if what not in ("commit", "cluster"):
        raise typer.BadParameter(f"unknown benchmark {what!r} (intake, commit or cluster)")
    from coordinator.bench import MODES, Workload, run_commit_bench

    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    if not chosen or any(m not in MODES for m in chosen) or min(datasets, files, size, workers, inflight) < 1:
        raise typer.BadParameter(f"--modes takes {','.join(MODES)}; counts must be >= 1")
    if latency_ms > 0:
        store = msgspec.structs.replace(
            s.store, model_latency_ms=latency_ms, model_latency_p99_ms=latency_p99_ms or 5 * latency_ms
        )
        s = msgspec.structs.replace(s, store=store)
    w = Workload(datasets=datasets, files=files, size=size)
    if what == "cluster":
        from coordinator.bench import run_cluster_bench

        counts = [int(c) for c in worker_counts.split(",") if c.strip().isdigit()]
        if not counts or min(counts) < 1 or rounds < 1:
            raise typer.BadParameter("--worker-counts takes counts >= 1, e.g. 2,4,8; --rounds >= 1")
        _stopping_children(
            "bench",
            lambda: run_or_exit(run_cluster_bench(s, w, worker_counts=counts, console=out, rounds=rounds)),
        )
        return
    if not s3_emulator:
        bench_run = run_commit_bench(s, w, modes=chosen, workers=workers, inflight=inflight, console=out)
        _stopping_children("bench", lambda: run_or_exit(bench_run))
        return
    from coordinator.bench import s3_emulator as emulated

    with (
        tempfile.TemporaryDirectory(prefix="commitfleet-bench-s3-") as work,
        emulated(s, Path(work)) as on_s3,
    ):
        on_s3_run = run_commit_bench(on_s3, w, modes=chosen, workers=workers, inflight=inflight, console=out)
        _stopping_children("bench", lambda: run_or_exit(on_s3_run))


def _durability_bench(
    s: Settings,
    what: str,
    levels_text: str,
    redis_server: str,
    appendfsync: str,
    counts: tuple[int, int, int, int, int, int],
) -> None:
    from coordinator.bench import Workload, parse_levels, run_durability_bench
    from shared import ConfigError
    from workers import tune_gc

    events_n, datasets, files, size, workers, rounds = counts
    if what not in ("intake", "commit"):
        raise typer.BadParameter(f"--durability measures intake or commit, not {what!r}")
    if appendfsync not in ("everysec", "always"):
        raise typer.BadParameter(f"--appendfsync takes everysec or always, not {appendfsync!r}")
    if rounds < 1 or min(events_n, datasets, files, size, workers) < 1:
        raise typer.BadParameter("--rounds and the counts must be >= 1")
    try:
        levels = parse_levels(levels_text)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    if what == "intake":
        tune_gc()  # the worker runs in this process
    body = run_durability_bench(
        s,
        what,
        levels,
        console=out,
        rounds=rounds,
        events=events_n,
        workload=Workload(datasets=datasets, files=files, size=size),
        workers=workers,
        redis_server=redis_server or None,
        appendfsync=appendfsync,
    )
    _stopping_children("bench", lambda: run_or_exit(body))


def pack(
    out_dir: Annotated[Path, typer.Option("--out", help="Folder to write into.")] = Path("dist"),
) -> None:
    """Build the zip Spark executors import commitfleet from (spark-submit --py-files), see docs/spark.md."""
    from shared.spark import build_pack

    p = build_pack(out_dir)
    lines = (
        f"{p.archive}  ({p.files} files, sha256 {p.sha256})\n{p.requirements}\n"
        f"spark-submit --py-files {p.archive} ...  # executors: pip install -r {p.requirements}"
    )
    out.print(lines, soft_wrap=True, highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add this group's commands to ``app``."""
    for command in (demo, bench, pack):
        app.command()(command)


__all__ = ["bench", "demo", "pack", "register"]
