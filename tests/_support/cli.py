"""Running the ``commitfleet`` CLI as a user does: a subprocess, with an environment of the test's."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLI_TIMEOUT = 60.0


@dataclass(frozen=True)
class CliResult:
    """What one CLI run printed and how it exited."""

    rc: int
    out: str
    err: str

    def json_lines(self) -> list[dict[str, Any]]:
        """Return stdout parsed as one JSON object per non-empty line."""
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]


def cli_env(**extra: str) -> dict[str, str]:
    """Return this process's environment without fleet settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMMITFLEET_") and k != "REDIS_URL"}
    # A wide virtual terminal, so Rich wraps neither table cells nor long messages
    # (see tests/fleet/test_cli.py's test_error_line_is_not_wrapped_without_a_terminal for the narrow
    # default).
    env["COLUMNS"] = "1000"
    env.update(extra)
    return env


def cli_argv(*args: str | Path) -> list[str]:
    """Return the command line of ``commitfleet ARGS`` run by this Python (``python -m coordinator``)."""
    return [sys.executable, "-m", "coordinator", *map(str, args)]


async def cli(
    *args: str | Path, env: dict[str, str] | None = None, timeout: float = CLI_TIMEOUT
) -> CliResult:
    """Run ``commitfleet ARGS`` to its end; fail the test if it outlives ``timeout``."""
    proc = await asyncio.create_subprocess_exec(
        *cli_argv(*args),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env or cli_env(),
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise AssertionError(f"commitfleet {' '.join(map(str, args))} ran longer than {timeout}s") from None
    assert proc.returncode is not None
    return CliResult(proc.returncode, out.decode(), err.decode())
