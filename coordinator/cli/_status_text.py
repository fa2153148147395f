"""``commitfleet status`` as text: a summary that stays short at any fleet size.

Without ``top`` limits every list is printed whole (``--all``); with it, each
list shows its first ``top`` rows (the oldest or busiest first) and one line
saying how many more there are, so the output stays under 60 lines whether
the fleet has 10 datasets or 100,000.
"""

from __future__ import annotations

import time
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


def print_status(out: Console, doc: dict[str, Any], *, top: int | None) -> None:
    """Print the status document ``doc`` (see ``fleet_status``) to ``out``; ``top`` None prints everything."""
    now = time.time()
    rows = doc["shard_table"]
    out.print(
        f"fleet [bold]{doc['fleet']}[/]  shards {doc['shards']}  leader {doc['leader'] or '-'}  "
        f"assignment epoch {doc['assignment_epoch']}"
    )
    pending = doc["pending"]
    queued = sum(r.get("queued", 0) for r in rows)
    running = sum(r.get("running", 0) for r in rows)
    out.print(
        f"open jobs {len({j['job'] for j in doc['open_jobs']})}  datasets waiting for tasks "
        f"{sum(p['state'] == 'waiting' for p in pending)}  queued {queued}  running {running}  "
        f"quarantined {len(doc['quarantined'])}  lag {sum(r['lag'] for r in rows)}  "
        f"dead letters {sum(r['dead_letters'] for r in rows)}  "
        f"moving {sum(bool(r['moving_to']) for r in rows)}  unowned {sum(not r['owner'] for r in rows)}",
        highlight=False,
    )
    for r in rows:
        if r.get("set_aside"):
            a = r["set_aside"]
            out.print(f"[red]shard {r['shard']} set aside[/]: {a['key']} field {a['field']!r}: {a['reason']}")
    workers, left = _cut(sorted(doc["workers"], key=lambda w: w["id"]), top)
    t = _table("worker", "host", "pid", "shards", "heartbeat age")
    for w in workers:
        t.add_row(w["id"], w["host"], str(w["pid"]), str(len(w["shards"])), f"{now - w['heartbeat_at']:.1f}s")
    out.print(t)
    _more(out, left, "workers")

    def busy(r: dict[str, Any]) -> tuple[float, ...]:
        return (-(r.get("oldest_pending_s") or 0.0), -r["lag"], -r.get("open_jobs", 0), r["shard"])

    shown, left = _cut(sorted(rows, key=busy) if top is not None else rows, top)
    t = _table("shard", "owner", "open jobs", "queued", "running", "quarantined", "lag", "oldest pending")
    for r in shown:
        oldest = r.get("oldest_pending_s")
        t.add_row(
            str(r["shard"]),
            r["owner"] or "-",
            str(r.get("open_jobs", 0)),
            str(r.get("queued", 0)),
            str(r.get("running", 0)),
            str(r.get("quarantined", 0)),
            str(r["lag"]),
            "-" if oldest is None else f"{oldest:.1f}s",
        )
    out.print(t)
    _more(out, left, "shards (busiest shown)")
    jobs, left = _cut(sorted(doc["open_jobs"], key=lambda j: j["opened_at"]), top)
    if jobs:
        t = _table("open job", "shard", "age", "datasets")
        for j in jobs:
            states = list(j["datasets"].values())
            summary = ", ".join(f"{s} {states.count(s)}" for s in sorted(set(states)))
            t.add_row(j["job"], str(j["shard"]), f"{now - j['opened_at']:.0f}s", summary)
        out.print(t)
        _more(out, left, "open jobs (oldest shown)")
    order = {"running": 0, "retrying": 0, "queued": 1, "blocked": 1, "waiting": 2}
    busy_rows, left = _cut(sorted(pending, key=lambda p: order.get(p["state"], 3)), top)
    if busy_rows:
        t = _table("pending dataset", "job", "state")
        for p in busy_rows:
            t.add_row(p["dataset"], p["job"], p["state"])
        out.print(t)
        _more(out, left, "pending datasets")
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
    if quarantined:
        t = _table("quarantined dataset", "job", "reason")
        for q in quarantined:
            t.add_row(q["dataset"], q["job"], q["reason"][:80])
        out.print(t)
        _more(out, left, "quarantined datasets")
    else:
        out.print("no quarantined datasets")
    unreadable, left = _cut(doc.get("unreadable", []), top)
    for u in unreadable:
        out.print(
            f"unreadable job record: shard {u['shard']} {u['key']} field {u['field']}: {u['error']}",
            markup=False,
            highlight=False,
        )
    _more(out, left, "unreadable job records")


__all__ = ["print_status"]
