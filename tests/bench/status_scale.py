"""The operator's surface at scale (issue 32 item 5): a script, not a test.

Builds a fleet with ``--datasets`` open datasets through the real path
(tests/_support/scale_fleet.py: a private redis-server, a coordinator process,
``--workers`` worker processes; ``--jobs`` jobs whose ``--tasks`` tasks per
dataset staged a tiny file in the local-files store and published
``task_finished``; no job finishes, so every dataset stays open), then, while
that state is there, measures each surface ``--runs`` times:

- the admin API: ``GET /status``, ``/metrics``, ``/status/datasets`` (a page
  filtered by job, by prefix, by state, by shard), ``/status/jobs``,
  ``/jobs/{job}``, ``/datasets/{name}``: time (median, max) and response bytes;
  the requests are ``--gap`` seconds apart, past the coordinator's 1 s status
  cache, so each one computes its answer, beside ``GET /healthz`` (the floor
  of a request on the same machine at the same moment). With ``--committing
  JOBS`` a second pass follows: that many jobs finish, and their datasets
  commit while measured (the fleet busy, as in issue 32's outside run). A
  route that answers 404 is reported ``absent`` (not built yet on this
  checkout);
- the coordinator's memory: RSS idle (before any event was published), and its
  peak (``VmHWM``) and current RSS after each kind of request, against idle;
- the CLI: ``commitfleet status``, ``--all`` and ``--json`` as processes: wall
  time, output bytes and the process's peak RSS.

Prints a table and writes the figures as JSON (``--out``)::

    .venv/bin/python -m tests.bench.status_scale --committing 10  # 100,000 datasets x 10 tasks
    .venv/bin/python -m tests.bench.status_scale --quick --out scale.json   # 5,000 datasets

Issue 32's targets at 100,000 open datasets: ``/status`` under 100 KB and
100 ms, ``/metrics`` under 100 ms, the coordinator's RSS within 1.5x idle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests._support.memory import rss_mb
from tests._support.scale_fleet import QUICK_DATASETS, OpenFleet, ScaleSpec, open_fleet, vm_mb

ROOT = Path(__file__).resolve().parents[2]


def _get(port: int, path: str, timeout: float) -> tuple[int, int, float]:
    """Return (HTTP status, body bytes, seconds until the whole body was read) of ``GET path``."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Accept": "application/json"})
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
            return resp.status, len(body), time.perf_counter() - t
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, len(body), time.perf_counter() - t


