"""Fleet processes: workers and coordinators as real OS processes (the demo and the tests).

Each process gets its own process group so its owner can SIGKILL, SIGSTOP,
SIGCONT or SIGTERM it precisely, and its output goes to a log file the owner
prints when something fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shared import Settings


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(settings: Settings, path: Path) -> Path:
    """Write ``settings`` as a TOML file the CLI reads with ``--config``."""
    import msgspec

    from shared._secret import secret_enc_hook

    # The file is the child processes' only source of their credentials: written
    # in full (the folder is private to the run), never printed.
    doc = msgspec.to_builtins(settings, enc_hook=secret_enc_hook)
    lines: list[str] = []

    def section(prefix: str, table: dict[str, Any]) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if scalars:
            lines.append(f"[{prefix}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
        for k, v in table.items():
            if isinstance(v, dict):
                section(f"{prefix}.{k}", v)

    for name, table in doc.items():
        section(name, table)
    # Owner-only from the start: the file holds the credentials.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayRedis:
    """A private ``redis-server`` on a free loopback port, in its own process group (no persistence)."""

    def __init__(self, work: Path) -> None:
        """Start it and wait until it answers PING.

        Raises:
            RuntimeError: redis-server is not installed or did not start within 15 s.
        """
        self.port = free_port()
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not found: run `make bootstrap` or set REDIS_URL")
        argv = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [*argv, "--dir", str(work)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 15
        while not self._pong():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as c:
                c.sendall(b"PING\r\n")
                return c.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def url(self) -> str:
        """The server's redis:// URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL); safe to call twice."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


class FleetProcess:
    """One ``commitfleet worker|coordinator`` process."""

    def __init__(
        self,
        kind: str,
        name: str,
        config: Path,
        log_dir: Path,
        extra: list[str] | None = None,
        *,
        module: str = "coordinator",
    ) -> None:
        """Start ``python -m <module> <kind> --config CONFIG --id NAME [extra]``.

        ``module`` is the CLI's module; a test may name a launcher of its own
        that plants a fault and then runs the same CLI.
        """
        self.kind = kind
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMMITFLEET_") and k != "REDIS_URL"}
        env["PYTHONUNBUFFERED"] = "1"
        argv = [
            sys.executable,
            "-m",
            module,
            kind,
            "--config",
            str(config),
            "--id",
            name,
            *(extra or []),
        ]
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process's group."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait for the exit code."""
        self.signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL (and reap)."""
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        """Kill if still running, close the log."""
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.kill()
        self._log.close()

    def output(self) -> str:
        """Return the process's log so far."""
        return self.log_path.read_text(errors="replace")


@contextmanager
def fleet_processes(log_dir: Path) -> Iterator[list[FleetProcess]]:
    """Collect processes started by the test; kill them all at the end (printing logs on failure)."""
    procs: list[FleetProcess] = []
    try:
        yield procs
    except BaseException:
        for p in procs:
            sys.stderr.write(f"\n===== {p.name} ({p.kind}) log =====\n{p.output()[-6000:]}\n")
        raise
    finally:
        for p in procs:
            p.close()
