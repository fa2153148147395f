"""Executor side: write one partition as staged Parquet, then publish ``TaskFinished``.

:func:`write_partition` runs inside a Spark task (``rdd.mapPartitions``). It

1. converts the partition's rows to Arrow (in batches) and splits them by the
   ``partition_by`` columns into Hive-style folders;
2. writes each part as Parquet into the attempt's staging folder
   ``_staging/<job>/<dataset>/<task>-<attempt>/`` through the object-store
   port, several files at once. Writes are create-if-absent: Spark numbers
   attempts from 0 again when it re-runs a whole stage (lost shuffle output),
   and a leftover attempt of the old stage attempt must make the new one fail
   and retry under the next number rather than overwrite its files. (Such
   attempts fail while reading their input, before they stage anything, so
   in practice the numbers do not meet.)
3. publishes ``TaskFinished`` with the files (size, MD5, and the statistics
   of each Parquet file from the footer just written, see
   :mod:`._parquet_stats`) and the watermarks;
4. yields one :class:`~._winners.TaskResult` (also for an empty partition), so
   the action's result holds exactly one winning attempt per task.

A killed attempt sees its partition cut short (PySpark ends the rows at the
closed socket, see :mod:`._task_input`), so the task checks that the executor
still holds its input open once the rows are read (before staging) and again
before publishing: an attempt that did not receive its whole partition never
publishes, it raises :class:`~._task_input.TaskInterrupted`.

Errors that no retry can fix (:class:`~shared.ConfigError`, e.g. missing store
credentials, and :class:`~shared.BadInput`) are not raised, which would make
Spark run the task again ``spark.task.maxFailures`` times: the attempt returns
them in its result and the driver fails the job at once with one error
(:func:`~._winners.expectation_from_results`).

Clients (store, Redis) are cached per Python worker process, not per task.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import io
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from .._aio import TaskGroup
from .._errors import BadInput, CommitfleetError, ConfigError, TransientError
from ..events import FileStats, StagedFile, TaskFinished, encode_event, staged_key
from ..storage import ObjectStore
from ._config import ProducerConfig
from ._executor_runtime import process_runtime
from ._parquet_stats import parquet_file_stats
from ._partitions import split_table
from ._publishing import publish
from ._task_input import require_alive
from ._winners import TaskResult, hopeless_kind

if TYPE_CHECKING:
    import pyarrow as pa

WatermarkFn = Callable[[int, "pa.Table"], Mapping[str, int]]
"""``fn(task_index, partition_table) -> {name: value}``, called inside the task."""

Watermarks = Mapping[str, int] | WatermarkFn | None
"""Per-task watermarks: the same mapping for every task, or a function of the task's data."""

PART_NAME = "part-0.parquet"

STATS_EVENT_BUDGET = 256 * 1024
"""A ``TaskFinished`` with its files' statistics over this many bytes (a quarter of the fleet's
default size limit) is sent without them: the fleet then reads those footers."""


class InjectedTaskFailure(CommitfleetError):
    """Raised on purpose by the ``fail_once_tasks`` fault-injection knob (tests and demo only)."""


@dataclass(frozen=True)
class WriteSpec:
    """Everything a task needs to stage its partition; pickled into every task.

    ``fail_once_tasks`` is FAULT INJECTION for tests and the demo: attempt 0
    of each listed task raises :class:`InjectedTaskFailure` *after* it staged
    its files and published ``TaskFinished``, so Spark retries the task and two
    published attempts exist.
    """

    job: str
    dataset: str
    config: ProducerConfig
    arrow_schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    watermarks: Watermarks = None
    fail_once_tasks: frozenset[int] = field(default_factory=frozenset)
    compression: str = "snappy"
    batch_rows: int = 65_536


def max_watermark(column: str, name: str | None = None) -> WatermarkFn:
    """Return a watermark function: the maximum of ``column`` in each task's partition.

    Integers are taken as they are, timestamps as microseconds since the Unix
    epoch (naive ones read as UTC), dates as days since the epoch. A partition
    where the column is empty or all null reports no watermark.
    """
    key = name or column

    def compute(task: int, table: pa.Table) -> Mapping[str, int]:
        import pyarrow.compute as pc

        del task
        value = pc.max(table.column(column)).as_py() if table.num_rows else None
        return {} if value is None else {key: watermark_int(value)}

    return compute


