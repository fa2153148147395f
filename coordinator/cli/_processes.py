"""The commands that run a fleet process: ``worker`` and ``coordinator``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ._common import ConfigOpt, run_or_exit, settings_or_exit


def worker(
    config: ConfigOpt = None,
    worker_id: Annotated[str, typer.Option("--id", help="Worker id (default: host-pid-random).")] = "",
    http_port: Annotated[
        int | None,
        typer.Option(help="Health endpoint port: /livez /readyz /startupz /metrics (0 = off)."),
    ] = None,
) -> None:
    """Run a worker: owned shards -> event intake -> commit / abort / recovery."""
    from shared import configure_logging
    from workers import run_worker

    overrides: dict[str, Any] = {}
    if http_port is not None:
        overrides["worker"] = {"http_port": http_port}
    s = settings_or_exit(config, overrides)
    configure_logging(s.log)
    run_or_exit(run_worker(s, worker_id=worker_id or None))


def coordinator(
    config: ConfigOpt = None,
    http_host: Annotated[str | None, typer.Option(help="Admin API address.")] = None,
    http_port: Annotated[int | None, typer.Option(help="Admin API port (0 = any free port).")] = None,
    coordinator_id: Annotated[str, typer.Option("--id", help="Coordinator id.")] = "",
) -> None:
    """Run a coordinator: leader election, shard assignment, admin API."""
    from coordinator import run_coordinator
    from shared import configure_logging

    overrides: dict[str, Any] = {}
    if http_host is not None:
        overrides.setdefault("coordinator", {})["http_host"] = http_host
    if http_port is not None:
        overrides.setdefault("coordinator", {})["http_port"] = http_port
    s = settings_or_exit(config, overrides)
    configure_logging(s.log)
    run_or_exit(run_coordinator(s, coordinator_id=coordinator_id or None))


def register(app: typer.Typer) -> None:
    """Add this group's commands to ``app``."""
    app.command()(worker)
    app.command()(coordinator)


__all__ = ["coordinator", "register", "worker"]
