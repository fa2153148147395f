"""The ``commitfleet`` command line (Typer + Rich).

Every command reads its settings once (``--config FILE`` or
``COMMITFLEET_CONFIG``, then ``COMMITFLEET_*`` variables, ``REDIS_URL`` and
``COMMITFLEET_STORE``) into one frozen :class:`~shared.Settings`. The shard
count comes from the fleet's record in Redis; ``fleet.shards``, when set, must
agree with it.

Exit codes: 0 done (or a worker or coordinator stopped by SIGTERM/SIGINT); 1 the command failed (an
audit violation, an operator request that did not apply); 2 a bad setting
(one line on stderr); 3 a service could not be reached (operator commands; a
worker or coordinator waits for Redis instead); 70 a worker or coordinator
crashed on an unexpected error (the traceback is in its log); 130 / 143 ``demo`` or ``bench`` stopped
by SIGINT / SIGTERM (after stopping every process it started).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from shared import CommitfleetError, ConfigError, Settings, TransientError, load_settings

# Each command imports what it uses in its body: `commitfleet status` and `--help` must not pay
# for the worker, the coordinator's HTTP server, the commit core or a cloud SDK
# (tests/unit/test_cli_imports.py checks it, tests/bench/status_latency.py measures it).

T = TypeVar("T")

app = typer.Typer(
    name="commitfleet",
    help="Exactly-once commits for Spark pipelines over Redis Streams and object storage.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
# soft_wrap: without a terminal Rich would break an error line at 80 columns,
# and a bad setting must stay one line.
err = Console(stderr=True, soft_wrap=True)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")]


def _settings(config: Path | None, overrides: dict[str, Any] | None = None) -> Settings:
    try:
        return load_settings(config, overrides=overrides)
    except ConfigError as exc:
        err.print(f"commitfleet: config error: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; a ConfigError, an unreachable service or a crash ends the command with one line."""
    from shared.fleet import EXIT_CRASHED, ProcessCrashed

    try:
        return asyncio.run(coro)
    except ProcessCrashed as exc:
        err.print(f"commitfleet: {exc} (the traceback is in the log above)", markup=False, highlight=False)
        raise typer.Exit(EXIT_CRASHED) from None
    except ConfigError as exc:
        err.print(f"commitfleet: config error: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    except TransientError as exc:
        err.print(f"commitfleet: service unavailable: {exc}", markup=False, highlight=False)
        raise typer.Exit(3) from None


@app.command()
def worker(
    config: ConfigOpt = None,
    worker_id: Annotated[str, typer.Option("--id", help="Worker id (default: host-pid-random).")] = "",
) -> None:
    """Run a worker: owned shards -> event intake -> commit / abort / recovery."""
    from shared._logging import configure_logging
    from workers import run_worker

    s = _settings(config)
    configure_logging(s.log)
    _run(run_worker(s, worker_id=worker_id or None))


@app.command()
def coordinator(
    config: ConfigOpt = None,
    http_host: Annotated[str | None, typer.Option(help="Admin API address.")] = None,
    http_port: Annotated[int | None, typer.Option(help="Admin API port (0 = any free port).")] = None,
    coordinator_id: Annotated[str, typer.Option("--id", help="Coordinator id.")] = "",
) -> None:
    """Run a coordinator: leader election, shard assignment, admin API."""
    from shared._logging import configure_logging

    from ._coordinator import run_coordinator

    overrides: dict[str, Any] = {}
    if http_host is not None:
        overrides.setdefault("coordinator", {})["http_host"] = http_host
    if http_port is not None:
        overrides.setdefault("coordinator", {})["http_port"] = http_port
    s = _settings(config, overrides)
    configure_logging(s.log)
    _run(run_coordinator(s, coordinator_id=coordinator_id or None))


@app.command()
def events(
    config: ConfigOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following new events.")] = False,
    type_: Annotated[list[str] | None, typer.Option("--type", "-t", help="Only these event types.")] = None,
    dataset: Annotated[str | None, typer.Option(help="Only this dataset.")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    last: Annotated[int, typer.Option(help="Show the last N events first (0 = none).")] = 50,
) -> None:
    """Show the admin event stream (``--follow`` keeps going)."""
    from ._cli_ops import print_events

    s = _settings(config)
    _run(
        print_events(
            s, follow=follow, types=set(type_ or []), dataset=dataset, job=job, as_json=as_json, last=last
        )
    )


@app.command()
def status(
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole status document as JSON.")] = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="Every shard, job and dataset, not the top few.")
    ] = False,
) -> None:
    """Show a summary (per shard: open jobs, queued, running, quarantined, lag) and the top of each list."""
    from ._status import get_status

    s = _settings(config)
    doc = _run(get_status(s))
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return
    from ._status_text import print_status

    print_status(out, doc, top=None if show_all else STATUS_TOP)


# How many rows of each list `commitfleet status` shows without --all (the output stays under 60 lines).
STATUS_TOP = 5


WaitOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for the owner to act.")]


def _operator(op: str, dataset: str, job: str, config: Path | None, wait_s: float) -> None:
    from ._cli_ops import operator_request

    s = _settings(config)
    out.print(_run(operator_request(s, dataset, job, op, wait_s=wait_s)))


@app.command()
def retry(dataset: str, job: str, config: ConfigOpt = None, timeout: WaitOpt = 120.0) -> None:
    """Retry a quarantined dataset's commit sequence (after fixing the cause)."""
    _operator("retry", dataset, job, config, timeout)


@app.command()
def skip(dataset: str, job: str, config: ConfigOpt = None, timeout: WaitOpt = 120.0) -> None:
    """Skip (roll back) a quarantined dataset's commit sequence, unblocking the dataset."""
    _operator("skip", dataset, job, config, timeout)


@app.command()
def wait(
    job: str,
    datasets: Annotated[list[str], typer.Argument(help="The job's datasets.")],
    config: ConfigOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for every outcome.")] = 900.0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per dataset.")] = False,
) -> None:
    """Wait for a job's outcome: exit 0 all committed, 1 some not, 2 bad usage, 3 no Redis,
    4 some result no longer kept (outcome unknown), 124 timeout."""
    from ._wait import exit_code, outcome_rows, wait_outcome

    s = _settings(config)
    outcome, complete = _run(wait_outcome(s, job, datasets, timeout))
    for row in outcome_rows(outcome):
        if as_json:
            sys.stdout.write(json.dumps(row) + "\n")
        else:
            detail = row["manifest"] if row["status"] == "committed" else row["reason"]
            sys.stdout.write(f"{row['dataset']}\t{row['status']}\t{detail}\n")
    raise typer.Exit(exit_code(outcome, complete))


