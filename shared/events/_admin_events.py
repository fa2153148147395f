"""Admin events: what the fleet tells operators on the capped admin stream.

Frozen msgspec Structs, tagged by ``type``, versioned by ``v`` (currently 1).
Every event has ``at`` (seconds since the epoch) and ``worker`` (the id of the
process that emits it: a worker, or the coordinator for assignments); events
about a commit also carry ``dataset`` and ``job``.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from ._queue_events import SCHEMA_VERSION, Version

ADMIN_SCHEMA_VERSION: Final = SCHEMA_VERSION

Seconds = Annotated[float, msgspec.Meta(ge=0)]
Count = Annotated[int, msgspec.Meta(ge=0)]


class _AdminEvent(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, tag_field="type"):
    v: Version = ADMIN_SCHEMA_VERSION
    at: float
    worker: str = ""


class _DatasetEvent(_AdminEvent, frozen=True, kw_only=True):
    dataset: str
    job: str = ""


class WorkerJoined(_AdminEvent, frozen=True, kw_only=True, tag="worker_joined"):
    """A worker registered with the fleet."""

    host: str = ""
    pid: int = 0


class WorkerLeft(_AdminEvent, frozen=True, kw_only=True, tag="worker_left"):
    """A worker left: ``reason`` is e.g. ``shutdown`` or ``lease_expired``."""

    reason: str = ""


class ShardsAssigned(_AdminEvent, frozen=True, kw_only=True, tag="shards_assigned"):
    """The coordinator published an assignment: owner id -> its shards, and how many shards moved."""

    epoch: Count
    assignment: dict[str, list[int]]
    moved: Count = 0


class CommitStarted(_DatasetEvent, frozen=True, kw_only=True, tag="commit_started"):
    """A worker wrote a commit sequence to the WAL and starts executing it."""

    files: Count = 0
    bytes: Count = 0
    epoch: Count = 0


class Committed(_DatasetEvent, frozen=True, kw_only=True, tag="committed"):
    """A dataset's commit of a job is complete (manifest written, WAL removed).

    ``phases`` gives the seconds each phase of the sequence took (``publish``, ``apply``
    (watermarks and custom steps), ``manifest``, ``cleanup``): the step latencies.
    """

    files: Count
    bytes: Count
    duration_s: Seconds
    epoch: Count = 0
    phases: dict[str, Seconds] = {}


class Aborted(_DatasetEvent, frozen=True, kw_only=True, tag="aborted"):
    """A job's staged output for the dataset was cleaned up instead of committed."""

    reason: str
    files_deleted: Count = 0


class Quarantined(_DatasetEvent, frozen=True, kw_only=True, tag="quarantined"):
    """A commit sequence kept failing; the dataset waits for an operator (retry or skip)."""

    reason: str
    attempts: Count = 0


class LockTakenOver(_DatasetEvent, frozen=True, kw_only=True, tag="lock_taken_over"):
    """A worker took over an expired lock of another holder."""

    previous_owner: str
    epoch: Count


class RecoveryDone(_DatasetEvent, frozen=True, kw_only=True, tag="recovery_done"):
    """An unfinished commit sequence was finished by recovery."""

    steps_redone: Count
    duration_s: Seconds


class MessageRejected(_AdminEvent, frozen=True, kw_only=True, tag="message_rejected"):
    """A queue message went to the dead-letter stream; ``reason`` is a reject reason code."""

    shard: Count
    reason: str
    detail: str = ""
    stream_id: str = ""
    dataset: str = ""
    job: str = ""


class JobTimedOut(_AdminEvent, frozen=True, kw_only=True, tag="job_timed_out"):
    """The fleet aborted a job for time: its driver was silent for ``timeout_s`` (no liveness
    key seen), or the job ran longer than the fleet's ``max_job_duration`` (then ``timeout_s``
    is that limit).

    One event per job and shard, by design: the owner of each shard of the job
    decides from that shard's own liveness key, so a job on three shards that
    times out gives three events (count distinct ``job`` values to count
    jobs). ``shard`` is the shard whose owner decided, ``datasets`` the job's
    datasets on that shard that were aborted; each of them also gets its
    ``aborted`` event.

    ``shard`` was added to v1 without a version bump (as ``Committed.phases``
    was): events written before it have none (null), and a reader older than
    it skips the event (unknown field).
    """

    job: str
    datasets: list[str] = []
    timeout_s: Seconds = 0.0
    shard: Count | None = None


class OperatorAction(_DatasetEvent, frozen=True, kw_only=True, tag="operator_action"):
    """An operator asked to ``retry`` or ``skip`` a quarantined dataset, and what came of it.

    ``outcome`` is ``done`` (the action ran; a retry that failed again is also
    reported by a ``quarantined`` event just before), or ``refused`` when the
    action cannot apply (no such sequence, not quarantined, a skip that would
    move watermarks back); ``detail`` says why.
    """

    action: Literal["retry", "skip"]
    operator: str = ""
    outcome: Literal["done", "refused"] = "done"
    detail: str = ""


class StreamReset(_AdminEvent, frozen=True, kw_only=True, tag="stream_reset"):
    """An operator ran ``commitfleet stream reset``: a streaming app's records of its last
    committed micro-batch were removed from ``datasets`` (dataset -> the batch recorded), so a
    query whose batch ids began again may commit under the same ``app_id``."""

    app_id: str
    datasets: dict[str, int]
    operator: str = ""


class ShardSetAside(_AdminEvent, frozen=True, kw_only=True, tag="shard_set_aside"):
    """A shard's state in Redis cannot be read (a record that does not decode, or of an
    unknown version): its owner stopped the shard instead of crashing, and waits for an
    operator to fix or delete the record (``key``, hash ``field``; see docs/queue.md)."""

    shard: Count
    key: str
    field: str
    reason: str


AdminEvent = (
    WorkerJoined
    | WorkerLeft
    | ShardsAssigned
    | CommitStarted
    | Committed
    | Aborted
    | Quarantined
    | LockTakenOver
    | RecoveryDone
    | MessageRejected
    | JobTimedOut
    | OperatorAction
    | StreamReset
    | ShardSetAside
)
"""Every admin event, as a tagged union (decode target)."""

ADMIN_EVENT_TYPES: Final[dict[str, type[AdminEvent]]] = {
    str(cls.__struct_config__.tag): cls
    for cls in (
        WorkerJoined,
        WorkerLeft,
        ShardsAssigned,
        CommitStarted,
        Committed,
        Aborted,
        Quarantined,
        LockTakenOver,
        RecoveryDone,
        MessageRejected,
        JobTimedOut,
        OperatorAction,
        StreamReset,
        ShardSetAside,
    )
}
"""Wire ``type`` tag -> admin event class."""
