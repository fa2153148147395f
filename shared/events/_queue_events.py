"""Queue events: the versioned messages Spark drivers and executors publish.

Every event is a frozen msgspec Struct, tagged on the wire by ``type`` and
versioned by ``v`` (currently 1). Unknown fields are refused. Constraints
that are pure shape (non-negative sizes, lowercase hex MD5) live in the types
and so also in the JSON Schema; rules that need context (the fleet's dataset
pattern, safe paths, cross-field consistency) live in :mod:`._validation`.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Annotated, Final, Literal

import msgspec

from .._errors import BadInput
from ._file_stats import FileStats

SCHEMA_VERSION: Final = 1
"""The only queue-event version this code reads and writes."""

JOB_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
"""Job ids: one path segment, never starting with '.', '_' or '-'."""

DEFAULT_DATASET_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}$"
"""The default of ``security.dataset_pattern``; a fleet may configure a stricter one."""

_SEGMENT = r"(?!\.\.?(?:/|$))[^/\\\x00-\x1f\x7f-\x9f]+"
REL_PATH_PATTERN: Final = rf"^(?!_[^/]*/){_SEGMENT}(?:/{_SEGMENT})*(?![\s\S])"
r"""The shape of a staged file's relative path, the same in ECMA-262 and Python ``re``
(``(?![\s\S])`` is end-of-input in both, unlike ``$``); byte limits are checked on top."""

Version = Annotated[
    int,
    msgspec.Meta(
        description="Schema version of this event; this contract is v1.",
        extra_json_schema={"const": SCHEMA_VERSION},
    ),
]
JobId = Annotated[
    str,
    msgspec.Meta(
        description="Job id, unique per job run.",
        extra_json_schema={"pattern": JOB_PATTERN},
    ),
]
DatasetName = Annotated[
    str,
    msgspec.Meta(
        description="Dataset name: one path segment matching the fleet's dataset pattern "
        "(this default shown).",
        extra_json_schema={"pattern": DEFAULT_DATASET_PATTERN},
    ),
]
Timestamp = Annotated[float, msgspec.Meta(ge=0, description="Seconds since the Unix epoch (UTC).")]
# Bounds are the JVM's (Spark task indexes and attempts are Java ints, sizes and
# watermarks longs), so every valid message is also valid for a JVM producer.
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
Index = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Size = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX, description="Size in bytes.")]
WatermarkValue = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
Md5 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$", description="Lowercase hex MD5 of the content.")]
RelPath = Annotated[
    str,
    msgspec.Meta(
        description="Path relative to the task attempt's staging folder, '/'-separated, no empty, "
        "'.' or '..' segments, no backslash or control characters; the first segment is not a "
        "folder starting with '_'.",
        extra_json_schema={"minLength": 1, "pattern": REL_PATH_PATTERN},
    ),
]
WatermarkName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
# Non-empty and duplicate-free, enforced by the validator (reason "inconsistent").
DatasetList = Annotated[
    list[DatasetName], msgspec.Meta(extra_json_schema={"minItems": 1, "uniqueItems": True})
]


# gc=False here and on the events: a decoded event refers only to strings,
# numbers and containers built for it, never back to itself, so it can be in no
# cycle; intake decodes several such objects per event, and tracking each one
# made the collector run (and scan them) again and again.
class StagedFile(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, omit_defaults=True, gc=False
):
    """One file a task attempt staged.

    ``path`` is relative to its attempt's staging folder
    ``_staging/<job>/<dataset>/<task>-<attempt>/``. ``stats``, for a Parquet
    file, are its row count and column statistics as its writer saw them
    (:mod:`._file_stats`): a bound dataset's table step then needs no read
    of the file's footer.
    """

    path: RelPath
    size: Size
    md5: Md5 | None = None
    stats: Annotated[
        FileStats | None,
        msgspec.Meta(
            description="A Parquet file's row count and column statistics (optional; without them the "
            "fleet reads the file's footer when a table needs them)."
        ),
    ] = None


class DatasetExpectation(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, omit_defaults=True
):
    """What a finished job promises for one dataset.

    ``tasks`` is how many task indexes (0..tasks-1) must each have a finished
    attempt. ``winners[i]``, when the producer knows it, is the attempt number
    Spark accepted for task ``i`` (``len(winners) == tasks``); without it the
    first reported attempt of each task wins.
    """

    tasks: Index
    winners: list[Index] | None = None


TableName = Annotated[
    str,
    msgspec.Meta(
        description="Iceberg table identifier: namespace(s) and name, dot-separated.",
        extra_json_schema={"pattern": r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)+$"},
    ),
]
TableMode = Literal["append", "create", "overwrite"]


class TableBinding(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """A dataset bound to a table: a job's commit of it lands as one snapshot (Iceberg) or version (Delta).

    Exactly one of ``table`` (an Iceberg table in the fleet's catalog) and
    ``delta`` (the dataset's own folder is a Delta Lake table) is given.
    ``mode``: ``append`` (Iceberg: the table exists; Delta: the first commit
    creates it), ``create`` (created from the first commit's Parquet schema
    together with that commit; later commits append), ``overwrite`` (the job's
    files replace the table's contents).
    """

    table: TableName | None = None
    mode: TableMode = "append"
    delta: Annotated[
        bool, msgspec.Meta(description="The dataset's own folder is a Delta Lake table (no `table`).")
    ] = False

    def __post_init__(self) -> None:
        if self.delta == (self.table is not None):
            raise ValueError("a table binding names exactly one of `table` (Iceberg) and `delta: true`")


STREAM_APP_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""Streaming application ids: short enough that ``<app_id>-b<batch>-<8 hex>`` is a job id."""


class StreamBatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The micro-batch a streaming job commits (``shared.spark.commit_batches``; docs/streaming.md).

    The fleet records ``(app_id, batch, query)`` in each dataset's watermarks
    document in the same commit as the data, and refuses, under the dataset's
    lock, a commit of a batch the record already covers.
    """

    app_id: Annotated[
        str,
        msgspec.Meta(
            pattern=STREAM_APP_PATTERN,
            description="The streaming application's id (stable across query restarts).",
        ),
    ]
    batch: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX, description="Spark's micro-batch id.")]
    query: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=64,
            description="The streaming query's id (Spark's query.id, stable across restarts "
            "from one checkpoint).",
        ),
    ]


TRACEPARENT_PATTERN: Final = r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$"
"""A W3C ``traceparent`` of version 00 (the only one defined), trace and parent ids not all zero."""


class TraceContext(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, omit_defaults=True, gc=False
):
    """The producer's span a job-level event belongs to (W3C Trace Context; docs/tracing.md).

    The fleet's spans for the job (intake, commit, abort) are its children:
    one trace per job. A ``traceparent`` that is not a valid version-00 value
    is refused with the event (``schema``).
    """

    traceparent: Annotated[
        str,
        msgspec.Meta(
            pattern=TRACEPARENT_PATTERN,
            description="W3C traceparent: 00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>.",
        ),
    ]
    tracestate: Annotated[
        str,
        msgspec.Meta(
            max_length=512,
            description="W3C tracestate, passed on as sent (a value the tracer cannot read is dropped).",
        ),
    ] = ""


Trace = Annotated[
    TraceContext | msgspec.UnsetType,
    msgspec.Meta(description="The producer's trace context (optional; docs/tracing.md)."),
]
"""Unset (left out of the JSON, so an event without it reads as before) or the producer's context."""


class _QueueEvent(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, tag_field="type", gc=False
):
    v: Version = SCHEMA_VERSION
    job: JobId


class JobStarted(_QueueEvent, frozen=True, kw_only=True, tag="job_started"):
    """Begin: the job is open and its timeout starts at ``started_at``."""

    datasets: DatasetList
    timeout_s: Annotated[float, msgspec.Meta(gt=0, description="Abort the job if it has not ended by then.")]
    started_at: Timestamp
    app: str = ""
    tables: Annotated[
        dict[DatasetName, TableBinding],
        msgspec.Meta(description="Datasets bound to Iceberg or Delta Lake tables (each a declared dataset)."),
    ] = {}
    stream: Annotated[
        StreamBatch | None,
        msgspec.Meta(description="Set when the job commits one micro-batch of a streaming query."),
    ] = None
    trace: Trace = msgspec.UNSET


class TaskFinished(_QueueEvent, frozen=True, kw_only=True, tag="task_finished"):
    """One finished task attempt's staged files for one dataset, and its source watermarks."""

    dataset: DatasetName
    task: Index
    attempt: Index
    files: list[StagedFile]
    watermarks: dict[WatermarkName, WatermarkValue] = {}
    finished_at: Timestamp


class JobFinished(_QueueEvent, frozen=True, kw_only=True, tag="job_finished"):
    """Commit: the job succeeded; per dataset, how many tasks (and which attempts) to commit."""

    datasets: Annotated[
        dict[DatasetName, DatasetExpectation], msgspec.Meta(extra_json_schema={"minProperties": 1})
    ]
    finished_at: Timestamp
    trace: Trace = msgspec.UNSET


class JobFailed(_QueueEvent, frozen=True, kw_only=True, tag="job_failed"):
    """Abort: the job failed; its staged output is cleaned up."""

    datasets: DatasetList
    reason: str
    failed_at: Timestamp
    trace: Trace = msgspec.UNSET


class JobCancelled(_QueueEvent, frozen=True, kw_only=True, tag="job_cancelled"):
    """Abort: the job was cancelled; its staged output is cleaned up."""

    datasets: DatasetList
    reason: str
    cancelled_at: Timestamp
    trace: Trace = msgspec.UNSET


QueueEvent = JobStarted | TaskFinished | JobFinished | JobFailed | JobCancelled
"""Every queue event, as a tagged union (decode target)."""

JobEvent = JobStarted | JobFinished | JobFailed | JobCancelled
"""The job-level events: the ones that may carry ``trace``."""

QUEUE_EVENT_TYPES: Final[dict[str, type[QueueEvent]]] = {
    str(cls.__struct_config__.tag): cls
    for cls in (JobStarted, TaskFinished, JobFinished, JobFailed, JobCancelled)
}
"""Wire ``type`` tag -> event class."""


def event_type(ev: QueueEvent) -> str:
    """Return the wire ``type`` tag of ``ev`` (e.g. ``"task_finished"``)."""
    return str(type(ev).__struct_config__.tag)


def event_datasets(ev: QueueEvent) -> list[str]:
    """Return the datasets ``ev`` concerns, in message order (one for TaskFinished)."""
    if isinstance(ev, TaskFinished):
        return [ev.dataset]
    return list(ev.datasets)


def restrict_to(ev: QueueEvent, datasets: AbstractSet[str]) -> QueueEvent:
    """Return ``ev`` carrying only the datasets in ``datasets`` (order kept).

    The publisher sends a job-level event to every shard that holds one of its
    datasets, each copy naming only that shard's datasets. Returns ``ev``
    itself when nothing is removed.

    Raises:
        BadInput: none of ``ev``'s datasets is in ``datasets`` (the event
            does not belong on that shard at all).
    """
    if isinstance(ev, TaskFinished):
        if ev.dataset not in datasets:
            raise BadInput(f"task_finished for {ev.dataset!r} has no dataset in the given set")
        return ev
    if isinstance(ev, JobFinished):
        kept = {name: exp for name, exp in ev.datasets.items() if name in datasets}
        if not kept:
            raise BadInput(f"job_finished of {ev.job!r} has no dataset in the given set")
        return ev if len(kept) == len(ev.datasets) else msgspec.structs.replace(ev, datasets=kept)
    names = [name for name in ev.datasets if name in datasets]
    if not names:
        raise BadInput(f"{event_type(ev)} of {ev.job!r} has no dataset in the given set")
    return ev if len(names) == len(ev.datasets) else msgspec.structs.replace(ev, datasets=names)