def watermark_int(value: Any) -> int:
    """Return ``value`` as a watermark integer (see :func:`max_watermark`).

    Raises:
        BadInput: not an int, datetime or date.
    """
    if isinstance(value, bool):
        raise BadInput("a watermark cannot be a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return (aware - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    if isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days
    raise BadInput(f"a watermark must be an int, datetime or date, not {type(value).__name__}")


def rows_to_table(rows: list[Any], schema: pa.Schema) -> pa.Table:
    """Return Spark ``Row`` objects (tuples in schema order) as an Arrow table.

    Timestamps with a time zone come from PySpark as naive local times; they
    are made aware first so the instant is kept whatever the worker's zone.
    """
    import pyarrow as pa

    if not rows:
        return schema.empty_table()
    columns = list(zip(*rows, strict=True))
    arrays = []
    for i, f in enumerate(schema):
        values: Iterable[Any] = columns[i]
        if pa.types.is_timestamp(f.type) and f.type.tz is not None:
            values = [v.astimezone(dt.UTC) if v is not None and v.tzinfo is None else v for v in values]
        elif _is_nested(f.type):
            values = [_plain(v) for v in values]
        arrays.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _is_nested(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_nested(t))


def _plain(value: Any) -> Any:
    # Spark Rows (tuples with field names) inside structs and lists become dicts.
    as_dict = getattr(value, "asDict", None)
    if as_dict is not None:
        return {k: _plain(v) for k, v in as_dict().items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _parquet_bytes(table: pa.Table, compression: str) -> tuple[bytes, FileStats | None]:
    """Return ``table`` as Parquet bytes and its statistics (None when the contract cannot carry them)."""
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    # pq.write_table's own writer, kept: its metadata after close is the footer just written.
    with pq.ParquetWriter(buf, table.schema, compression=compression) as writer:
        writer.write_table(table)
    return buf.getvalue(), parquet_file_stats(writer.writer.metadata)


def encode_partition(
    rows: Iterable[Any], spec: WriteSpec, task: int
) -> tuple[dict[str, bytes], dict[str, FileStats], dict[str, int]]:
    """Return the partition's staged files (relative path -> Parquet bytes), their statistics, its watermarks.

    An empty partition gives no files. A file the contract's statistics
    cannot describe (a nested column, say: see :mod:`._parquet_stats`) has
    none; the fleet then reads its footer when a table needs it.

    Raises:
        BadInput: a watermark function returned a bad value.
    """
    import pyarrow as pa

    batches: list[pa.Table] = []
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= spec.batch_rows:
            batches.append(rows_to_table(chunk, spec.arrow_schema))
            chunk = []
    if chunk or not batches:
        batches.append(rows_to_table(chunk, spec.arrow_schema))
    table = pa.concat_tables(batches) if len(batches) > 1 else batches[0]

    files: dict[str, bytes] = {}
    stats: dict[str, FileStats] = {}
    if table.num_rows:
        for folder, part in split_table(table, spec.partition_by):
            rel = folder + PART_NAME
            files[rel], found = _parquet_bytes(part, spec.compression)
            if found is not None:
                stats[rel] = found

    wm = spec.watermarks
    marks: Mapping[str, int] = wm(task, table) if callable(wm) else (wm or {})
    checked: dict[str, int] = {}
    for name, value in marks.items():
        if not isinstance(name, str) or not name or isinstance(value, bool) or not isinstance(value, int):
            raise BadInput(f"watermark {name!r}={value!r}: names are non-empty strings, values ints")
        checked[name] = value
    return files, stats, checked


async def upload_files(
    store: ObjectStore,
    prefix_of: Callable[[str], str],
    files: Mapping[str, bytes],
    concurrency: int,
    stats: Mapping[str, FileStats] | None = None,
) -> list[StagedFile]:
    """Write every file create-if-absent, at most ``concurrency`` at once; return them as StagedFiles.

    A file with an entry in ``stats`` carries it (``StagedFile.stats``).

    Raises (one error, never an ExceptionGroup: see :func:`one_error`):
        ConfigError: the store refused the configuration (e.g. no credentials).
        PreconditionFailed: a file of this attempt already exists.
        TransientError: the store failed, or reported another size than written.

    Cancellation cancels the outstanding writes (the TaskGroup awaits them).
    """
    sem = asyncio.Semaphore(concurrency)
    staged: dict[str, StagedFile] = {}

    async def one(rel: str, data: bytes) -> None:
        async with sem:
            info = await store.write_if_absent(prefix_of(rel), data)
        if info.size != len(data):
            raise TransientError(f"store reports {info.size} bytes for {rel}, wrote {len(data)}")
        staged[rel] = StagedFile(
            path=rel,
            size=len(data),
            md5=hashlib.md5(data, usedforsecurity=False).hexdigest(),
            stats=(stats or {}).get(rel),
        )

    try:
        async with TaskGroup() as tg:
            for rel, data in files.items():
                tg.create_task(one(rel, data))
    except* CommitfleetError as group:
        # One error per file would say the same thing N times (and an
        # ExceptionGroup hides the cause from callers that sort errors by class).
        raise one_error(group) from None
    return [staged[rel] for rel in sorted(staged)]


_PRECEDENCE: tuple[type[CommitfleetError], ...] = (ConfigError, BadInput)


def one_error(group: BaseExceptionGroup[CommitfleetError]) -> CommitfleetError:
    """Return the one error that stands for a group of per-file errors (pure).

    A hopeless error (ConfigError, then BadInput) wins over the others, since
    retrying cannot fix it; otherwise the first error. Its message says how
    many files failed. The chosen error keeps its class and its cause.
    """
    errors = [e for e in _leaves(group) if isinstance(e, CommitfleetError)]
    chosen = next((e for cls in _PRECEDENCE for e in errors if isinstance(e, cls)), errors[0])
    if len(errors) > 1:
        chosen.add_note(f"commitfleet: {len(errors)} staged files failed; this is one of them")
    return chosen


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def write_partition(spec: WriteSpec, rows: Iterable[Any]) -> Iterator[TaskResult]:
    """Stage this task's partition, publish ``TaskFinished``, and yield its one result.

    Must run inside a Spark task. The task index is
    ``TaskContext.partitionId()``, the attempt ``TaskContext.attemptNumber()``.

    Yields a result carrying the error instead of raising when the error is
    hopeless (ConfigError, BadInput: see :func:`~._winners.hopeless_kind`), so
    Spark does not retry it; the driver raises it.

    Raises (failing the task attempt, which Spark may retry):
        TaskInterrupted: Spark killed the attempt; nothing more is staged or published.
        TransientError / PreconditionFailed / OutcomeUnknown: staging or publishing failed.
        InjectedTaskFailure: fault injection (``spec.fail_once_tasks``), after publishing.
    """
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        raise RuntimeError("write_partition must run inside a Spark task")
    task = tc.partitionId()
    attempt = tc.attemptNumber()
    try:
        staged = _stage_and_publish(spec, rows, task, attempt)
    except (ConfigError, BadInput) as exc:
        yield TaskResult(task=task, attempt=attempt, files=[], error=str(exc), error_kind=hopeless_kind(exc))
        return
    if task in spec.fail_once_tasks and attempt == 0:
        raise InjectedTaskFailure(f"fault injection: task {task} attempt 0 fails after publishing")
    yield TaskResult(task=task, attempt=attempt, files=staged)


def _stage_and_publish(spec: WriteSpec, rows: Iterable[Any], task: int, attempt: int) -> list[StagedFile]:
    files, stats, marks = encode_partition(rows, spec, task)
    # The rows ended: at the end of the partition, or where a kill cut them.
    require_alive(task, attempt, "staging")
    runtime = process_runtime()
    store = runtime.store(spec.config.store_url, spec.config.store)

    def key_of(rel: str) -> str:
        return staged_key(spec.job, spec.dataset, task, attempt, rel)

    staged = runtime.run(upload_files(store, key_of, files, spec.config.upload_concurrency, stats))
    event = task_finished(spec.job, spec.dataset, task, attempt, staged, marks, time.time())
    # A kill during the upload: the partition was whole, but Spark has
    # discarded this attempt; its staged files are the fleet's to clean up.
    require_alive(task, attempt, "publishing")
    publish(spec.config, event)
    return [_bare(f) for f in staged]  # the driver needs no statistics


def task_finished(
    job: str,
    dataset: str,
    task: int,
    attempt: int,
    staged: list[StagedFile],
    marks: Mapping[str, int],
    finished_at: float,
) -> TaskFinished:
    """Return the attempt's ``TaskFinished``: its files with their statistics, unless that is too big.

    Statistics are an optimisation, never the reason an event goes over the
    fleet's size limit: an event they would make larger than
    :data:`STATS_EVENT_BUDGET` carries none (the fleet reads those footers).
    """
    event = TaskFinished(
        job=job,
        dataset=dataset,
        task=task,
        attempt=attempt,
        files=staged,
        watermarks=dict(marks),
        finished_at=finished_at,
    )
    if any(f.stats is not None for f in staged) and len(encode_event(event)) > STATS_EVENT_BUDGET:
        return msgspec.structs.replace(event, files=[_bare(f) for f in staged])
    return event


def _bare(f: StagedFile) -> StagedFile:
    return f if f.stats is None else msgspec.structs.replace(f, stats=None)


__all__ = [
    "InjectedTaskFailure",
    "PART_NAME",
    "STATS_EVENT_BUDGET",
    "WatermarkFn",
    "Watermarks",
    "WriteSpec",
    "encode_partition",
    "max_watermark",
    "one_error",
    "task_finished",
    "rows_to_table",
    "upload_files",
    "watermark_int",
    "write_partition",
]
