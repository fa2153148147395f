"""The ``commitfleet`` command line (Typer + Rich).

Every command reads its settings once (``--config FILE`` or
``COMMITFLEET_CONFIG``, then ``COMMITFLEET_*`` variables, ``REDIS_URL`` and
``COMMITFLEET_STORE``) into one frozen :class:`~shared.Settings`. A bad setting
stops the command at start with one line on stderr and exit code 2.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from shared import CommitfleetError, ConfigError, Settings, TransientError, load_settings
from shared._logging import configure_logging

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
    """Run ``coro``; a ConfigError or an unreachable service ends the command with one line."""
    try:
        return asyncio.run(coro)
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
    as_json: Annotated[bool, typer.Option("--json", help="Print the status document as JSON.")] = False,
) -> None:
    """Show workers, shards, open jobs, pending and quarantined datasets."""
    from ._cli_ops import get_status

    s = _settings(config)
    doc = _run(get_status(s))
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return
    _print_status(doc)


def _print_status(doc: dict[str, Any]) -> None:
    out.print(
        f"fleet [bold]{doc['fleet']}[/]  shards {doc['shards']}  leader {doc['leader'] or '-'}  "
        f"assignment epoch {doc['assignment_epoch']}"
    )
    t = Table("worker", "host", "pid", "shards", "heartbeat age")
    now = time.time()
    for w in doc["workers"]:
        t.add_row(w["id"], w["host"], str(w["pid"]), str(len(w["shards"])), f"{now - w['heartbeat_at']:.1f}s")
    out.print(t)
    moving = [r for r in doc["shard_table"] if r["moving_to"]]
    unowned = [r["shard"] for r in doc["shard_table"] if not r["owner"]]
    lag = sum(r["lag"] for r in doc["shard_table"])
    dead = sum(r["dead_letters"] for r in doc["shard_table"])
    out.print(f"shards moving {len(moving)}  unowned {len(unowned)}  lag {lag}  dead letters {dead}")
    jobs = Table("open job", "shard", "datasets")
    for j in doc["open_jobs"]:
        jobs.add_row(j["job"], str(j["shard"]), ", ".join(f"{k}:{v}" for k, v in j["datasets"].items()))
    out.print(jobs)
    if doc["pending"]:
        p = Table("pending dataset", "job", "status")
        for row in doc["pending"]:
            p.add_row(row["dataset"], row["job"], row["status"])
        out.print(p)
    q = Table("quarantined dataset", "job", "reason", title=None)
    for row in doc["quarantined"]:
        q.add_row(row["dataset"], row["job"], row["reason"])
    out.print(q if doc["quarantined"] else "no quarantined datasets")


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
def audit(
    root: Annotated[
        str, typer.Argument(help="Store root URL (file://, s3://, gs://, az://) or a local path.")
    ],
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Check a store root against the exactly-once invariant; exit 1 on any violation."""
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

    code = run_demo(root=root, keep=keep, console=out)
    raise typer.Exit(code)


@app.command()
def bench(
    events_n: Annotated[int, typer.Option("--events", help="Events to push through intake.")] = 20000,
    config: ConfigOpt = None,
) -> None:
    """Benchmark intake: worker events/s against raw XREADGROUP+XACK in the same run."""
    from ._bench import run_bench

    s = _settings(config)
    _run(run_bench(s, events_n, console=out))


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except CommitfleetError as exc:  # anything our code raises that a command did not handle
        err.print(f"commitfleet: {type(exc).__name__}: {exc}", markup=False, highlight=False)
        sys.exit(1)
