"""``commitfleet demo`` as a user runs it: a subprocess, its own throwaway Redis, real Spark.

The demo runs with an environment that has no ``REDIS_URL`` and no
``COMMITFLEET_*`` (so it starts its own redis-server), ``TMPDIR`` inside the
test's folder (its work folder lands there) and a marker variable of its own.
Every process the demo starts inherits that environment (the fleet processes
drop only ``COMMITFLEET_*`` and ``REDIS_URL``), so the marker finds the
demo's coordinator, workers, Spark JVM and Python workers in ``/proc``;
redis-server (which overwrites its environment) is found by its working
folder. The probe runs while the demo runs (proving it sees them) and after
it exited (there must be none left).
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._support.demo_processes import JVM_GRACE, MARKER_VAR, is_fleet_or_redis, kill_all, marked_processes
from tests._support.wait import wait_for_sync

DEMO_DEADLINE = 300.0


def redis_answers(port: int) -> bool:
    """Return True when something on 127.0.0.1:``port`` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as c:
            c.sendall(b"PING\r\n")
            return c.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def run_demo(tmp_path: Path, *args: str) -> tuple[int, str, dict[int, str], dict[int, str]]:
    """Run ``commitfleet demo ARGS`` to its end; return (exit code, output, processes seen, left at exit)."""
    marker = secrets.token_hex(8)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMITFLEET_") and k != "REDIS_URL"}
    env.update({MARKER_VAR: marker, "TMPDIR": str(tmp), "COLUMNS": "200", "PYTHONUNBUFFERED": "1"})
    out_path = tmp_path / "demo.out"
    seen: dict[int, str] = {}
    started = time.monotonic()
    with open(out_path, "wb") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "coordinator", "demo", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    try:
        while True:
            seen |= marked_processes(marker, tmp_path)
            try:
                code = demo.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() - started > DEMO_DEADLINE:
                    pytest.fail(f"the demo did not end within {DEMO_DEADLINE:.0f}s")
        elapsed = time.monotonic() - started
        left_at_exit = marked_processes(marker, tmp_path)
        output = out_path.read_text(errors="replace")
        sys.stderr.write(f"[figure] demo {' '.join(args)} ran {elapsed:.1f}s, exit code {code}\n")
        port = re.search(r"redis redis://127\.0\.0\.1:(\d+)/0", output)
        assert port, "the demo names the Redis it started"
        assert not redis_answers(int(port[1])), "the demo's redis-server still answers"
        # Cleanup: fleet processes and redis-server were stopped before the demo returned...
        assert not {p: c for p, c in left_at_exit.items() if is_fleet_or_redis(c)}
        # ... and nothing else it started outlives it (the JVM exits once its parent has).
        wait_for_sync(
            lambda: not marked_processes(marker, tmp_path),
            timeout=JVM_GRACE,
            interval=0.2,
            what="every process of the demo to exit",
        )
        # Its work folder (config, logs, Spark scratch) is gone too; the store root stays.
        assert [p.name for p in tmp.iterdir() if p.name.startswith("commitfleet-")] == []
        return code, output, seen, left_at_exit
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
        kill_all(marked_processes(marker, tmp_path))


@pytest.mark.skipif(sys.platform != "linux", reason="finds the demo's processes through /proc")
@pytest.mark.timeout(DEMO_DEADLINE + 60)
def test_demo_passes_and_leaves_no_process_behind(tmp_path: Path) -> None:
    root = tmp_path / "store"
    code, output, seen, _left = run_demo(tmp_path, "--root", str(root))
    assert code == 0, output[-6000:]
    assert "demo passed" in output, output[-6000:]
    assert "table demo.orders: 4000 rows, 1 snapshot(s)" in output, output[-6000:]
    assert "delta table clicks: 800 rows in 4 files, 1 version(s) (each row once" in output, output[-6000:]
    # The probe works: it saw the demo's redis-server, coordinator, both workers and the JVM.
    cmds = list(seen.values())
    assert any("redis-server" in c for c in cmds), cmds
    assert any("coordinator coordinator" in c for c in cmds), cmds
    assert sum("coordinator worker" in c for c in cmds) == 2, cmds
    assert any("java" in c and "SparkSubmit" in c for c in cmds), cmds
    assert any((root / "orders" / "_commits").iterdir())
    assert [p.name for p in (root / "clicks" / "_delta_log").iterdir()] == [f"{0:020d}.json"]


@pytest.mark.streaming  # 22 s: make streaming (the batch demo above stays in the default run)
@pytest.mark.skipif(sys.platform != "linux", reason="finds the demo's processes through /proc")
@pytest.mark.timeout(DEMO_DEADLINE + 60)
def test_streaming_demo_survives_a_driver_kill_and_leaves_no_process_behind(tmp_path: Path) -> None:
    root = tmp_path / "store"
    code, output, seen, _left = run_demo(tmp_path, "--streaming", "--root", str(root))
    assert code == 0, output[-6000:]
    assert "demo passed" in output and "killed (SIGKILL) at batch.committed of batch 2" in output, output
    assert "batch 2 of app demo-stream is already committed" in output, output  # the replay was skipped
    assert "table demo.events: 3000 rows, 6 snapshots, stream batches [0, 1, 2, 3, 4, 5]" in output, output
    assert "(each id exactly once)" in output, output
    assert sum("_stream_driver" in c for c in seen.values()) >= 2, list(seen.values())
    assert len(list((root / "events" / "_commits").iterdir())) == 6
