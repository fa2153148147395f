"""`commitfleet status` stays short at any size; `--all` prints everything; `--help` imports no SDK."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from typing import Any

from rich.console import Console

from coordinator.admin._metrics import FleetMetrics
from coordinator.cli._status_text import print_status


def big_doc(shards: int, datasets: int, workers: int) -> dict[str, Any]:
    now = time.time()
    states = ["waiting", "queued", "running", "retrying", "blocked"]
    pending = [
        {
            "dataset": f"ds{i}",
            "job": f"job{i // 1000}",
            "shard": i % shards,
            "status": "committing",
            "state": states[i % 5],
            "reason": "",
        }
        for i in range(datasets)
    ]
    return {
        "fleet": "big",
        "shards": shards,
        "leader": "c1",
        "assignment_epoch": 3,
        "workers": [
            {
                "id": f"w{i}",
                "host": "h",
                "pid": i,
                "heartbeat_at": now,
                "shards": list(range(i, shards, workers)),
            }
            for i in range(workers)
        ],
        "expired_workers": [],
        "shard_table": [
            {
                "shard": s,
                "owner": f"w{s % workers}",
                "moving_to": None,
                "length": 10,
                "pending": 3,
                "lag": s,
                "dead_letters": 1,
                "set_aside": None,
                "oldest_pending_s": float(s),
                "open_jobs": 2,
                "waiting": 1,
                "queued": 1,
                "running": 1,
                "quarantined": 0,
            }
            for s in range(shards)
        ],
        # Not part of the summary: the first pages of GET /status/jobs and /status/datasets.
        "_jobs": [
            {"job": f"job{j}", "shards": [j % shards], "opened_at": now - j, "deadline": now}
            for j in range(datasets // 1000 + 1)
        ],
        "_pending": pending,
        "totals": {
            "open_jobs": datasets // 1000 + 1,
            "datasets": datasets,
            "waiting": max(0, datasets - 2 * shards),
            "queued": shards,
            "running": shards,
            "blocked": 0,
            "quarantined": datasets // 100,
        },
        "quarantined": [
            {"dataset": f"q{i}", "job": "j", "reason": "boom"} for i in range(min(100, datasets // 100))
        ],
        "in_flight": [
            {
                "label": f"commit|job|ds{i}",
                "state": "running",
                "age_s": float(i),
                "attempts": 1,
                "last_error": "",
            }
            for i in range(128)
        ],
        "unreadable": [],
        "counters": {},
        "at": now,
    }


def render(doc: dict[str, Any], top: int | None) -> list[str]:
    buf = io.StringIO()
    summary = {k: v for k, v in doc.items() if not k.startswith("_")}
    out = Console(file=buf, width=140, force_terminal=False)
    print_status(out, summary, top=top, jobs=doc["_jobs"], pending=doc["_pending"])
    return buf.getvalue().splitlines()


def test_status_is_under_60_lines_at_any_size() -> None:
    for shards, datasets, workers in [(1, 0, 1), (8, 50, 2), (64, 100_000, 4), (256, 100_000, 64)]:
        lines = render(big_doc(shards, datasets, workers), top=5)
        assert len(lines) < 60, (shards, datasets, workers, len(lines), "\n".join(lines))
    text = "\n".join(render(big_doc(64, 100_000, 4), top=5))
    assert "queued 64  running 64" in text  # the summary's totals
    assert "... and 59 more shards" in text
    assert "... and 99995 more pending datasets" in text
    assert "... and 995 more quarantined datasets" in text  # 1000 counted, 100 listed, 5 shown
    # The busiest shard (oldest pending entry) is shown first.
    shard_rows = [ln.split() for ln in text.splitlines() if ln.split()[:1] == ["63"]]
    assert shard_rows and shard_rows[0][1] == "w3"


def test_open_jobs_counts_jobs_not_job_shard_pairs() -> None:
    doc = big_doc(8, 0, 2)
    # One job open on three shards, another on one: the summary counts 2 jobs (fleet_summary walks
    # the job records' names, tests/fleet/test_status_summary.py), shard rows count job records.
    doc["_jobs"] = [
        {**doc["_jobs"][0], "job": "spread", "shards": [0, 1, 2]},
        {**doc["_jobs"][0], "job": "single"},
    ]
    doc["totals"]["open_jobs"] = 2
    for row in doc["shard_table"]:
        row["open_jobs"] = 1 if row["shard"] in (0, 1, 2, 5) else 0
    text = "\n".join(render(doc, top=5))
    assert "open jobs 2 " in text, text
    assert "0,1,2" in text, text
    summary = {k: v for k, v in doc.items() if not k.startswith("_")}
    exposition = FleetMetrics().render(summary).decode()
    assert "commitfleet_open_jobs{" in exposition
    assert re.search(r"^commitfleet_open_jobs\{[^}]*\} 2\.0$", exposition, re.M), exposition


def test_status_all_prints_every_row() -> None:
    doc = big_doc(16, 2000, 4)
    lines = render(doc, top=None)
    assert sum(1 for ln in lines if ln.strip().startswith("ds")) == 2000
    assert not any("more" in ln and "--all" in ln for ln in lines)


def test_help_imports_neither_spark_nor_cloud_sdks() -> None:
    code = (
        "import sys\n"
        "from coordinator.cli import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('MODULES ' + ' '.join(sorted(sys.modules)))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "Usage" in res.stdout
    modules = set(res.stdout.split("MODULES ", 1)[1].split())
    heavy = {"pyspark", "py4j", "boto3", "botocore", "aiobotocore", "pyiceberg", "azure", "google.cloud"}
    assert not {m for m in modules if m in heavy or m.split(".")[0] in heavy}, json.dumps(sorted(modules))
