"""``commitfleet demo`` and ``bench`` stopped by SIGTERM or Ctrl-C leave no process behind.

The command runs as a user runs it (a subprocess, its own throwaway
redis-server); once its redis-server and fleet processes are up (found in
``/proc`` as in test_demo), the test sends one signal to the command's pid
only (what ``kill PID``, ``docker stop`` or systemd does; a terminal's Ctrl-C
reaches the command's group, which the fleet processes are not in). The
command must exit with 128 + the signal's number, having stopped its
redis-server and fleet processes itself, and everything else it started (the
Spark JVM) must follow within seconds.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._support.demo_processes import JVM_GRACE, MARKER_VAR, is_fleet_or_redis, kill_all, marked_processes
from tests._support.wait import wait_for_sync

UP_DEADLINE = 120.0

DEMO = ["demo"]
BENCH = ["bench", "commit", "--modes", "fleet", "--datasets", "2000", "--files", "4", "--size", "1024"]


def _fleet_up(cmds: list[str]) -> bool:
    return (
        any("redis-server" in c for c in cmds)
        and any("coordinator coordinator" in c for c in cmds)
        and sum("coordinator worker" in c for c in cmds) == 2
    )


def _spark_up(cmds: list[str]) -> bool:
    return _fleet_up(cmds) and any("java" in c and "SparkSubmit" in c for c in cmds)


def _run_and_signal(tmp_path: Path, args: list[str], sig: signal.Signals, *, spark: bool = False) -> None:
    marker = secrets.token_hex(8)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMITFLEET_") and k != "REDIS_URL"}
    env.update({MARKER_VAR: marker, "TMPDIR": str(tmp), "COLUMNS": "200", "PYTHONUNBUFFERED": "1"})
    out_path = tmp_path / "cli.out"
    up = _spark_up if spark else _fleet_up
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "coordinator", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + UP_DEADLINE
        while not up(list(marked_processes(marker, tmp_path).values())):
            assert proc.poll() is None, out_path.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, f"not up within {UP_DEADLINE:.0f}s: {seen}"
            time.sleep(0.1)
        seen = marked_processes(marker, tmp_path)
        t0 = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=90)
        stopped_in = time.monotonic() - t0
        left_at_exit = marked_processes(marker, tmp_path)
        output = out_path.read_text(errors="replace")
        sys.stderr.write(f"[figure] {args[0]} stopped by {sig.name} in {stopped_in:.1f}s, exit {code}\n")

        assert code == 128 + sig, output[-4000:]
        assert f"stopped by {sig.name}" in output, output[-4000:]
        # The redis-server and fleet processes it started were stopped before it exited...
        assert not {p: c for p, c in left_at_exit.items() if is_fleet_or_redis(c)}, left_at_exit
        assert not {p for p in seen if p in left_at_exit and is_fleet_or_redis(seen[p])}
        # ... and nothing else it started outlives it.
        wait_for_sync(
            lambda: not marked_processes(marker, tmp_path),
            timeout=JVM_GRACE,
            interval=0.2,
            what="every process of the command to exit",
        )
        # Its work folder (config with the credentials, logs) is gone too.
        assert [p.name for p in tmp.iterdir() if p.name.startswith("commitfleet-")] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        kill_all(marked_processes(marker, tmp_path))


pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="finds the command's processes through /proc"),
    pytest.mark.timeout(UP_DEADLINE + 180),
]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_demo_stopped_by_a_signal_stops_everything_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    _run_and_signal(tmp_path, DEMO, sig)


@pytest.mark.spark
def test_demo_stopped_during_its_spark_job_stops_the_jvm_too(tmp_path: Path) -> None:
    _run_and_signal(tmp_path, DEMO, signal.SIGTERM, spark=True)


def test_bench_stopped_by_sigterm_stops_its_fleet_and_redis(tmp_path: Path) -> None:
    _run_and_signal(tmp_path, BENCH, signal.SIGTERM)