@app.command()
def audit(
    root: Annotated[
        str, typer.Argument(help="Store root URL (file://, s3://, gs://, az://) or a local path.")
    ],
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Check a store root against the exactly-once invariant; exit 1 on any violation."""
    import msgspec
    from rich.table import Table

    from ._cli_ops import run_audit

    s = _settings(config)
    url = root if "://" in root else Path(root).resolve().as_uri()
    report = _run(run_audit(s, url))
    if as_json:
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
    else:
        t = Table("kind", "key", "detail", title=f"audit of {url}")
        for v in report.violations:
            t.add_row(v.kind, v.key, v.detail)
        out.print(
            f"datasets {report.datasets}  manifests {report.manifests}  "
            f"files {report.files}  bytes {report.bytes}"
        )
        out.print(t if report.violations else "[green]no violations: every commit is exactly once[/]")
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def schema(
    admin: Annotated[
        bool, typer.Option("--admin", help="The admin events' schema instead of the queue's.")
    ] = False,
) -> None:
    """Print the JSON Schema of the queue events (or the admin events)."""
    from shared.events import admin_event_schema, queue_event_schema

    doc = admin_event_schema() if admin else queue_event_schema()
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


@app.command()
def demo(
    root: Annotated[Path | None, typer.Option(help="Store root folder (default: a temporary one).")] = None,
    keep: Annotated[bool, typer.Option(help="Keep the store root afterwards.")] = False,
) -> None:
    """Run the end-to-end demo: a fleet, a real PySpark job, a failed job, the audit."""
    from ._demo import run_demo

    code = _stopping_children("demo", lambda: run_demo(root=root, keep=keep, console=out))
    raise typer.Exit(code)


def _stopping_children(what: str, body: Callable[[], T]) -> T:
    """Run ``body``; every process it starts is stopped on the way out, SIGTERM and Ctrl-C included.

    Raises:
        typer.Exit: 128 + the signal's number when SIGTERM or SIGINT stopped it.
    """
    from ._procs import Interrupted, children_stopped

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


@app.command()
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
    config: ConfigOpt = None,
) -> None:
    """Benchmarks: intake (worker events/s against raw XREADGROUP+XACK), commit (fleet and commit
    core against a sequential single driver on the configured store; a temporary local one by default),
    or cluster (the fleet mode on one Redis node and on a throwaway 3-master Redis Cluster, per worker
    count)."""
    import msgspec

    s = _settings(config)
    if what == "intake":
        from workers._heap import tune_gc

        from ._bench import run_bench

        tune_gc()  # the worker runs in this process: set it up as `commitfleet worker` does
        _stopping_children("bench", lambda: _run(run_bench(s, events_n, console=out)))
        return
    if what not in ("commit", "cluster"):
        raise typer.BadParameter(f"unknown benchmark {what!r} (intake, commit or cluster)")
    from ._bench_commit import MODES, Workload
    from ._bench_fleet import run_commit_bench

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
        from ._bench_cluster import run_cluster_bench

        counts = [int(c) for c in worker_counts.split(",") if c.strip().isdigit()]
        if not counts or min(counts) < 1 or rounds < 1:
            raise typer.BadParameter("--worker-counts takes counts >= 1, e.g. 2,4,8; --rounds >= 1")
        _stopping_children(
            "bench", lambda: _run(run_cluster_bench(s, w, worker_counts=counts, console=out, rounds=rounds))
        )
        return
    if not s3_emulator:
        bench_run = run_commit_bench(s, w, modes=chosen, workers=workers, inflight=inflight, console=out)
        _stopping_children("bench", lambda: _run(bench_run))
        return
    from ._bench_s3 import s3_emulator as emulated

    with (
        tempfile.TemporaryDirectory(prefix="commitfleet-bench-s3-") as work,
        emulated(s, Path(work)) as on_s3,
    ):
        on_s3_run = run_commit_bench(on_s3, w, modes=chosen, workers=workers, inflight=inflight, console=out)
        _stopping_children("bench", lambda: _run(on_s3_run))


@app.command()
def pack(
    out_dir: Annotated[Path, typer.Option("--out", help="Folder to write into.")] = Path("dist"),
) -> None:
    """Build the zip Spark executors import commitfleet from (spark-submit --py-files), see docs/spark.md."""
    from shared.spark._pack import build_pack

    p = build_pack(out_dir)
    lines = (
        f"{p.archive}  ({p.files} files, sha256 {p.sha256})\n{p.requirements}\n"
        f"spark-submit --py-files {p.archive} ...  # executors: pip install -r {p.requirements}"
    )
    out.print(lines, soft_wrap=True, highlight=False, markup=False)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except CommitfleetError as exc:  # anything our code raises that a command did not handle
        err.print(f"commitfleet: {type(exc).__name__}: {exc}", markup=False, highlight=False)
        sys.exit(1)
