"""Structured Streaming: every micro-batch of a query committed exactly once, across restarts.

::

    def write(job, batch_df, batch_id):
        job.write_dataset(batch_df, "events", watermarks=max_watermark("offset"))

    query = (
        spark.readStream.json(src)
        .writeStream.foreachBatch(
            commit_batches(write, app_id="events-ingest", datasets=["events"], config=cfg)
        )
        .option("checkpointLocation", checkpoint)
        .start()
    )

Spark calls the returned function once per micro-batch, and calls it again
with the same ``batch_id`` when the driver died before Spark's commit log
recorded the batch. Each call (a *run* of the batch) is a commitfleet job,
``<app_id>-b<batch_id>-<random>``; what decides is the store's record of the
last batch of ``app_id`` each dataset committed, written by the fleet in the
same commit as the data (docs/streaming.md):

1. ``probe("batch.start")``. The app's last run (a Redis record) is read:
   when it is the previous batch and ended, the batch runs at once (the fast
   path). Otherwise a run that did not end (its driver died: the Redis
   record's, and any run of the batch whose staged files are in the store,
   which finds them when Redis lost the record) is cancelled at once and its
   outcome awaited, and the store's records are read
   (:func:`~._stream_plan.plan_batch`): datasets at or past the batch are
   skipped; when all are, the batch is skipped (one log line,
   ``probe("batch.skipped")``, the recorded results).
2. The job runs as :func:`~._job.commit_job` runs one: the user's
   ``write(job, batch_df, batch_id)`` stages the datasets,
   ``probe("batch.staged")``, ``JobFinished``, the wait for the fleet.
3. A dataset the fleet refused (its record already covered the batch: a run
   racing a dead one's recovery, a lost Redis write) is judged by the
   record again: covered by this query, it counts as committed.
4. ``probe("batch.committed")``, the run recorded as ended, return: Spark
   writes its commit log only now.

A ``write`` that raises publishes ``JobFailed`` (the fleet rolls the batch
back) and the error stops the query; restarted, Spark runs the batch again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from .._errors import BadInput, CommitfleetError
from ..commit import Manifest, StreamRecord, read_manifest, read_watermarks_doc
from ..events import JobCancelled, StreamBatch, manifest_key, staging_jobs_prefix
from ..queue import (
    DatasetResult,
    Keys,
    RunState,
    StreamRun,
    read_stream_run_sync,
    retry_sync,
    write_stream_run_sync,
)
from ..storage import ObjectStore
from ..tracing import NO_TRACER, Attributes, Tracer
from ._config import ProducerConfig
from ._executor_runtime import ExecutorRuntime, process_runtime
from ._job import JobContext, commit_job
from ._names import check_datasets
from ._outcome import (
    STREAM_POLL_MAX_S,
    STREAM_POLL_MIN_S,
    JobNotCommitted,
    OutcomeForgotten,
    read_outcome,
    wait_for_outcome,
)
from ._publishing import publish, publisher_for, resolve_shards
from ._stream_plan import (
    BatchPlan,
    StreamConflict,
    check_app_id,
    dead_runs,
    plan_batch,
    stream_job_id,
    stream_job_prefix,
)
from ._winners import TaskResult

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The local property Spark sets to the query's id while it runs a micro-batch."""

BatchProbe = Callable[[str, int], None]
"""``probe(point, batch_id)``: called at ``batch.start``, ``batch.staged``, ``batch.committed`` and
``batch.skipped`` (tests inject crashes here; the default does nothing)."""

WriteFn = Callable[["BatchJob", "DataFrame", int], None]


