"""``commitfleet job JOB`` and ``commitfleet dataset NAME``: one job or one dataset, as text or JSON.

They print the same pages as ``GET /jobs/{job}`` and ``GET /datasets/{name}``
(coordinator/admin/_job_page.py, _dataset_page.py), read from Redis (and, for
a dataset, from the store when ``store.url`` is set). Exit codes: 0 shown,
2 a bad name or setting, 3 Redis or the store unreachable, 4 no such job /
dataset.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from shared import BadInput, NotFound, Settings

from ._common import ConfigOpt, err, out, run_or_exit, settings_or_exit

if TYPE_CHECKING:
    import redis.asyncio

    from shared.queue import Keys

EXIT_NOT_FOUND: Final = 4
"""Exit code of ``job`` / ``dataset`` for a name the fleet does not know."""


def _table(*columns: str) -> Table:
    return Table(*columns, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))


def _row(t: Table, *cells: str) -> None:
    # Names and reasons come from producers: text, never Rich markup ("[bold]" in a name stays as is).
    t.add_row(*(Text(c) for c in cells))


def _when(at: float | None, now: float) -> str:
    return "-" if at is None else f"{max(0.0, now - at):.1f}s ago"


@asynccontextmanager
async def _fleet(s: Settings) -> AsyncIterator[tuple[redis.asyncio.Redis, Keys, Settings]]:
    """Yield a Redis client, the fleet's keys and the settings with the fleet's shard count."""
    from shared.queue import Keys, connect, existing_fleet

    r = connect(s.redis, client_name="commitfleet-cli")
    try:
        s = await existing_fleet(r, s)
        yield r, Keys(s.fleet.name), s
    finally:
        await r.aclose()


def _bad(exc: Exception, code: int) -> typer.Exit:
    err.print(f"commitfleet: {exc}", markup=False, highlight=False)
    return typer.Exit(code)


def print_job(console: Console, doc: dict[str, Any], *, header: bool = True) -> None:
    """Print a job page ``doc`` (see ``job_page``) as text; ``header`` False prints its datasets only."""
    now = time.time()
    if header:
        live = doc["liveness"]
        line = f"job [bold]{doc['job']}[/]  liveness {live['state']}"
        if live["state"] != "ended":
            beat = _when(live["beat_at"], now)
            line += f"  last beat {beat}  silent {live['silent_s']}s of {live['timeout_s']}s"
        console.print(line, highlight=False)
        t = _table("shard", "state", "opened / ended", "results", "driver beat")
        for row in doc["shards"]:
            if row["state"] == "open":
                when = _when(row["opened_at"], now)
                beat = _when(row["alive"]["beat_at"], now) if row["alive"] else "none"
            else:
                ended = row.get("ended") or {}
                when = f"{ended.get('status', '-')} {_when(ended.get('at'), now)}"
                beat = "-"
            _row(t, str(row["shard"]), row["state"], when, str(row["results"]), beat)
        console.print(t if doc["shards"] else "no shard holds this job now (its state and results are gone)")
    if doc["datasets"]:
        t = _table("dataset", "shard", "status", "files", "bytes", "reason / manifest")
        for d in doc["datasets"]:
            res = d.get("result") or {}
            detail = res.get("manifest") or d.get("reason") or res.get("reason") or ""
            _row(
                t,
                d["dataset"],
                str(d["shard"]),
                d["status"],
                str(res.get("files", "")),
                str(res.get("bytes", "")),
                detail[:80],
            )
        console.print(t)
    if header:
        for e in doc.get("events", []):
            ev = e["event"]
            detail = " ".join(
                f"{k}={v}"
                for k, v in ev.items()
                if k not in ("v", "type", "at", "phases") and v not in ("", None)
            )
            console.print(
                f"{time.strftime('%H:%M:%S', time.localtime(ev['at']))} {ev['type']} {detail}",
                markup=False,
                highlight=False,
            )


def print_dataset(console: Console, doc: dict[str, Any]) -> None:
    """Print a dataset page ``doc`` (see ``dataset_page``) as text."""
    now = time.time()
    console.print(
        f"dataset [bold]{escape(doc['dataset'])}[/]  shard {doc['shard']}  owner {doc['owner'] or '-'}",
        highlight=False,
    )
    store = doc["store"]
    if store is None:
        console.print("store not configured (store.url): no lock, commits or watermarks shown")
    else:
        lock = store["lock"]
        if lock is None:
            console.print("lock: never taken")
        elif "error" in lock:
            console.print(f"lock: unreadable: {lock['error']}", markup=False, highlight=False)
        else:
            state = "held" if lock["held"] else ("released" if lock["released"] else "expired")
            left = lock["expires_at"] - now
            expiry = f"in {left:.1f}s" if left > 0 else f"{-left:.1f}s ago"
            console.print(
                f"lock: {state}  holder {lock['holder']}  epoch {lock['epoch']}  expires {expiry}",
                markup=False,
                highlight=False,
            )
        wm = store["watermarks"]
        if wm and "values" in wm:
            console.print(
                "watermarks: " + (", ".join(f"{k}={v}" for k, v in sorted(wm["values"].items())) or "none"),
                markup=False,
                highlight=False,
            )
        if store["commits"]:
            t = _table("commit (job)", "files", "bytes", "committed", "epoch", "watermarks")
            for c in store["commits"]:
                if "error" in c:
                    _row(t, c["job"], "", "", "", "", c["error"][:80])
                    continue
                marks = ", ".join(f"{k}={v}" for k, v in sorted(c["watermarks"].items()))
                _row(
                    t,
                    c["job"],
                    str(c["files"]),
                    str(c["bytes"]),
                    _when(c["committed_at"], now),
                    str(c["epoch"]),
                    marks[:60],
                )
            console.print(t)
            if not store["commits_listed_all"]:
                console.print("  (older commits not listed: the listing stops after the first keys)")
        else:
            console.print("no commits")
    if doc["open_work"]:
        t = _table("open work (job)", "status", "reason")
        for w in doc["open_work"]:
            _row(t, w["job"], w["status"], w["reason"][:80])
        console.print(t)
        if doc["open_work_next"]:
            console.print(
                f"  ... more open work: GET /status/datasets?dataset={doc['dataset']}",
                markup=False,
                highlight=False,
            )
    else:
        console.print("no open work")
    if doc["quarantined"]:
        t = _table("quarantined (job)", "from", "reason", "actions")
        for q in doc["quarantined"]:
            _row(
                t,
                q["job"],
                q["source"],
                q["reason"][:80],
                ", ".join(f"commitfleet {op} {doc['dataset']} {q['job']}" for op in q["actions"]),
            )
        console.print(t)
    else:
        console.print("not quarantined")


async def _job_pages(
    s: Settings, job: str, *, cursor: str | None, limit: int, every: bool, as_json: bool
) -> None:
    from coordinator.admin import job_page

    async with _fleet(s) as (r, keys, s):
        doc = await job_page(r, keys, s, job, cursor=cursor, limit=limit)
        if as_json and not every:
            sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
            return
        if as_json:
            head = {k: v for k, v in doc.items() if k not in ("datasets", "next")}
            sys.stdout.write(json.dumps(head, default=str) + "\n")
        else:
            print_job(out, doc)
        while True:
            if as_json:
                for d in doc["datasets"]:
                    sys.stdout.write(json.dumps(d, default=str) + "\n")
            if not every or doc["next"] is None:
                break
            # One page at a time: --all prints 100,000 datasets without holding them.
            doc = await job_page(r, keys, s, job, cursor=doc["next"], limit=limit, events=0)
            if not as_json:
                print_job(out, doc, header=False)
        if not as_json and doc["next"] is not None:
            out.print(
                f"  ... more datasets: --cursor {doc['next']} (or --all)", highlight=False, markup=False
            )


async def _dataset(s: Settings, name: str, *, commits: int) -> dict[str, Any]:
    from coordinator.admin import dataset_page

    async with _fleet(s) as (r, keys, s):
        if not s.store.url:
            return await dataset_page(r, keys, s, name, store=None, commits=commits)
        from shared.storage import open_store

        async with open_store(s.store.url, s.store) as store:
            return await dataset_page(r, keys, s, name, store=store, commits=commits)


def job(
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="The job id.")],
    config: ConfigOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the page as JSON (--all: JSON lines).")
    ] = False,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Datasets per page.")] = 100,
    cursor: Annotated[str | None, typer.Option(help="Go on from this page cursor (a page's 'next').")] = None,
    every: Annotated[bool, typer.Option("--all", help="Every dataset, page by page.")] = False,
) -> None:
    """Show one job: its shards, its driver's liveness, its datasets' states and results, its events.

    Exit 0 shown, 2 bad job id, 3 Redis unreachable, 4 no such job."""
    from coordinator.admin import check_job_name

    s = settings_or_exit(config)
    try:
        check_job_name(job_id)
        run_or_exit(_job_pages(s, job_id, cursor=cursor, limit=limit, every=every, as_json=as_json))
    except BadInput as exc:
        raise _bad(exc, 2) from None
    except NotFound as exc:
        raise _bad(exc, EXIT_NOT_FOUND) from None


def dataset(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The dataset name.")],
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the page as JSON.")] = False,
    commits: Annotated[int, typer.Option(min=1, max=100, help="How many of the newest commits.")] = 10,
) -> None:
    """Show one dataset: its shard, newest commits, open work, lock and quarantine.

    Exit 0 shown, 2 bad name, 3 Redis or the store unreachable, 4 no such dataset."""
    from coordinator.admin import check_dataset_name

    s = settings_or_exit(config)
    try:
        check_dataset_name(name)
        doc = run_or_exit(_dataset(s, name, commits=commits))
    except BadInput as exc:
        raise _bad(exc, 2) from None
    except NotFound as exc:
        raise _bad(exc, EXIT_NOT_FOUND) from None
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        print_dataset(out, doc)


def register(app: typer.Typer) -> None:
    """Add this group's commands to ``app``."""
    for command in (job, dataset):
        app.command()(command)


__all__ = ["EXIT_NOT_FOUND", "dataset", "job", "print_dataset", "print_job", "register"]
