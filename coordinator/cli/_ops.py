"""The operator commands: ``events``, ``status``, ``retry``, ``skip``, ``wait``, ``audit``, ``schema``.

Each imports what it uses in its body (their async bodies are in ``_ops_run``):
`commitfleet status` and `--help` must not pay for the worker, the coordinator's
HTTP server, the commit core or a cloud SDK (tests/unit/test_cli_imports.py
checks it, tests/bench/status_latency.py measures it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from shared import BadInput

from ._common import ConfigOpt, err, out, run_or_exit, settings_or_exit

# How many rows of each list `commitfleet status` shows without --all (the output stays under 60 lines).
STATUS_TOP = 5

WaitOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for the owner to act.")]


def events(
    config: ConfigOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following new events.")] = False,
    type_: Annotated[
        list[str] | None,
        typer.Option(
            "--type", "-t", help="Only these event types (repeat it, or separate them with commas)."
        ),
    ] = None,
    dataset: Annotated[str | None, typer.Option(help="Only this dataset.")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    last: Annotated[
        int,
        typer.Option(
            min=0,
            help="Show the last N matching events first (0 = none), looking back at most "
            "max(20 N, 10,000) entries.",
        ),
    ] = 50,
) -> None:
    """Show the admin event stream (``--follow`` keeps going)."""
    from coordinator.admin import event_types, filter_names

    from ._ops_run import print_events

    s = settings_or_exit(config)
    try:
        types = event_types(type_ or [])
        filter_names(dataset, job)
    except BadInput as exc:
        err.print(f"commitfleet: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    run_or_exit(
        print_events(s, follow=follow, types=types, dataset=dataset, job=job, as_json=as_json, last=last)
    )


def status(
    config: ConfigOpt = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='JSON Lines: the summary, then one line per open job ({"job": ...}) and per open '
            'dataset ({"dataset": ...}), printed as they are read.',
        ),
    ] = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="Every shard, open job and pending dataset, page by page.")
    ] = False,
) -> None:
    """Show a summary (per shard: open jobs, queued, running, quarantined, lag) and the top of each list."""
    from ._status_run import show_status

    s = settings_or_exit(config)

    def write(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()

    run_or_exit(show_status(s, out, write, top=None if show_all else STATUS_TOP, as_json=as_json))


def _operator(op: str, dataset: str, job: str, config: Path | None, wait_s: float) -> None:
    from ._ops_run import operator_request

    s = settings_or_exit(config)
    out.print(run_or_exit(operator_request(s, dataset, job, op, wait_s=wait_s)))


def retry(dataset: str, job: str, config: ConfigOpt = None, timeout: WaitOpt = 120.0) -> None:
    """Retry a quarantined dataset's commit sequence (after fixing the cause)."""
    _operator("retry", dataset, job, config, timeout)


def skip(dataset: str, job: str, config: ConfigOpt = None, timeout: WaitOpt = 120.0) -> None:
    """Skip (roll back) a quarantined dataset's commit sequence, unblocking the dataset."""
    _operator("skip", dataset, job, config, timeout)


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

    s = settings_or_exit(config)
    outcome, complete = run_or_exit(wait_outcome(s, job, datasets, timeout))
    for row in outcome_rows(outcome):
        if as_json:
            sys.stdout.write(json.dumps(row) + "\n")
        else:
            detail = row["manifest"] if row["status"] == "committed" else row["reason"]
            sys.stdout.write(f"{row['dataset']}\t{row['status']}\t{detail}\n")
    raise typer.Exit(exit_code(outcome, complete))


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

    from ._ops_run import run_audit

    s = settings_or_exit(config)
    url = root if "://" in root else Path(root).resolve().as_uri()
    report = run_or_exit(run_audit(s, url))
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


def schema(
    admin: Annotated[
        bool, typer.Option("--admin", help="The admin events' schema instead of the queue's.")
    ] = False,
) -> None:
    """Print the JSON Schema of the queue events (or the admin events)."""
    from shared.events import admin_event_schema, queue_event_schema

    doc = admin_event_schema() if admin else queue_event_schema()
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def register(app: typer.Typer) -> None:
    """Add this group's commands to ``app``, in the order ``--help`` lists them."""
    for command in (events, status, retry, skip, wait, audit, schema):
        app.command()(command)


__all__ = ["STATUS_TOP", "audit", "events", "register", "retry", "schema", "skip", "status", "wait"]
