"""The async bodies of the CLI's operator commands (events, retry/skip, audit; status is
``coordinator.cli._status_run``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio
from rich.console import Console

from coordinator.admin import event_matches
from shared import (
    BadInput,
    ConfigError,
    NotFound,
    OutcomeUnknown,
    Settings,
    TransientError,
    cancel_until_done,
    run_shielded,
)
from shared.events import AdminEvent, OperatorAction, Quarantined, encode_admin
from shared.queue import (
    Keys,
    check_request_names,
    connect,
    existing_fleet,
    follow_admin,
    queue_operator_request,
    read_admin_recent,
    redis_errors,
)

if TYPE_CHECKING:
    from shared.commit import AuditReport

# The commit core, the lock service and the storage adapters are imported by the commands that use
# them: events, retry and skip must not pay for them (tests/unit/test_cli_imports.py).

console = Console()
T = TypeVar("T")


@asynccontextmanager
async def _redis(s: Settings) -> AsyncIterator[redis.asyncio.Redis]:
    r = connect(s.redis, client_name="commitfleet-cli")
    try:
        yield r
    finally:
        await r.aclose()


async def _stoppable(coro: Coroutine[Any, Any, T], *, limit_s: float | None = None) -> T:
    """Run ``coro`` in a child task that surely ends when we are cancelled (Ctrl-C) or time out.

    Returns:
        What ``coro`` returned.

    Raises:
        TimeoutError: ``limit_s`` seconds passed first (the child has ended).
        Whatever ``coro`` raised.

    Cancelled: the child is cancelled (again, until it has ended), then the
    cancellation propagates.
    """
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait([task], timeout=limit_s)
    finally:
        if not task.done():
            await run_shielded(cancel_until_done(task))
    if not done:
        raise TimeoutError
    return task.result()


def _line(entry_id: bytes, ev: AdminEvent, as_json: bool) -> str:
    if as_json:
        return json.dumps({"id": entry_id.decode(), **json.loads(encode_admin(ev))})
    tag = str(type(ev).__struct_config__.tag)
    skip = {"v", "at", "type"}
    fields = " ".join(
        f"{k}={getattr(ev, k)}"
        for k in ev.__struct_fields__
        if k not in skip and getattr(ev, k) not in ("", None)
    )
    stamp = time.strftime("%H:%M:%S", time.localtime(ev.at))
    return f"{stamp} {tag:<16} {fields}"


async def print_events(
    s: Settings,
    *,
    follow: bool,
    types: set[str],
    dataset: str | None,
    job: str | None,
    as_json: bool,
    last: int,
) -> None:
    """Print the last ``last`` matching admin events, then follow when asked (until Ctrl-C).

    The history is read as ``GET /events/recent`` reads it (newest first, then
    printed oldest first), looking at most ``max(20 * last, 10,000)`` entries
    back; following starts after the newest entry at that moment.
    """
    keys = Keys(s.fleet.name)
    async with _redis(s) as r:
        start: bytes | str = "$"
        if last > 0:

            def match(ev: AdminEvent) -> bool:
                return event_matches(ev, types=types, dataset=dataset, job=job)

            page = await read_admin_recent(r, keys, limit=last, scan=max(last * 20, 10_000), match=match)
            for entry_id, ev in reversed(page.events):
                print(_line(entry_id, ev, as_json), flush=True)
            start = page.head or "$"
        if not follow:
            return

        async def follow_new() -> None:
            async for entry_id, ev in follow_admin(r, keys, from_id=start, block_ms=1000):
                if event_matches(ev, types=types, dataset=dataset, job=job):
                    print(_line(entry_id, ev, as_json), flush=True)

        await _stoppable(follow_new())


async def operator_request(s: Settings, dataset: str, job: str, op: str, *, wait_s: float) -> str:
    """Ask the dataset's owner to ``retry`` or ``skip`` a quarantined sequence; wait for it.

    The request is a field in the owning shard's ``operator`` hash, written by
    :func:`shared.queue.queue_operator_request` (its value signed when the fleet
    has a secret) once the fleet's Redis state reports the sequence
    quarantined; the shard's runner verifies it, acts on it under the
    dataset's lock and publishes ``operator_action``.

    Returns:
        A one-line description of the outcome.

    Raises:
        ConfigError: bad dataset or job name, or no such quarantined sequence.
        CommitStepFailed: the owner retried and the sequence was quarantined again.
        OutcomeUnknown: no owner acted within ``wait_s`` (is a worker running?); the
            request stays queued for the owner.
    """
    try:
        check_request_names(dataset, job)
    except BadInput as exc:
        raise ConfigError(str(exc)) from None
    keys = Keys(s.fleet.name)
    async with _redis(s) as r:
        s = await existing_fleet(r, s)
        with redis_errors("XREVRANGE admin"):
            newest: Any = await r.xrevrange(keys.admin, count=1)
        start: bytes = newest[0][0] if newest else b"0-0"
        try:
            await queue_operator_request(r, keys, s, dataset, job, op)
        except NotFound:
            raise ConfigError(
                f"no unfinished commit sequence for dataset {dataset!r}, job {job!r} is quarantined"
            ) from None

        async def acted() -> str:
            again: str | None = None
            async for _id, ev in follow_admin(r, keys, from_id=start, block_ms=500):
                if not (
                    isinstance(ev, OperatorAction | Quarantined) and ev.dataset == dataset and ev.job == job
                ):
                    continue
                if isinstance(ev, Quarantined):
                    # The owner reports a failed retry before its operator_action.
                    again = ev.reason
                    continue
                if ev.outcome == "refused":
                    raise ConfigError(f"{op} of {dataset} / {job} refused by {ev.worker}: {ev.detail}")
                if again is not None:
                    from shared.commit import CommitStepFailed

                    raise CommitStepFailed(
                        f"{op} of {dataset} / {job} by {ev.worker}: quarantined again: {again}"
                    )
                return f"{op} of {dataset} / {job} done by {ev.worker}"
            raise TransientError("the admin stream ended")  # follow_admin never ends

        try:
            return await _stoppable(acted(), limit_s=wait_s)
        except TimeoutError:
            raise OutcomeUnknown(
                f"no worker acted on the {op} request within {wait_s}s (is a worker running?); "
                "the request stays queued for the dataset's owner"
            ) from None


async def run_audit(s: Settings, url: str) -> AuditReport:
    """Return the audit report of the store at ``url``."""
    from shared.commit import audit
    from shared.storage import open_store

    async with open_store(url, s.store) as store:
        return await audit(store)
