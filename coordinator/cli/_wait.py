"""``commitfleet wait JOB DATASET...``: a job's outcome for producers that are not the Python driver.

Exit codes: 0 every dataset committed; 1 some dataset aborted (failed,
cancelled, timed out, skipped), quarantined or blocked; 2 bad usage or
configuration (no such fleet, bad names); 3 Redis unreachable; 4 the job
ended on some dataset's shard but no result is kept for it (forgotten:
``queue.results_max`` per shard, or older than a day; or a name that was not a
dataset of the job) and none failed: its outcome is unknown here, its manifest
says (row status ``unknown``); 124 no outcome for some dataset within
``--timeout`` (the job may still commit).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from shared import BadInput, ConfigError, Settings, TransientError
from shared.events import check_dataset_segment, check_job
from shared.queue import JobOutcome, Keys, connect, read_fleet_meta, read_outcome

EXIT_COMMITTED = 0
EXIT_NOT_COMMITTED = 1
EXIT_FORGOTTEN = 4
EXIT_TIMEOUT = 124

POLL_MIN_S = 0.05
POLL_MAX_S = 0.5


def check_names(job: str, datasets: Sequence[str]) -> None:
    """Raise ConfigError (exit 2) for a job id or dataset name the contract refuses, or no dataset."""
    try:
        check_job(job)
        if not datasets:
            raise BadInput("name at least one dataset of the job")
        for d in datasets:
            check_dataset_segment(d)
    except BadInput as exc:
        raise ConfigError(str(exc)) from None


async def wait_outcome(
    settings: Settings, job: str, datasets: Sequence[str], limit_s: float
) -> tuple[JobOutcome, bool]:
    """Poll the job's result records until every dataset has one or ``limit_s`` seconds pass.

    Returns:
        The last outcome read, and whether it is complete (False: timed out).

    Raises:
        ConfigError: bad names, or the fleet does not exist in Redis.
        TransientError: Redis stayed unreachable until the deadline.

    Cancellation: nothing to clean up (reads only).
    """
    check_names(job, datasets)
    client = connect(settings.redis, client_name="commitfleet-wait")
    try:
        meta = await read_fleet_meta(client, settings.fleet.name)
        if meta is None:
            raise ConfigError(f"fleet {settings.fleet.name!r} does not exist in Redis")
        keys = Keys(settings.fleet.name)
        start = time.monotonic()
        delay = POLL_MIN_S
        last: JobOutcome | None = None
        while True:
            try:
                last = await read_outcome(client, keys, meta.shards, job, datasets)
            except TransientError:
                if time.monotonic() - start >= limit_s:
                    raise
            if last is not None and last.done:
                return last, True
            waited = time.monotonic() - start
            if waited >= limit_s:
                assert last is not None  # a failed last read re-raised above
                return last, False
            await asyncio.sleep(min(delay, limit_s - waited))
            delay = min(delay * 1.5, POLL_MAX_S)
    finally:
        await client.aclose()


def exit_code(outcome: JobOutcome, complete: bool) -> int:
    """Return the command's exit code for ``outcome`` (pure; see the module doc)."""
    if outcome.failed:
        return EXIT_NOT_COMMITTED
    if not complete:
        return EXIT_TIMEOUT
    if outcome.forgotten:
        return EXIT_FORGOTTEN
    return EXIT_COMMITTED


def outcome_rows(outcome: JobOutcome) -> list[dict[str, object]]:
    """Return one row per dataset (answered or not) for printing."""
    rows: list[dict[str, object]] = []
    for name, r in sorted(outcome.results.items()):
        rows.append(
            {
                "dataset": name,
                "status": r.status,
                "reason": r.reason,
                "files": r.files,
                "bytes": r.bytes,
                "manifest": r.manifest,
            }
        )
    for name in outcome.missing:
        rows.append(
            {"dataset": name, "status": "pending", "reason": "", "files": 0, "bytes": 0, "manifest": ""}
        )
    for name in outcome.forgotten:
        why = (
            "the job has ended on its shard and no result is kept: forgotten (queue.results_max, a day)"
            " or not a dataset of the job; its manifest says whether it committed"
        )
        rows.append(
            {"dataset": name, "status": "unknown", "reason": why, "files": 0, "bytes": 0, "manifest": ""}
        )
    return rows


__all__ = [
    "EXIT_COMMITTED",
    "EXIT_FORGOTTEN",
    "EXIT_NOT_COMMITTED",
    "EXIT_TIMEOUT",
    "exit_code",
    "outcome_rows",
    "wait_outcome",
]
