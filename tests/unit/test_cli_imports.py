"""`commitfleet status` (and --help, retry, skip, wait) import only what they use.

The status command must answer in about the time Python, Typer and redis-py take to
start (issue 9: under 1 s at 100,000 datasets); what it spent its time on was imports:
the coordinator's HTTP server (aiohttp, prometheus_client), the commit core, the
storage adapters. Each check runs in a fresh interpreter and reads ``sys.modules``;
the wall time itself is measured by ``python -m tests.bench.status_latency``, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis

from shared.queue import ensure_fleet_sync

ROOT = Path(__file__).resolve().parents[2]
# Third-party packages none of these commands needs.
HEAVY = {
    "aiohttp",
    "prometheus_client",
    "pyiceberg",
    "pyarrow",
    "pyspark",
    "py4j",
    "aiobotocore",
    "botocore",
    "boto3",
    "gcloud",
    "google",
    "azure",
    "playwright",
    "hypothesis",
}
# Our own modules that pull in the above, or the commit core and the storage adapters.
OURS = {
    "coordinator._coordinator",
    "coordinator.admin._http",
    "coordinator.admin._metrics",
    "shared.commit",
    "shared.storage",
    "shared.locks",
    "workers._worker",
}


def _loaded(code: str, *args: str) -> tuple[set[str], str]:
    """Run ``code`` in a fresh interpreter (which prints ``MODULES`` and sys.modules at exit);
    return the heavy modules it loaded and what it printed."""
    prologue = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: print('MODULES ' + json.dumps(sorted(sys.modules)), flush=True))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", prologue + code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
    )
    out = res.stdout
    assert "MODULES " in out, (res.returncode, out, res.stderr)
    modules = set(json.loads(out.rsplit("MODULES ", 1)[1]))
    heavy = {m for m in modules if m.split(".")[0] in HEAVY or m in OURS or m.rpartition(".")[0] in OURS}
    return heavy, out.rsplit("MODULES ", 1)[0]


def _cli(*argv: str) -> tuple[set[str], str]:
    code = "sys.argv = ['commitfleet', *sys.argv[1:]]\nfrom coordinator.cli import main\nmain()\n"
    return _loaded(code, *argv)


def test_help_and_operator_commands_load_no_sdk_server_or_commit_core() -> None:
    # One interpreter for all of them (what one loads stays loaded for the next: a stricter check).
    code = (
        "from coordinator.cli import app\n"
        "for argv in (['--help'], *([cmd, '--help'] for cmd in ('status', 'retry', 'skip', 'wait'))):\n"
        "    print('ARGV', argv, flush=True)\n"
        "    try:\n"
        "        app(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        # The modules the operator commands run in (imported when the command runs).
        "import coordinator.admin._status, coordinator.cli._status_text\n"
        "import coordinator.cli._ops_run, coordinator.cli._wait\n"
    )
    heavy, out = _loaded(code)
    assert out.count("Usage") == 5, out
    assert heavy == set(), sorted(heavy)


def test_status_command_against_a_fleet_loads_only_what_reading_redis_needs(
    redis_url: str, fleet_name: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        ensure_fleet_sync(client, fleet_name, 4)
    finally:
        client.close()
    config = tmp_path / "fleet.toml"
    config.write_text(f'[fleet]\nname = "{fleet_name}"\n\n[redis]\nurl = "{redis_url}"\n')
    heavy, out = _cli("status", "--config", str(config))
    assert f"fleet {fleet_name}  shards 4" in out, out
    assert heavy == set(), sorted(heavy)
    heavy, out = _cli("status", "--json", "--config", str(config))
    assert json.loads(out)["shards"] == 4
    assert heavy == set(), sorted(heavy)
