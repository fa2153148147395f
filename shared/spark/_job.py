"""Driver side: one Spark job run as one commitfleet job (begin, tasks, commit or abort).

::

    with commit_job(spark, datasets=["orders", "customers"], config=cfg) as job:
        job.write_dataset(orders_df, "orders", watermarks=max_watermark("updated_at"))
        job.write_dataset(customers_df, "customers", partition_by=["country"])

On entry ``JobStarted`` is published, a heartbeat thread starts keeping the
job alive in the fleet (``_outcome.Heartbeat``), and the thread's Spark job
group is set to the job id (``interruptOnCancel=True``), so the job's actions
can be cancelled. ``write_dataset`` runs one action whose tasks stage Parquet and
publish ``TaskFinished``; what the action returns names the winning attempt
of each task. On a clean exit ``JobFinished`` carries, per dataset, the task
count and the winners, and (by default) the driver waits for the fleet's
outcome of every dataset: it returns when all committed and raises
:class:`JobNotCommitted` naming each dataset that was not. On an exception
the job group is cancelled (so Ctrl-C really stops the Spark job),
``JobCancelled`` or ``JobFailed`` is published, and the exception is
re-raised. Staged files of a failed job stay where they are: the fleet
cleans them up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import msgspec

from .._errors import BadInput, CommitfleetError
from ..events import (
    DatasetExpectation,
    JobCancelled,
    JobFailed,
    JobStarted,
    QueueEvent,
    StreamBatch,
    TableBinding,
    TaskFinished,
    TraceContext,
    check_job,
)
from ..queue import DatasetResult
from ..tracing import NO_TRACER, Attributes, TraceCarrier, Tracer
from ._config import ProducerConfig
from ._finish import JobEnd
from ._names import check_datasets, new_job_id, reason_text
from ._outcome import POLL_MAX_S, POLL_MIN_S, STREAM_POLL_MAX_S, STREAM_POLL_MIN_S, Heartbeat
from ._partitions import check_partition_columns
from ._preflight import run_preflight
from ._publishing import publish, resolve_shards
from ._tables import check_binding, check_delta_binding
from ._winners import TaskResult, expectation_from_results, looks_cancelled
from ._writer import Watermarks, WriteSpec, write_partition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

_GROUP_KEYS = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


class JobCancelledError(CommitfleetError):
    """The commitfleet job was cancelled (``JobContext.cancel``) before or between actions."""


class JobContext:
    """One open commitfleet job on the driver (made by :func:`commit_job`).

    Thread safety: :meth:`cancel` may be called from any thread, and
    :meth:`write_dataset` may run in several threads at once for different
    datasets (each thread's actions join the job's Spark job group); the
    context itself is entered and left by one thread, after the others ended.
    """

    def __init__(
        self,
        spark: SparkSession,
        job_id: str,
        datasets: tuple[str, ...],
        config: ProducerConfig,
        *,
        tracer: Tracer = NO_TRACER,
    ):
        self._spark = spark
        self._tracer = tracer
        # The job span's context, sent in every job-level event (``trace``); set by commit_job.
        self._carrier: TraceCarrier | None = None
        self._job_id = job_id
        self._datasets = datasets
        self._config = config
        self._expectations: dict[str, DatasetExpectation] = {}
        self._tables: dict[str, TableBinding] = {}
        self._started: JobStarted | None = None  # as published on entry; re-sent with each new binding
        self._writing: set[str] = set()
        self._lock = threading.Lock()
        self._cancel_reason: str | None = None
        # How the job ends (JobFinished, the outcome, the heartbeat's cancels): a part of its own.
        self._end = JobEnd(
            config,
            job_id,
            datasets,
            publish=self._publish,
            cancel=self.cancel,
            cancel_reason=lambda: self.cancel_reason,
        )

    @property
    def job_id(self) -> str:
        """The job id (also the Spark job group of its actions)."""
        return self._job_id

    @property
    def datasets(self) -> tuple[str, ...]:
        """The datasets the job declared in ``JobStarted``."""
        return self._datasets

    @property
    def config(self) -> ProducerConfig:
        """The producer config, with the fleet's shard count resolved."""
        return self._config

    @property
    def expectations(self) -> dict[str, DatasetExpectation]:
        """What ``JobFinished`` will promise so far: dataset -> tasks and winners (a copy)."""
        with self._lock:
            return dict(self._expectations)

    @property
    def results(self) -> dict[str, DatasetResult]:
        """The fleet's outcome per dataset once ``commit_job`` has waited for it (else empty).

        Each result has ``status`` (``committed``), ``files``, ``bytes`` and
        ``manifest`` (the manifest's key under the store root).
        """
        return self._end.results

    @property
    def cancel_reason(self) -> str | None:
        """Why :meth:`cancel` was called, or None."""
        with self._lock:
            return self._cancel_reason

    def write_dataset(
        self,
        df: DataFrame,
        dataset: str,
        *,
        watermarks: Watermarks = None,
        partition_by: Sequence[str] | None = None,
        compression: str = "snappy",
        fail_once_tasks: Iterable[int] = (),
        table: str | None = None,
        mode: str = "append",
        delta: bool = False,
    ) -> list[TaskResult]:
        """Stage ``df`` as the job's output for ``dataset``: one Spark action, one task per partition.

        Each task writes its rows as Parquet (one file, or one per
        ``partition_by`` value combination under ``col=value/``) into
        ``_staging/<job>/<dataset>/<task>-<attempt>/`` and publishes
        ``TaskFinished`` with the files and ``watermarks`` (a mapping for every
        task, or ``fn(task, partition_table) -> mapping``, e.g.
        :func:`max_watermark`).

        ``fail_once_tasks`` is FAULT INJECTION, for tests and the demo only:
        attempt 0 of each listed task index raises after it published, so
        Spark retries it (needs a master with retries, e.g. ``local[2,2]``).

        Returns:
            The winning attempt of each task with its files, by task index.
            The dataset's expectation is recorded for ``JobFinished``.

        Raises:
            BadInput: unknown or already written dataset, bad ``partition_by``,
                bad ``table`` or ``mode``, ``table`` with ``partition_by``, both
                ``table`` and ``delta``.
            JobCancelledError: :meth:`cancel` was called before the action.
            Whatever the Spark action raises (a failed task after its retries,
            or the cancellation of the job group).

        ``table`` binds the dataset to an Iceberg table (``namespace.name``):
        the fleet lands this job's commit of it as exactly one snapshot, in
        ``mode`` ``append``, ``create`` (the first commit creates the table) or
        ``overwrite``. The binding is sent (a repeated ``JobStarted``) before
        the action runs. ``delta=True`` binds it to the Delta Lake table in the
        dataset's own folder (``<store root>/<dataset>``) instead: one Delta
        version per job, ``mode`` ``append`` (the first commit creates the
        table) or ``overwrite``; ``partition_by`` folders become the table's
        partition columns (docs/tables.md).

        Blocks for the whole action; :meth:`cancel` from another thread (or
        Ctrl-C, which ``commit_job`` turns into a cancel) interrupts it.
        """
        if dataset not in self._datasets:
            raise BadInput(f"dataset {dataset!r} was not declared for job {self._job_id}")
        if delta and table is not None:
            raise BadInput(f"dataset {dataset!r}: give table (Iceberg) or delta=True, not both")
        binding = None if table is None else check_binding(dataset, table, mode)
        if delta:
            binding = check_delta_binding(dataset, mode)
        elif binding is not None and partition_by:
            # Hive folders drop the partition columns from the files; the table would lose them.
            raise BadInput(
                f"dataset {dataset!r}: partition_by cannot be combined with table (not supported yet)"
            )
        started: JobStarted | None = None
        with self._lock:
            if dataset in self._expectations or dataset in self._writing:
                raise BadInput(f"dataset {dataset!r} is already written by job {self._job_id}")
            self._writing.add(dataset)
            if binding is not None and self._started is not None:
                self._tables[dataset] = binding
                started = msgspec.structs.replace(self._started, tables=dict(self._tables))
        try:
            if started is not None:
                # The fleet keeps a dataset's first binding; JobFinished comes after this on the same shards.
                self._publish(started)
            # The job's span is given as parent: this may run in another thread than commit_job's.
            attributes = {"commitfleet.job": self._job_id, "commitfleet.dataset": dataset}
            with self._tracer.span("commitfleet.write", parent=self._carrier, attributes=attributes) as span:
                results = self._write(df, dataset, watermarks, partition_by, compression, fail_once_tasks)
                span.set("commitfleet.tasks", len(results))
                return results
        finally:
            with self._lock:
                self._writing.discard(dataset)

    def _write(
        self,
        df: DataFrame,
        dataset: str,
        watermarks: Watermarks,
        partition_by: Sequence[str] | None,
        compression: str,
        fail_once_tasks: Iterable[int],
    ) -> list[TaskResult]:
        self._raise_if_cancelled()
        from pyspark.sql.pandas.types import to_arrow_schema

        columns = check_partition_columns(partition_by or (), df.schema.names)
        spec = WriteSpec(
            job=self._job_id,
            dataset=dataset,
            config=self._config,
            arrow_schema=to_arrow_schema(df.schema, timezone="UTC"),
            partition_by=columns,
            watermarks=watermarks,
            fail_once_tasks=frozenset(fail_once_tasks),
            compression=compression,
        )
        self._set_job_group(f"commitfleet {self._job_id}: {dataset}")

        def run(rows: Iterable[Any]) -> Iterable[TaskResult]:
            return write_partition(spec, rows)

        results = df.rdd.mapPartitions(run).collect()
        self._raise_if_cancelled()
        expectation = expectation_from_results(dataset, results)
        with self._lock:
            self._expectations[dataset] = expectation
        return sorted(results, key=lambda r: r.task)

    def cancel(self, reason: str = "cancelled") -> None:
        """Cancel the job: interrupt its running Spark action (from any thread).

        The thread inside ``commit_job`` then sees the action fail, and
        ``JobCancelled`` with ``reason`` is published on the way out. A later
        ``write_dataset`` raises :class:`JobCancelledError`. Idempotent: the
        first reason is kept.
        """
        with self._lock:
            if self._cancel_reason is None:
                self._cancel_reason = reason
        self._spark.sparkContext.cancelJobGroup(self._job_id)

    # -- internals --------------------------------------------------------------

    def _raise_if_cancelled(self) -> None:
        reason = self.cancel_reason
        if reason is not None:
            raise JobCancelledError(f"job {self._job_id} was cancelled: {reason}")

    def _set_job_group(self, description: str) -> None:
        # Job groups are per thread (PySpark pins Python threads to JVM
        # threads), so they are set again by whichever thread runs the action.
        self._spark.sparkContext.setJobGroup(self._job_id, description, interruptOnCancel=True)

    def _group_properties(self) -> dict[str, str | None]:
        sc = self._spark.sparkContext
        return {k: sc.getLocalProperty(k) for k in _GROUP_KEYS}

    def _restore_group_properties(self, saved: Mapping[str, str | None]) -> None:
        sc = self._spark.sparkContext
        for key, value in saved.items():
            sc.setLocalProperty(key, value)  # type: ignore[arg-type]  # None removes the property

    def _publish(self, ev: QueueEvent) -> None:
        carrier = self._carrier
        if carrier is not None and type(ev) is not TaskFinished:
            trace = TraceContext(traceparent=carrier.traceparent, tracestate=carrier.tracestate)
            ev = msgspec.structs.replace(ev, trace=trace)
        publish(self._config, ev)

    def _check_complete(self) -> None:
        missing = [d for d in self._datasets if d not in self.expectations]
        if missing:
            raise BadInput(f"job {self._job_id} ended without writing datasets {missing}")

    def _abort(self, exc: BaseException) -> None:
        """Cancel the Spark job group and publish JobCancelled or JobFailed for ``exc``."""
        from py4j.protocol import Py4JError

        try:
            self._spark.sparkContext.cancelJobGroup(self._job_id)
        # The JVM may be gone (Py4JError), or the context stopped (no JVM handle
        # left: AttributeError); the abort event must go out all the same.
        except (Py4JError, AttributeError) as cancel_exc:
            log.warning("could not cancel Spark job group %s: %s", self._job_id, cancel_exc)
        requested = self.cancel_reason
        if requested is not None:
            exc.add_note(f"commitfleet: job {self._job_id} cancelled: {requested}")
        reason = reason_text(exc)
        if requested is not None or isinstance(exc, KeyboardInterrupt) or looks_cancelled(reason):
            why = requested or (
                "interrupted (KeyboardInterrupt)" if isinstance(exc, KeyboardInterrupt) else reason
            )
            ev: QueueEvent = JobCancelled(
                job=self._job_id, datasets=list(self._datasets), reason=why, cancelled_at=time.time()
            )
        else:
            ev = JobFailed(
                job=self._job_id, datasets=list(self._datasets), reason=reason, failed_at=time.time()
            )
        try:
            self._publish(ev)
        except CommitfleetError as pub_exc:  # never hide the job's own error behind this one
            log.exception("could not publish %s for job %s", type(ev).__name__, self._job_id)
            exc.add_note(
                f"commitfleet: publishing {type(ev).__name__} failed ({pub_exc}); "
                "the fleet will abort the job at its timeout"
            )


