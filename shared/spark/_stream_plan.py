"""What a streaming driver does with one micro-batch, decided from the store's records (pure).

The store's record of each dataset (the last batch of the app it committed,
and the query that did) decides: a dataset at or past the batch is skipped,
the others are committed; a record of another query at or past the batch is a
query restarted without its checkpoint, which is refused. See docs/streaming.md.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .._errors import BadInput
from ..commit import StreamRecord
from ..events import STREAM_APP_PATTERN

_APP_RE = re.compile(STREAM_APP_PATTERN)


class StreamConflict(BadInput):
    """A streaming query's batch ids began again under an app id another query has committed to.

    Raised on the driver (it stops the query): the query was restarted without
    its checkpoint, or another query uses the same app id. ``app_id``,
    ``records`` (dataset -> the other query's record) say which.
    """

    def __init__(self, app_id: str, query: str, batch: int, records: Mapping[str, StreamRecord]) -> None:
        shown = ", ".join(
            f"{d}: batch {r.batch} of query {r.query} (job {r.job})" for d, r in sorted(records.items())
        )
        super().__init__(
            f"streaming app {app_id!r}: query {query} is at batch {batch}, but the store records later "
            f"batches of another query ({shown}). Its batch ids began again (a deleted or new checkpoint?): "
            f"skipping them would lose data. Start the query under a new app_id, or, if the old query's "
            f"records should be forgotten, run `commitfleet stream reset {app_id}` (audited) and restart."
        )
        self.app_id = app_id
        self.query = query
        self.batch = batch
        self.records = dict(records)


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """What to do with one micro-batch: the datasets to commit, and those the store already holds."""

    todo: tuple[str, ...]
    done: dict[str, StreamRecord]

    @property
    def skip(self) -> bool:
        """True when every dataset already holds the batch: nothing is staged or published."""
        return not self.todo


def check_app_id(app_id: str) -> str:
    """Return ``app_id`` when it is a valid streaming app id.

    Raises:
        BadInput: it does not match the contract's pattern (1-64 letters,
            digits, ``_``, ``.``, ``-``; not starting with a symbol).
    """
    if not isinstance(app_id, str) or not _APP_RE.fullmatch(app_id):
        raise BadInput(f"bad streaming app_id {app_id!r}: use 1-64 letters, digits, '_', '.' or '-'")
    return app_id


def plan_batch(
    app_id: str,
    query: str,
    batch: int,
    datasets: Sequence[str],
    records: Mapping[str, StreamRecord],
) -> BatchPlan:
    """Decide one micro-batch from the datasets' records of ``app_id`` (pure).

    Returns:
        A :class:`BatchPlan`: ``todo`` keeps ``datasets``' order.

    Raises:
        StreamConflict: a record of another query is at or past ``batch``.
    """
    conflicts = {d: r for d, r in records.items() if r.query != query and r.batch >= batch}
    if conflicts:
        raise StreamConflict(app_id, query, batch, conflicts)
    done = {d: r for d, r in records.items() if d in datasets and r.batch >= batch}
    return BatchPlan(todo=tuple(d for d in datasets if d not in done), done=done)


def stream_job_prefix(app_id: str, batch: int) -> str:
    """Return the start of every job id of ``batch``'s runs: ``<app_id>-b<batch>-``."""
    return f"{app_id}-b{batch}-"


_RUN_SUFFIX = re.compile(r"[0-9a-f]{8}")


def dead_runs(
    staged_keys: Iterable[str], app_id: str, batch: int, current: str | None = None
) -> dict[str, list[str]]:
    """Return the runs of ``batch`` that left staged files, job -> datasets, from a staging listing (pure).

    ``staged_keys`` are keys under ``_staging/<app_id>-b<batch>-``; a key of
    another app whose id merely starts the same way (``<app_id>-b<batch>-x...``)
    is not a run of this batch and is left out, as is ``current``.
    """
    prefix = stream_job_prefix(app_id, batch)
    runs: dict[str, set[str]] = {}
    for key in staged_keys:
        parts = key.split("/", 3)
        if len(parts) < 4:
            continue
        job, dataset = parts[1], parts[2]
        if job == current or not job.startswith(prefix) or not _RUN_SUFFIX.fullmatch(job[len(prefix) :]):
            continue
        runs.setdefault(job, set()).add(dataset)
    return {job: sorted(names) for job, names in sorted(runs.items())}


def stream_job_id(app_id: str, batch: int) -> str:
    """Return a fresh job id for one run of ``batch``: ``<app_id>-b<batch>-<8 hex>``."""
    return f"{stream_job_prefix(app_id, batch)}{secrets.token_hex(4)}"


__all__ = [
    "BatchPlan",
    "StreamConflict",
    "check_app_id",
    "dead_runs",
    "plan_batch",
    "stream_job_id",
    "stream_job_prefix",
]
