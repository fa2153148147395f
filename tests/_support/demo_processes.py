"""Finding the processes a ``commitfleet demo`` started, through ``/proc``, and ending them.

The demo runs with a marker variable of the test's in its environment, which
every process it starts inherits (see tests/e2e/test_demo.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

MARKER_VAR = "CF_E2E_DEMO_MARKER"  # not COMMITFLEET_*: the fleet processes must inherit it
# After the demo exits its fleet processes and redis-server must already be gone (it
# waits for them); the Spark JVM notices its parent's exit on its own, within seconds.
JVM_GRACE = 20.0


def marked_processes(marker: str, path: Path) -> dict[int, str]:
    """Return pid -> command line of every live process of the demo.

    A process is the demo's when its environment carries ``marker``, its
    command line names ``path``, or its working folder is inside ``path``
    (redis-server overwrites its environment and command line with its
    process title, but runs in the ``--dir`` it was given: the demo's work
    folder). Zombies are not counted (they no longer run), nor processes we
    may not read.
    """
    needle = f"{MARKER_VAR}={marker}".encode()
    named = str(path)
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            env = (entry / "environ").read_bytes()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            cwd = os.readlink(entry / "cwd")
        except OSError:  # exited meanwhile, or another user's
            continue
        if stat.rpartition(")")[2].split()[0] == "Z":
            continue
        if needle in env.split(b"\0") or named in cmd or cwd.startswith(named):
            found[int(entry.name)] = cmd
    return found


def kill_all(procs: dict[int, str]) -> None:
    """SIGKILL the given processes (all descendants of the demo this test started), by pid."""
    for pid in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def is_fleet_or_redis(cmdline: str) -> bool:
    """Return True when ``cmdline`` is a redis-server's or a fleet process's (``python -m coordinator``)."""
    return "redis-server" in cmdline or "-m coordinator" in cmdline