def _requests(fleet: OpenFleet) -> list[tuple[str, str]]:
    """Return (label, path) of every request measured, against the built state's names."""
    spec = fleet.spec
    job = spec.job_names()[spec.jobs // 2]
    dataset = spec.datasets_of(spec.jobs // 2)[0]
    prefix = dataset[:-2]  # a hundred datasets
    return [
        ("GET /healthz", "/healthz"),  # the floor: an HTTP round trip to the coordinator, nothing computed
        ("GET /status", "/status"),
        ("GET /metrics", "/metrics"),
        ("GET /status/datasets?job=", f"/status/datasets?job={job}&limit=100"),
        ("GET /status/datasets?prefix=", f"/status/datasets?prefix={prefix}&limit=100"),
        # open: every dataset of an unfinished job; pending: waiting for tasks or committing (none
        # in the quiet pass: the page that scans the most for the least)
        ("GET /status/datasets?state=open", "/status/datasets?state=open&limit=100"),
        ("GET /status/datasets?state=pending", "/status/datasets?state=pending&limit=100"),
        ("GET /status/datasets?shard=", "/status/datasets?shard=5&limit=100"),
        ("GET /status/jobs", "/status/jobs?limit=100"),
        ("GET /jobs/{job}", f"/jobs/{job}"),
        ("GET /datasets/{name}", f"/datasets/{dataset}"),
    ]


def _measure_http(fleet: OpenFleet, runs: int, gap: float, timeout: float) -> list[dict[str, Any]]:
    """Request each kind once per round, ``runs`` rounds (kinds interleaved: while the fleet commits,
    the load changes over the pass, and every kind sees the same share of it)."""
    pid = fleet.coordinator.pid
    kinds = _requests(fleet)
    times: dict[str, list[float]] = {label: [] for label, _ in kinds}
    sizes: dict[str, list[int]] = {label: [] for label, _ in kinds}
    codes: dict[str, list[int]] = {label: [] for label, _ in kinds}
    memory: dict[str, tuple[float, float]] = {}
    first = True
    for _ in range(runs):
        for label, path in kinds:
            if codes[label] and codes[label][-1] == 404:
                continue  # the route is not there: once is enough
            if not first:
                time.sleep(gap)  # past the status cache: each request computes its answer
            first = False
            code, size, secs = _get(fleet.http_port, path, timeout)
            codes[label].append(code)
            sizes[label].append(size)
            times[label].append(secs)
            memory[label] = (rss_mb(pid), vm_mb(pid, "VmHWM"))
    rows: list[dict[str, Any]] = []
    for label, path in kinds:
        row: dict[str, Any] = {
            "request": label,
            "path": path,
            "status": codes[label][-1],
            "absent": codes[label][-1] == 404,
            "runs": len(times[label]),
            "median_s": statistics.median(times[label]),
            "max_s": max(times[label]),
            "bytes_median": int(statistics.median(sizes[label])),
            "bytes_max": max(sizes[label]),
            "rss_mb": memory[label][0],
            "hwm_mb": memory[label][1],
        }
        rows.append(row)
        shown = "absent" if row["absent"] else f"{row['median_s']:.3f} s"
        print(
            f"  {label:<34} {shown} (HTTP {row['status']}), RSS after its last {row['rss_mb']:.0f} MB",
            flush=True,
        )
    return rows


def _cli(fleet: OpenFleet, extra: list[str], timeout: float) -> tuple[int, int, float, float]:
    """Run ``commitfleet status`` with ``extra``; return (exit code, stdout bytes, seconds, peak RSS MB)."""
    argv = [sys.executable, "-m", "coordinator", "status", "--config", str(fleet.config), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMITFLEET_") and k != "REDIS_URL"}
    env["COLUMNS"] = "160"
    with tempfile.TemporaryFile() as out:
        t = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while True:
            # wait4: this child's own rusage (its peak RSS), not every child's so far.
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.01)
        secs = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        size = out.seek(0, os.SEEK_END)
    return proc.returncode, size, secs, usage.ru_maxrss / 1024


def _measure_cli(fleet: OpenFleet, runs: int, timeout: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for label, extra in (("status", []), ("status --all", ["--all"]), ("status --json", ["--json"])):
        results = [_cli(fleet, extra, timeout) for _ in range(runs)]
        times = [r[2] for r in results]
        row = {
            "command": f"commitfleet {label}",
            "exit": results[-1][0],
            "runs": runs,
            "median_s": statistics.median(times),
            "max_s": max(times),
            "bytes_median": int(statistics.median(r[1] for r in results)),
            "rss_peak_mb": max(r[3] for r in results),
        }
        rows.append(row)
        print(f"  commitfleet {label:<20} {row['median_s']:.2f} s, exit {row['exit']}", flush=True)
    return rows


def _pass_table(p: dict[str, Any], idle: float) -> list[str]:
    base = next((row["median_s"] for row in p["http"] if row["request"] == "GET /healthz"), None)
    lines = [
        f"pass {p['name']!r}: {p['open_at_start']:,} open datasets at its start ({p['committing']:,} set "
        f"committing just before), {p['open_at_end']:,} at its end; load average {p['load'][0]:.1f} -> "
        f"{p['load'][1]:.1f}",
        f"{'request':<34} {'median':>9} {'max':>9} {'x healthz':>9} {'bytes':>11} {'RSS MB':>7} "
        f"{'peak MB':>8} {'peak/idle':>9}",
    ]
    for row in p["http"]:
        if row["absent"]:
            lines.append(f"{row['request']:<34} {'absent (404)':>9}")
            continue
        note = "" if row["status"] == 200 else f"  HTTP {row['status']}"
        ratio = f"{row['median_s'] / base:>8.0f}x" if base else f"{'':>9}"
        lines.append(
            f"{row['request']:<34} {row['median_s']:>8.3f}s {row['max_s']:>8.3f}s {ratio} "
            f"{row['bytes_median']:>11,} {row['rss_mb']:>7.0f} {row['hwm_mb']:>8.0f} "
            f"{row['hwm_mb'] / idle:>8.2f}x{note}"
        )
    lines += [f"{'command':<34} {'median':>9} {'max':>9} {'bytes':>11} {'peak RSS MB':>12}"]
    for row in p["cli"]:
        note = "" if row["exit"] == 0 else f"  exit {row['exit']}"
        lines.append(
            f"{row['command']:<34} {row['median_s']:>8.2f}s {row['max_s']:>8.2f}s {row['bytes_median']:>11,} "
            f"{row['rss_peak_mb']:>12.0f}{note}"
        )
    return lines


def _table(doc: dict[str, Any]) -> str:
    idle = doc["coordinator"]["idle_rss_mb"]
    took = doc["build_s"]
    lines = [
        f"status_scale: {doc['spec']['datasets']:,} open datasets x {doc['spec']['tasks']} tasks, "
        f"{doc['spec']['jobs']} jobs, {doc['spec']['workers']} workers, {doc['spec']['shards']} shards; "
        f"open datasets in Redis {doc['open_datasets']:,}; "
        f"Redis used_memory {doc['redis_used_memory_mb']:.0f} MB",
        f"built in {took['build']:.0f} s (staging and publishing {took['produce']:.0f} s: staging "
        f"{took['stage']:.0f} s of process time, publishing {took['publish']:.0f} s, side by side; "
        f"intake after the last publish {took['intake_after_publish']:.0f} s)",
        f"coordinator RSS idle {idle:.0f} MB (VmHWM {doc['coordinator']['idle_hwm_mb']:.0f} MB), built "
        f"{doc['coordinator']['loaded_rss_mb']:.0f} MB, at the end {doc['coordinator']['end_rss_mb']:.0f} MB "
        f"(VmHWM {doc['coordinator']['end_hwm_mb']:.0f} MB)",
    ]
    for p in doc["passes"]:
        lines += ["", *_pass_table(p, idle)]
    return "\n".join(lines)


async def _open_count(fleet: OpenFleet) -> int:
    import redis.asyncio

    from tests._support.scale_fleet import open_datasets

    r = redis.asyncio.Redis.from_url(fleet.redis_url)
    try:
        return await open_datasets(r, fleet.keys, fleet.spec.shards)
    finally:
        await r.aclose()


async def _pass(fleet: OpenFleet, args: argparse.Namespace, name: str, committing: int) -> dict[str, Any]:
    """Measure every surface once over; return the pass's figures."""
    start = await _open_count(fleet)
    load0 = os.getloadavg()[0]
    print(f"pass {name!r}: measuring the admin API", flush=True)
    http = await asyncio.to_thread(_measure_http, fleet, args.runs, args.gap, args.timeout)
    print(f"pass {name!r}: measuring the CLI", flush=True)
    cli = await asyncio.to_thread(_measure_cli, fleet, args.cli_runs, args.timeout)
    return {
        "name": name,
        "committing": committing,
        "open_at_start": start,
        "open_at_end": await _open_count(fleet),
        "http": http,
        "cli": cli,
        "load": [load0, os.getloadavg()[0]],
    }


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Build the state, measure it quiet (and, with ``--committing``, again while jobs commit); return
    the figures."""
    import redis.asyncio

    from tests._support.scale_fleet import finish_jobs

    spec = ScaleSpec(
        datasets=args.datasets, tasks=args.tasks, jobs=args.jobs, workers=args.workers, shards=args.shards
    )
    async with open_fleet(work, spec, progress=True) as fleet:
        r = redis.asyncio.Redis.from_url(fleet.redis_url)
        try:
            count = await _open_count(fleet)
            used = int((await r.info("memory"))["used_memory"]) / 1e6
            loaded = rss_mb(fleet.coordinator.pid)
            passes = [await _pass(fleet, args, "quiet", 0)]
            if args.committing:
                committing = await finish_jobs(fleet, r, args.committing)
                print(f"{args.committing} jobs finished: {committing} datasets committing", flush=True)
                passes.append(await _pass(fleet, args, "committing", committing))
        finally:
            await r.aclose()
        coordinator = {
            "idle_rss_mb": fleet.idle_rss_mb,
            "idle_hwm_mb": fleet.idle_hwm_mb,
            "loaded_rss_mb": loaded,
            "end_rss_mb": rss_mb(fleet.coordinator.pid),
            "end_hwm_mb": vm_mb(fleet.coordinator.pid, "VmHWM"),
        }
        return {
            "spec": vars(spec),
            "open_datasets": count,
            "redis_used_memory_mb": used,
            "build_s": fleet.phases_s,
            "coordinator": coordinator,
            "passes": passes,
            "at": time.time(),
        }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command line's options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", type=int, default=100_000, help="open datasets")
    p.add_argument("--tasks", type=int, default=10, help="task reports per dataset")
    p.add_argument("--jobs", type=int, default=100, help="open jobs the datasets are split over")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--shards", type=int, default=64)
    p.add_argument(
        "--committing",
        type=int,
        default=0,
        metavar="JOBS",
        help="after the quiet pass, finish this many jobs and measure again while their datasets commit",
    )
    p.add_argument("--quick", action="store_true", help=f"{QUICK_DATASETS:,} datasets (a smoke run)")
    p.add_argument("--runs", type=int, default=5, help="requests of each kind")
    p.add_argument("--cli-runs", type=int, default=3, help="runs of each CLI command")
    p.add_argument(
        "--gap", type=float, default=1.2, help="seconds between two requests (past the status cache)"
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a request or command may take")
    p.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.datasets = QUICK_DATASETS
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the bench; return 0."""
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="commitfleet-status-scale-") as tmp:
        doc = asyncio.run(run(args, Path(tmp)))
        print()
        print(_table(doc))
        if args.out:
            args.out.write_text(json.dumps(doc, indent=2) + "\n")
            print(f"\nfigures written to {args.out}")
        staged = doc["spec"]["datasets"] * doc["spec"]["tasks"]
        print(f"removing the built state ({staged:,} staged files)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
