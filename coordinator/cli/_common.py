"""What every command of the CLI shares: its consoles, the ``--config`` option, loading the settings
and running a command's coroutine with the CLI's exit codes."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from shared import ConfigError, Settings, TransientError, load_settings

T = TypeVar("T")

out = Console()
# soft_wrap: without a terminal Rich would break an error line at 80 columns,
# and a bad setting must stay one line.
err = Console(stderr=True, soft_wrap=True)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")]


def settings_or_exit(config: Path | None, overrides: dict[str, Any] | None = None) -> Settings:
    """Return the command's settings.

    Raises:
        typer.Exit: 2 on a bad setting (one line on stderr).
    """
    try:
        return load_settings(config, overrides=overrides)
    except ConfigError as exc:
        err.print(f"commitfleet: config error: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None


def run_or_exit(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; a ConfigError, an unreachable service or a crash ends the command with one line.

    Returns:
        What ``coro`` returned.

    Raises:
        typer.Exit: 70 the process crashed, 2 a ConfigError, 3 a TransientError.
    """
    from shared.fleet import EXIT_CRASHED, ProcessCrashed

    try:
        return asyncio.run(coro)
    except ProcessCrashed as exc:
        err.print(f"commitfleet: {exc} (the traceback is in the log above)", markup=False, highlight=False)
        raise typer.Exit(EXIT_CRASHED) from None
    except ConfigError as exc:
        err.print(f"commitfleet: config error: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    except TransientError as exc:
        err.print(f"commitfleet: service unavailable: {exc}", markup=False, highlight=False)
        raise typer.Exit(3) from None


__all__ = ["ConfigOpt", "err", "out", "run_or_exit", "settings_or_exit"]