@contextmanager
def commit_job(
    spark: SparkSession,
    job_id: str | None = None,
    datasets: Iterable[str] = (),
    *,
    config: ProducerConfig,
    wait: bool | None = None,
    stream: StreamBatch | None = None,
    tracer: Tracer = NO_TRACER,
) -> Iterator[JobContext]:
    """Open a commitfleet job around Spark actions; see the module docstring.

    ``job_id`` defaults to :func:`new_job_id` (``<app>-<time>-<random>``);
    a retried run of a pipeline must use a new id. While the block runs (and
    while waiting for the outcome) a heartbeat thread keeps the job alive in
    the fleet. ``wait`` (default ``config.wait``, True) makes a clean exit
    wait up to ``config.wait_timeout`` seconds for the fleet's outcome of
    every dataset, available afterwards as :attr:`JobContext.results`;
    ``wait=False`` returns once ``JobFinished`` is published. ``stream`` is
    set by :func:`~shared.spark.commit_batches` only: the micro-batch the job
    commits (``JobStarted.stream``; the driver then polls in short steps).
    ``tracer`` (default: none, see :func:`shared.tracing.open_tracer`) records
    the job's span ``commitfleet.job`` (a child of the caller's current span,
    if any) and sends its context in the job-level events, so the fleet's
    spans of the job join its trace (docs/tracing.md).

    Yields:
        The :class:`JobContext` to write datasets through.

    Raises:
        BadInput: bad job id or dataset names; on exit, a declared dataset was
            never written (the job is then published as failed).
        ConfigError: the fleet's shard count cannot be resolved.
        TransientError: Redis unreachable when publishing JobStarted (nothing
            ran) or JobFinished (then the fleet aborts the job at its timeout).
        JobCancelledError: :meth:`JobContext.cancel` was called and the body
            ended without another error (``JobCancelled`` was published).
        JobNotCommitted: a dataset was aborted (failed, timed out, skipped),
            quarantined or blocked, or the fleet had ended part of the job
            before ``JobFinished`` (then the rest got ``JobFailed``); the
            message names each dataset and its reason.
        OutcomeTimeout: waiting, no outcome within ``config.wait_timeout``
            (the job may still commit).
        OutcomeForgotten: the fleet ended the job but no longer keeps some
            datasets' results (``queue.results_max``): raised at once; each
            dataset's manifest says whether it committed.
        Whatever the body raises, after ``JobFailed`` / ``JobCancelled``.
    """
    job = job_id or new_job_id(config.app)
    try:
        check_job(job)
    except BadInput as exc:
        raise BadInput(f"bad job id: {exc}") from None
    names = check_datasets(datasets)
    attributes: Attributes = {"commitfleet.job": job, "commitfleet.datasets": len(names)}
    with tracer.span("commitfleet.job", attributes=attributes) as span:
        resolved = resolve_shards(config)
        ctx = JobContext(spark, job, names, resolved, tracer=tracer)
        ctx._carrier = span.carrier()
        with _running(ctx, resolved, stream, wait) as running:
            yield running  # the wait for the outcome, when asked, is _running's: inside the span


