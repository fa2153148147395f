"""Fleet processes: workers and coordinators as real OS processes (the demo and the tests).

Each process gets its own process group so its owner can SIGKILL, SIGSTOP,
SIGCONT or SIGTERM it precisely, and its output goes to a log file the owner
prints when something fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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

    doc = msgspec.to_builtins(settings)
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
    path.write_text("\n".join(lines) + "\n")
    return path


class FleetProcess:
    """One ``commitfleet worker|coordinator`` process."""

    def __init__(
        self, kind: str, name: str, config: Path, log_dir: Path, extra: list[str] | None = None
    ) -> None:
        self.kind = kind
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMMITFLEET_") and k != "REDIS_URL"}
        env["PYTHONUNBUFFERED"] = "1"
        argv = [
            sys.executable,
            "-m",
            "coordinator",
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