def _no_probe(point: str, batch_id: int) -> None:
    return None


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What one call of the batch function ended with.

    ``job_id`` is None when the batch was skipped (``skipped``: every dataset
    already held it); ``results`` maps each dataset to its committed result
    (for a dataset committed by an earlier run, the recorded one: ``reason``
    names that run's job and ``manifest`` its manifest).
    """

    batch_id: int
    query_id: str
    job_id: str | None
    skipped: bool
    results: dict[str, DatasetResult] = field(default_factory=dict)


class BatchJob:
    """The job of one micro-batch, as the user's ``write`` sees it.

    ``write_dataset`` is :meth:`JobContext.write_dataset`, except for a
    dataset that already holds this batch (an earlier run committed it before
    its driver died): nothing is written and ``[]`` is returned.
    """

    def __init__(
        self, ctx: JobContext, app_id: str, batch_id: int, query_id: str, done: Mapping[str, StreamRecord]
    ) -> None:
        self._ctx = ctx
        self._done = dict(done)
        self.app_id = app_id
        self.batch_id = batch_id
        self.query_id = query_id

    @property
    def job_id(self) -> str:
        """The id of this run's job."""
        return self._ctx.job_id

    @property
    def context(self) -> JobContext:
        """The underlying job context (cancel, expectations)."""
        return self._ctx

    def write_dataset(self, df: DataFrame, dataset: str, **options: Any) -> list[TaskResult]:
        """Stage ``df`` as this batch's output for ``dataset`` (see :meth:`JobContext.write_dataset`).

        Returns:
            The winning attempt of each task, or ``[]`` when the dataset
            already holds this batch.

        Raises:
            As :meth:`JobContext.write_dataset`.
        """
        if dataset in self._done:
            rec = self._done[dataset]
            log.info(
                "commitfleet: dataset %s already holds batch %d of app %s (job %s): not written again",
                dataset,
                self.batch_id,
                self.app_id,
                rec.job,
            )
            return []
        return self._ctx.write_dataset(df, dataset, **options)


class BatchCommitter:
    """The function given to ``foreachBatch`` (made by :func:`commit_batches`).

    One instance serves one query at a time: Spark calls it from the query's
    thread, one batch after the other. :attr:`last` holds the outcome of the
    last call that returned.
    """

    def __init__(
        self,
        write: WriteFn,
        *,
        app_id: str,
        datasets: Iterable[str],
        config: ProducerConfig,
        probe: BatchProbe | None = None,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        self._write = write
        self._tracer = tracer
        self.app_id = check_app_id(app_id)
        self.datasets = check_datasets(datasets)
        self._config = config
        self._probe = probe or _no_probe
        self._resolved: ProducerConfig | None = None
        self._checked = False  # the executors' preflight passed once: not again for every batch
        self.last: BatchOutcome | None = None

    # -- the batch function -------------------------------------------------------

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """Commit one micro-batch exactly once (see the module doc); return when it is committed.

        Raises:
            StreamConflict: the store records later batches of another query
                under this app id.
            JobNotCommitted: a dataset was aborted, quarantined or blocked
                (the query stops with it).
            OutcomeTimeout / OutcomeForgotten: no outcome from the fleet (this
                batch's, or the dead run's it had to settle first).
            BadInput: not called inside a streaming query's ``foreachBatch``,
                or by ``write``.
            Whatever ``write`` raises (after ``JobFailed``).
        """
        spark = batch_df.sparkSession
        query = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query:
            raise BadInput(
                "commit_batches: no streaming query id: call it from DataStreamWriter.foreachBatch"
            )
        attributes: Attributes = {"commitfleet.app_id": self.app_id, "commitfleet.batch": batch_id}
        with self._tracer.span("commitfleet.batch", attributes=attributes) as span:
            span.set("commitfleet.query", query)
            self._batch(spark, query, batch_df, batch_id)

    def _batch(self, spark: SparkSession, query: str, batch_df: DataFrame, batch_id: int) -> None:
        """The body of :meth:`__call__` (inside the batch's span)."""
        self._probe("batch.start", batch_id)
        config = self._config_resolved()
        plan = self._plan(config, query, batch_id)
        if plan.skip:
            self._skip(config, query, batch_id, plan)
            return
        stream = StreamBatch(app_id=self.app_id, batch=batch_id, query=query)
        job_id = stream_job_id(self.app_id, batch_id)
        self._record(config, job_id, batch_id, query, "running", plan.todo)
        results: dict[str, DatasetResult]
        try:
            with commit_job(
                spark, job_id, plan.todo, config=self._job_config(config), stream=stream, tracer=self._tracer
            ) as ctx:
                self._checked = True
                self._write(BatchJob(ctx, self.app_id, batch_id, query, plan.done), batch_df, batch_id)
                self._probe("batch.staged", batch_id)
            results = ctx.results
        except JobNotCommitted as exc:
            results = self._judge_refused(config, query, batch_id, exc)
        except BaseException:
            self._record_quietly(config, job_id, batch_id, query, "failed", plan.todo)
            raise
        results.update(self._recorded_results(config, plan.done, batch_id))
        self._probe("batch.committed", batch_id)
        self._record(config, job_id, batch_id, query, "done", plan.todo)
        self.last = BatchOutcome(
            batch_id=batch_id, query_id=query, job_id=job_id, skipped=False, results=results
        )

    # -- deciding -------------------------------------------------------------------

    def _plan(self, config: ProducerConfig, query: str, batch_id: int) -> BatchPlan:
        run = self._read_run(config)
        if run is not None and run.state == "done" and run.query == query and run.batch == batch_id - 1:
            # The fast path: the previous batch ended here, so no run of this one has started.
            return BatchPlan(todo=self.datasets, done={})
        if run is not None and run.state != "done":
            self._settle(config, run.job, run.datasets, run.batch)
        # Runs of this batch that staged files and were never settled (Redis lost their record).
        for job, names in self._dead_runs(config, batch_id).items():
            self._settle(config, job, names, batch_id)
        records = self._read_records(config)
        return plan_batch(self.app_id, query, batch_id, self.datasets, records)

    def _settle(self, config: ProducerConfig, job: str, datasets: Sequence[str], batch: int) -> None:
        """End a run whose driver died: cancel it at once and wait for the fleet's outcome of it.

        A dataset the fleet had begun to commit (``JobFinished`` was in) is
        committed all the same; the others are aborted and their staged files
        deleted. The store's records then say which.

        Raises:
            OutcomeTimeout: the fleet gave no outcome within ``config.wait_timeout``.
        """
        names = list(datasets)
        outcome = retry_sync(lambda: read_outcome(config, job, names), publisher_for(config).policy)
        if outcome.done:
            return
        open_ = [d for d in names if d not in outcome.results]
        log.warning(
            "commitfleet: run %s of batch %d (app %s) did not end: cancelling it", job, batch, self.app_id
        )
        publish(
            config,
            JobCancelled(
                job=job,
                datasets=open_,
                reason=f"superseded: batch {batch} of app {self.app_id} runs again (its driver died)",
                cancelled_at=time.time(),
            ),
        )
        try:
            poll = (STREAM_POLL_MIN_S, STREAM_POLL_MAX_S)
            wait_for_outcome(config, job, names, config.wait_timeout, poll=poll)
        except (JobNotCommitted, OutcomeForgotten):
            pass  # ended (aborted, or committed before the cancel): the store's records say which

    def _judge_refused(
        self, config: ProducerConfig, query: str, batch_id: int, exc: JobNotCommitted
    ) -> dict[str, DatasetResult]:
        """Return the results when every dataset that did not commit holds the batch anyway; else raise.

        Raises:
            StreamConflict: a record of another query covers the batch.
            JobNotCommitted: ``exc``, when a dataset really did not commit.
        """
        failed = sorted(exc.failed)
        records = self._read_records(config, failed)
        plan = plan_batch(self.app_id, query, batch_id, failed, records)
        if plan.todo:
            raise exc
        log.info(
            "commitfleet: batch %d of app %s: %s already held it (committed by an earlier run)",
            batch_id,
            self.app_id,
            ", ".join(failed),
        )
        results = {d: r for d, r in exc.results.items() if r.status == "committed"}
        results.update(self._recorded_results(config, plan.done, batch_id))
        return results

    def _skip(self, config: ProducerConfig, query: str, batch_id: int, plan: BatchPlan) -> None:
        jobs = sorted({r.job for r in plan.done.values()})
        log.info(
            "commitfleet: batch %d of app %s is already committed (job %s): skipped",
            batch_id,
            self.app_id,
            ", ".join(jobs),
        )
        results = self._recorded_results(config, plan.done, batch_id)
        self._probe("batch.skipped", batch_id)
        last = plan.done[self.datasets[0]]
        self._record(config, last.job, batch_id, query, "done", self.datasets)
        self.last = BatchOutcome(
            batch_id=batch_id, query_id=query, job_id=None, skipped=True, results=results
        )

    # -- reading and recording ------------------------------------------------------

    def _job_config(self, config: ProducerConfig) -> ProducerConfig:
        """The job's config: the executors' preflight (one Spark action) runs for the first batch only."""
        return msgspec.structs.replace(config, preflight=False) if self._checked else config

    def _config_resolved(self) -> ProducerConfig:
        if self._resolved is None:
            self._resolved = resolve_shards(self._config)
        return self._resolved

    def _read_run(self, config: ProducerConfig) -> StreamRun | None:
        pub = publisher_for(config)
        return retry_sync(
            lambda: read_stream_run_sync(pub.redis, Keys(config.fleet), self.app_id), pub.policy
        )

    def _record(
        self,
        config: ProducerConfig,
        job: str,
        batch: int,
        query: str,
        state: RunState,
        datasets: Sequence[str],
    ) -> None:
        pub = publisher_for(config)
        run = StreamRun(
            job=job, batch=batch, query=query, state=state, datasets=list(datasets), at=time.time()
        )
        retry_sync(lambda: write_stream_run_sync(pub.redis, Keys(config.fleet), self.app_id, run), pub.policy)

    def _record_quietly(
        self,
        config: ProducerConfig,
        job: str,
        batch: int,
        query: str,
        state: RunState,
        datasets: Sequence[str],
    ) -> None:
        try:
            self._record(config, job, batch, query, state, datasets)
        except CommitfleetError as exc:  # never hide the batch's own error; the next run settles it
            log.warning("commitfleet: could not record the failed run of app %s: %s", self.app_id, exc)

    def _dead_runs(self, config: ProducerConfig, batch_id: int) -> dict[str, list[str]]:
        """Return the runs of ``batch_id`` whose staged files are in the store (job -> datasets)."""
        runtime, store = _runtime_store(config)
        prefix = staging_jobs_prefix(stream_job_prefix(self.app_id, batch_id))

        async def listing() -> list[str]:
            return [info.key async for info in store.list(prefix)]

        return dead_runs(runtime.run(listing()), self.app_id, batch_id)

    def _read_records(
        self, config: ProducerConfig, datasets: Sequence[str] | None = None
    ) -> dict[str, StreamRecord]:
        """Return the app's record per dataset as the store holds it now (read in parallel)."""
        names = list(self.datasets if datasets is None else datasets)
        runtime, store = _runtime_store(config)

        async def read_all() -> dict[str, StreamRecord]:
            docs = await asyncio.gather(*(read_watermarks_doc(store, d) for d in names))
            return {
                d: doc.streams[self.app_id]
                for d, doc in zip(names, docs, strict=True)
                if doc is not None and self.app_id in doc.streams
            }

        return runtime.run(read_all())

    def _recorded_results(
        self, config: ProducerConfig, done: Mapping[str, StreamRecord], batch_id: int
    ) -> dict[str, DatasetResult]:
        """Return each dataset's result in ``done``, from the manifest of the job that committed it."""
        if not done:
            return {}
        runtime, store = _runtime_store(config)
        items = sorted(done.items())

        async def read_all() -> dict[str, DatasetResult]:
            async def manifest(d: str, job: str) -> Manifest | None:
                return await read_manifest(store, d, job) if job else None

            manifests = await asyncio.gather(*(manifest(d, r.job) for d, r in items))
            out: dict[str, DatasetResult] = {}
            for (d, r), m in zip(items, manifests, strict=True):
                out[d] = DatasetResult(
                    status="committed",
                    reason=f"batch {batch_id} committed by job {r.job} (recorded batch {r.batch})",
                    files=len(m.files) if m is not None else 0,
                    bytes=m.bytes if m is not None else 0,
                    manifest=manifest_key(d, r.job) if r.job else "",
                    at=r.at,
                )
            return out

        return runtime.run(read_all())


def _runtime_store(config: ProducerConfig) -> tuple[ExecutorRuntime, ObjectStore]:
    """Return this process's runtime and its open store of ``config`` (how the driver reads the store)."""
    runtime = process_runtime()
    return runtime, runtime.store(config.store_url, config.store)


def commit_batches(
    write: WriteFn,
    *,
    app_id: str,
    datasets: Iterable[str],
    config: ProducerConfig,
    probe: BatchProbe | None = None,
    tracer: Tracer = NO_TRACER,
) -> BatchCommitter:
    """Return the function to give ``DataStreamWriter.foreachBatch``: each micro-batch committed once.

    ``write(job, batch_df, batch_id)`` writes the batch's datasets through
    ``job.write_dataset(...)`` exactly as a batch job's body does
    (partitioning, watermarks, table binding). ``app_id`` names the stream
    for good (1-64 letters, digits, ``_.-``): keep it across restarts of the
    query; a query restarted without its checkpoint needs a new one (or
    ``commitfleet stream reset``). ``probe`` is FAULT INJECTION for tests.
    ``tracer`` records a ``commitfleet.batch`` span per micro-batch, the
    batch's job span under it (docs/tracing.md).

    Returns:
        A :class:`BatchCommitter`; see the module doc for what each call does.

    Raises:
        BadInput: bad ``app_id`` or dataset names.
    """
    return BatchCommitter(write, app_id=app_id, datasets=datasets, config=config, probe=probe, tracer=tracer)


__all__ = [
    "QUERY_ID_PROPERTY",
    "BatchCommitter",
    "BatchJob",
    "BatchOutcome",
    "BatchProbe",
    "StreamConflict",
    "commit_batches",
]
