"""The ``commitfleet stream`` commands: show a streaming app's records, and reset them.

A streaming app's record of its last committed micro-batch lives in each
dataset's watermarks document in the store (docs/streaming.md). ``reset`` is
the explicit way out for a query restarted without its checkpoint: it removes
the app's records (and its last run in Redis), and publishes ``stream_reset``
on the admin stream with who did it.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import sys
import time
from typing import Annotated

import typer

from shared import Settings

from ._common import ConfigOpt, err, out, run_or_exit, settings_or_exit

AppArg = Annotated[str, typer.Argument(help="The streaming app id given to commit_batches.")]
DatasetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--dataset", "-d", help="Only this dataset (repeat it); default: every dataset in the store."
    ),
]

stream_app = typer.Typer(
    name="stream",
    help="Streaming apps (commit_batches): show or reset the record of their last committed batch.",
    no_args_is_help=True,
)


def _check(app_id: str) -> None:
    from shared.events import STREAM_APP_PATTERN

    if not re.fullmatch(STREAM_APP_PATTERN, app_id):
        msg = f"commitfleet: bad streaming app_id {app_id!r}: use 1-64 letters, digits, '_', '.' or '-'"
        err.print(msg, markup=False, highlight=False)
        raise typer.Exit(2)


def _operator() -> str:
    try:
        return os.environ.get("COMMITFLEET_OPERATOR") or getpass.getuser()
    except (KeyError, OSError):  # no user name in a bare container
        return "unknown"


async def _show(s: Settings, app_id: str, datasets: list[str] | None) -> list[dict[str, object]]:
    from shared.commit import read_stream_records
    from shared.queue import Keys, connect, read_stream_run
    from shared.storage import open_store

    async with open_store(s.store.url, s.store) as store:
        records = await read_stream_records(store, app_id, datasets)
    r = connect(s.redis, client_name="commitfleet-cli")
    try:
        run = await read_stream_run(r, Keys(s.fleet.name), app_id)
    finally:
        await r.aclose()
    rows: list[dict[str, object]] = [
        {"dataset": d, "batch": rec.batch, "query": rec.query, "job": rec.job, "at": rec.at}
        for d, rec in sorted(records.items())
    ]
    if run is not None:
        rows.append(
            {"run": run.job, "batch": run.batch, "query": run.query, "state": run.state, "at": run.at}
        )
    return rows


@stream_app.command("show")
def show(
    app_id: AppArg,
    dataset: DatasetOpt = None,
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Show the app's last committed batch per dataset (from the store) and its last run (from Redis).

    Exit 1 when the store holds no record of the app.
    """
    _check(app_id)
    s = settings_or_exit(config)
    rows = run_or_exit(_show(s, app_id, dataset))
    for row in rows:
        if as_json:
            sys.stdout.write(json.dumps(row) + "\n")
        elif "dataset" in row:
            sys.stdout.write(
                f"{row['dataset']}\tbatch {row['batch']}\tquery {row['query']}\tjob {row['job']}\n"
            )
        else:
            sys.stdout.write(f"last run\t{row['run']}\tbatch {row['batch']}\t{row['state']}\n")
    if not any("dataset" in row for row in rows):
        err.print(f"commitfleet: the store holds no record of streaming app {app_id!r}", highlight=False)
        raise typer.Exit(1)


async def _reset(s: Settings, app_id: str, datasets: list[str] | None, operator: str) -> dict[str, int]:
    from shared.commit import read_stream_records, reset_stream
    from shared.events import StreamReset
    from shared.queue import AdminPublisher, Keys, connect, delete_stream_run, existing_fleet
    from shared.storage import open_store

    removed: dict[str, int] = {}
    async with open_store(s.store.url, s.store) as store:
        for name in sorted(await read_stream_records(store, app_id, datasets)):
            rec = await reset_stream(store, name, app_id)
            if rec is not None:
                removed[name] = rec.batch
    keys = Keys(s.fleet.name)
    r = connect(s.redis, client_name="commitfleet-cli")
    try:
        s = await existing_fleet(r, s)
        await delete_stream_run(r, keys, app_id)
        if removed:
            admin = AdminPublisher(
                r,
                keys,
                maxlen=s.admin.stream_maxlen,
                durability=s.redis.durable,
            )
            await admin.publish(
                StreamReset(at=time.time(), app_id=app_id, datasets=removed, operator=operator)
            )
    finally:
        await r.aclose()
    return removed


@stream_app.command("reset")
def reset(
    app_id: AppArg,
    dataset: DatasetOpt = None,
    config: ConfigOpt = None,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: forget the app's committed batches.")] = False,
) -> None:
    """Forget the app's record of committed batches, so a query whose batch ids began again may commit.

    Stop the query first. The data already committed stays; the next batch of
    any query under this app id is committed as new. Published on the admin
    stream as ``stream_reset`` with the operator's name (``COMMITFLEET_OPERATOR``
    or the user). Exit 1 when there was nothing to reset, 2 without ``--yes``.
    """
    _check(app_id)
    if not yes:
        err.print(
            f"commitfleet: stream reset forgets which batches of app {app_id!r} are committed: "
            "a replayed batch would then be committed again. Stop the query, then add --yes.",
            highlight=False,
        )
        raise typer.Exit(2)
    s = settings_or_exit(config)
    removed = run_or_exit(_reset(s, app_id, dataset, _operator()))
    if not removed:
        err.print(f"commitfleet: the store holds no record of streaming app {app_id!r}", highlight=False)
        raise typer.Exit(1)
    for name, batch in sorted(removed.items()):
        out.print(f"{name}: forgot batch {batch} of app {app_id}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the ``stream`` command group to ``app``."""
    app.add_typer(stream_app)


__all__ = ["register", "reset", "show", "stream_app"]
