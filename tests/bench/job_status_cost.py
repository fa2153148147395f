"""What a job's status changes cost as the job grows (issue 31 item 4): a script, not a test.

One job of N datasets on one shard, against a real ``redis-server`` it starts, through the worker's own
code: the job's events decided (``decide``), folded in (``ShardJobs.apply``) and saved in batches of 500 as
intake saves them (``ShardStateStore.save``), then every dataset's end recorded one by one as the actions
record it (``ShardLedger.set_status``: the status, the driver's result, the job's end with the last one).

- ``abort``: ``job_started`` naming the N datasets, then ``job_failed``; then N ``aborted``.
- ``commit``: ``job_started``, one ``task_finished`` per dataset, ``job_finished``; then N ``committed``.

The store work of an abort or a commit (locks, files) is not part of it: only what the shard state costs,
which is what grew with the job. Each measurement runs in a child process that imports the worker from a
checkout (``--compare DIR``: another checkout, e.g. ``git worktree add --detach /tmp/before main``), the
two alternated in the same run, each phase cut at ``--budget`` seconds (then reported as the part done)::

    .venv/bin/python -m tests.bench.job_status_cost --datasets 10000,100000 --compare /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_BATCH = 500  # worker.read_batch's default: intake saves a batch of this many events at once


async def _measure(url: str, n: int, kind: str, budget: float) -> dict[str, Any]:
    """Run one measurement with the ``workers`` first on ``sys.path``; return its figures."""
    import redis.asyncio

    from shared.events import (
        DatasetExpectation,
        JobFailed,
        JobFinished,
        JobStarted,
        QueueEvent,
        StagedFile,
        TaskFinished,
    )
    from shared.queue import Keys
    from workers._core import ShardJobs, decide
    from workers._ledger import ShardLedger
    from workers._state_store import Batch, ShardStateStore

    r = redis.asyncio.Redis.from_url(url)
    keys = Keys(f"bench{secrets.token_hex(4)}")
    await r.set(keys.shard_state(0, "owner"), b"w@1")
    store = ShardStateStore(r, keys, 0, b"w@1")
    names = [f"ds{i:06d}" for i in range(n)]
    events: list[QueueEvent] = [JobStarted(job="j", datasets=names, timeout_s=3600, started_at=0.0)]
    if kind == "abort":
        events.append(JobFailed(job="j", datasets=names, reason="bench", failed_at=0.0))
        status = "aborted"
    else:
        files = [StagedFile(path="part-0", size=1)]
        events += [
            TaskFinished(job="j", dataset=d, task=0, attempt=0, files=files, finished_at=0.0) for d in names
        ]
        events.append(
            JobFinished(job="j", datasets=dict.fromkeys(names, DatasetExpectation(tasks=1)), finished_at=0)
        )
        status = "committed"
    state = ShardJobs()
    out: dict[str, Any] = {"datasets": n, "kind": kind}
    started = time.perf_counter()
    done = 0
    for i in range(0, len(events), _BATCH):
        batch = Batch()
        for ev in events[i : i + _BATCH]:
            d = decide(state, ev, now=time.time(), default_timeout=3600.0)
            state.apply(d)
            job = getattr(d, "job_id", "") or (d.job.job if d.job is not None else "")
            if d.job is not None:
                batch.jobs.add(d.job.job)
            if hasattr(batch, "datasets"):  # state v2: the datasets the event changed
                batch.datasets.update((job, name) for name in getattr(d, "datasets", None) or ())
            if d.attempt is not None:
                ds, rec = d.attempt
                batch.attempts[(job, ds, rec.task, rec.attempt)] = rec
            done += 1
        await store.save(batch, state)
        if time.perf_counter() - started > budget:
            break
    out["events"] = {"done": done, "of": len(events), "s": time.perf_counter() - started}
    if done == len(events):
        ledger = ShardLedger()
        ledger.begin(store)
        ledger.load(state)
        await r.config_resetstat()
        started = mark = time.perf_counter()
        changed = 0
        fifths: list[float] = []  # ms per change in each fifth of the job: flat when O(1)
        for name in names:
            await ledger.set_status("j", name, status)  # type: ignore[arg-type]
            changed += 1
            if changed % (n // 5) == 0:
                fifths.append(round((time.perf_counter() - mark) / (n // 5) * 1000, 3))
                mark = time.perf_counter()
            if changed % 100 == 0 and time.perf_counter() - started > budget:
                break
        out["status"] = {"done": changed, "of": n, "s": time.perf_counter() - started, "fifths": fifths}
        stats = await r.info("commandstats")
        out["redis_us_per_save"] = stats.get("cmdstat_evalsha", {}).get("usec_per_call")
        if changed == n:
            assert state.ended["j"].status == status, "the job ended with its last dataset"
    left = [keys.shard_state(0, k) for k in ("jobs", "datasets", "attempts")]
    out["state_keys_left"] = int(await r.exists(*left))  # 0 once the job ended: nothing of it is kept
    async for key in r.scan_iter(match=f"cf:{keys.fleet}:*", count=1000):
        await r.unlink(key)
    await r.aclose()
    return out


def _child(checkout: Path, url: str, n: int, kind: str, budget: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = [sys.executable, __file__, "--child", url, str(n), kind, str(budget)]
    proc = subprocess.run(
        argv, env=env, cwd=checkout, capture_output=True, text=True, timeout=6 * budget + 120
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{checkout}: {proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _shown(phase: dict[str, Any] | None) -> str:
    if phase is None:
        return "not reached"
    fifths = f" (ms each, by fifths: {phase['fifths']})" if phase.get("fifths") else ""
    if phase["done"] == phase["of"]:
        return f"{phase['s']:.2f} s{fifths}"
    return f"> {phase['s']:.0f} s ({phase['done']} of {phase['of']} in the budget){fifths}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--datasets", default="10000,100000", help="job sizes, comma-separated")
    parser.add_argument("--kinds", default="abort,commit")
    parser.add_argument("--compare", type=Path, help="another checkout, measured alternately with this one")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--budget", type=float, default=120.0, help="seconds each phase may take at most")
    parser.add_argument(
        "--compare-budget", type=float, help="the same for the other checkout (default: --budget)"
    )
    parser.add_argument("--child", nargs=4, metavar=("URL", "N", "KIND", "BUDGET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        from workers import tune_gc

        tune_gc()  # as a worker process does at start-up (workers/_heap.py)
        url, n, kind, budget = args.child
        print(json.dumps(asyncio.run(_measure(url, int(n), kind, float(budget)))))
        return
    from tests._support.redis_server import RedisServer

    here = Path(__file__).resolve().parents[2]
    budgets = {"this": args.budget, "compare": args.compare_budget or args.budget}
    checkouts = [("this", here)] + ([("compare", args.compare.resolve())] if args.compare else [])
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        try:
            for n in (int(x) for x in args.datasets.split(",")):
                for kind in args.kinds.split(","):
                    for rnd in range(args.rounds):
                        order = checkouts if rnd % 2 == 0 else checkouts[::-1]
                        for label, path in order:
                            res = _child(path, server.url, n, kind, budgets[label])
                            print(
                                f"{n:>7} datasets  {kind:<6}  {label:<7}  events {_shown(res['events'])}"
                                f"  |  {n} status changes {_shown(res.get('status'))}"
                                f"  |  Redis {res.get('redis_us_per_save')} us per save"
                                f"  |  state keys left {res['state_keys_left']}",
                                flush=True,
                            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