@contextmanager
def _running(
    ctx: JobContext, resolved: ProducerConfig, stream: StreamBatch | None, wait: bool | None
) -> Iterator[JobContext]:
    """The body of :func:`commit_job` once the job context exists (inside the job's span)."""
    job, names, spark = ctx.job_id, ctx.datasets, ctx._spark
    run_preflight(spark, job, resolved)  # executors can import, write, reach Redis (spark: _preflight.py)
    saved = ctx._group_properties()
    ctx._started = JobStarted(
        job=job,
        datasets=list(names),
        timeout_s=resolved.job_timeout,
        started_at=time.time(),
        app=resolved.app,
        stream=stream,
    )
    ctx._publish(ctx._started)
    heartbeat = Heartbeat(resolved, job, names, on_beat=ctx._end.on_beat)
    heartbeat.start()
    try:
        ctx._set_job_group(f"commitfleet {job}")
        # The executors' preflight (a one-partition probe) belongs here, before
        # the body's first write: a failure aborts the job like any exception.
        try:
            yield ctx
            ctx._raise_if_cancelled()
            ctx._check_complete()
        except BaseException as exc:
            ctx._end.stop_cancelling()
            ctx._abort(exc)
            raise
        ctx._end.stop_cancelling()
        # Not inside the abort path: JobFinished may have reached some shards
        # when publishing fails, and a JobFailed after it would split the job.
        ctx._end.publish_finished(ctx.expectations)
        if resolved.wait if wait is None else wait:
            poll = (STREAM_POLL_MIN_S, STREAM_POLL_MAX_S) if stream is not None else (POLL_MIN_S, POLL_MAX_S)
            with ctx._tracer.span("commitfleet.wait", attributes={"commitfleet.job": job}):
                ctx._end.wait(resolved.wait_timeout, poll)
    finally:
        heartbeat.stop()
        ctx._restore_group_properties(saved)


__all__ = [
    "JobCancelledError",
    "JobContext",
    "check_datasets",
    "commit_job",
    "new_job_id",
]
