"""``commitfleet status`` as text: a summary that stays short at any fleet size.

Without ``top`` limits every list is printed whole (``--all``: the open jobs and
datasets page by page, as they come); with it, each list shows its first ``top``
rows (the oldest or busiest first) and one line saying how many more there are,
so the output stays under 60 lines whether the fleet has 10 datasets or 100,000.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table


def _table(*columns: str) -> Table:
    # No borders: one line of header, one line per row.
    return Table(*columns, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))


def _cut(rows: list[Any], top: int | None) -> tuple[list[Any], int]:
    if top is None or len(rows) <= top:
        return rows, 0
    return rows[:top], len(rows) - top


def _more(out: Console, left: int, what: str) -> None:
    if left:
        out.print(f"  ... and {left} more {what} (--all or --json for every one)", highlight=False)


def print_head(out: Console, doc: dict[str, Any], *, top: int | None) -> None:
    """Print the summary ``doc`` (see ``fleet_summary``): totals, set-aside shards, workers and shards
    (``top`` None: every one, else the first ``top`` and how many more)."""
    now = time.time()
    rows = doc["shard_table"]
    t = doc["totals"]
    out.print(
        f"fleet [bold]{doc['fleet']}[/]  shards {doc['shards']}  leader {doc['leader'] or '-'}  "
        f"assignment epoch {doc['assignment_epoch']}"
    )
    out.print(
        f"open jobs {t['open_jobs']}  datasets waiting for tasks {t['waiting']}  queued {t['queued']}  "
        f"running {t['running']}  blocked {t['blocked']}  quarantined {t['quarantined']}  "
        f"lag {sum(r['lag'] for r in rows)}  dead letters {sum(r['dead_letters'] for r in rows)}  "
        f"moving {sum(bool(r['moving_to']) for r in rows)}  unowned {sum(not r['owner'] for r in rows)}",
        highlight=False,
    )
    for r in rows:
        if r.get("set_aside"):
            a = r["set_aside"]
            out.print(f"[red]shard {r['shard']} set aside[/]: {a['key']} field {a['field']!r}: {a['reason']}")
    workers, left = _cut(sorted(doc["workers"], key=lambda w: w["id"]), top)
    tw = _table("worker", "host", "pid", "shards", "heartbeat age")
    for w in workers:
        tw.add_row(
            w["id"], w["host"], str(w["pid"]), str(len(w["shards"])), f"{now - w['heartbeat_at']:.1f}s"
        )
    out.print(tw)
    _more(out, left, "workers")

    def busy(r: dict[str, Any]) -> tuple[float, ...]:
        return (-(r.get("oldest_pending_s") or 0.0), -r["lag"], -r.get("open_jobs", 0), r["shard"])

    shown, left = _cut(sorted(rows, key=busy) if top is not None else rows, top)
    ts = _table("shard", "owner", "open jobs", "queued", "running", "quarantined", "lag", "oldest pending")
    for r in shown:
        oldest = r.get("oldest_pending_s")
        ts.add_row(
            str(r["shard"]),
            r["owner"] or "-",
            str(r.get("open_jobs", 0)),
            str(r.get("queued", 0)),
            str(r.get("running", 0)),
            str(r.get("quarantined", 0)),
            str(r["lag"]),
            "-" if oldest is None else f"{oldest:.1f}s",
        )
    out.print(ts)
    _more(out, left, "shards (busiest shown)")


def print_jobs(out: Console, jobs: list[dict[str, Any]], *, header: bool) -> None:
    """Print one page of open jobs (``GET /status/jobs`` items); ``header``: the first page."""
    if not jobs:
        return
    now = time.time()
    t = _table("open job", "shards", "age")
    t.show_header = header
    for j in jobs:
        t.add_row(j["job"], ",".join(map(str, j["shards"])), f"{now - j['opened_at']:.0f}s")
    out.print(t)


def print_datasets(out: Console, items: list[dict[str, Any]], *, header: bool) -> None:
    """Print one page of open work (``GET /status/datasets`` items); ``header``: the first page."""
    if not items:
        return
    t = _table("pending dataset", "job", "shard", "state")
    t.show_header = header
    for p in items:
        t.add_row(p["dataset"], p["job"], str(p["shard"]), p["state"])
    out.print(t)


def pending_total(doc: dict[str, Any]) -> int:
    """Return how many datasets ``doc``'s totals count as pending (waiting, queued, running, blocked)."""
    t = doc["totals"]
    return int(t["waiting"] + t["queued"] + t["running"] + t["blocked"])


def print_tail(out: Console, doc: dict[str, Any], *, top: int | None) -> None:
    """Print the work in flight, the quarantined sequences and the unreadable job records of ``doc``."""
    flights, left = _cut(sorted(doc.get("in_flight", []), key=lambda f: -f.get("age_s", 0.0)), top)
    if flights:
        t = _table("in flight", "state", "age", "attempts", "last error")
        for f in flights:
            t.add_row(
                f["label"],
                f["state"],
                f"{f.get('age_s', 0.0):.1f}s",
                str(f.get("attempts", "")),
                f.get("last_error", "")[:80],
            )
        out.print(t)
        _more(out, left, "in flight (oldest shown)")
    quarantined, left = _cut(doc["quarantined"], top)
    left += max(0, doc["totals"]["quarantined"] - len(doc["quarantined"]))
    if quarantined:
        t = _table("quarantined dataset", "job", "reason")
        for q in quarantined:
            t.add_row(q["dataset"], q["job"], q["reason"][:80])
        out.print(t)
        _more(out, left, "quarantined datasets")
    else:
        out.print("no quarantined datasets")
    unreadable, left = _cut(doc.get("unreadable", []), top)
    left += max(0, doc.get("unreadable_count", 0) - len(doc.get("unreadable", [])))
    for u in unreadable:
        out.print(
            f"unreadable job record: shard {u['shard']} {u['key']} field {u['field']}: {u['error']}",
            markup=False,
            highlight=False,
        )
    _more(out, left, "unreadable job records")


def print_status(
    out: Console,
    doc: dict[str, Any],
    *,
    top: int | None,
    jobs: Sequence[dict[str, Any]] = (),
    pending: Sequence[dict[str, Any]] = (),
) -> None:
    """Print the summary ``doc`` with the first page of open ``jobs`` and of ``pending`` datasets
    (each cut to ``top``, and how many more there are by ``doc``'s totals)."""
    print_head(out, doc, top=top)
    shown, _ = _cut(list(jobs), top)
    print_jobs(out, shown, header=True)
    _more(out, max(0, doc["totals"]["open_jobs"] - len(shown)), "open jobs")
    shown, _ = _cut(list(pending), top)
    print_datasets(out, shown, header=True)
    _more(out, max(0, pending_total(doc) - len(shown)), "pending datasets")
    print_tail(out, doc, top=top)


__all__ = ["pending_total", "print_datasets", "print_head", "print_jobs", "print_status", "print_tail"]
