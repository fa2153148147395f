"""The end of a job on the driver: ``JobFinished`` (unless the fleet ended the job first), waiting
for the outcome, and the heartbeat's reaction to a job the fleet ended while it ran.

Mixed into :class:`shared.spark._job.JobContext`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..events import DatasetExpectation, JobFailed, JobFinished, QueueEvent
from ..queue import DatasetResult, JobOutcome
from ..queue._publisher import retry_sync
from ._config import ProducerConfig
from ._outcome import ended_first, read_outcome, wait_for_outcome
from ._publishing import publisher_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("shared.spark._job")


class FinishMixin:
    """How a job context ends; the context owns the attributes below."""

    _spark: SparkSession
    _job_id: str
    _datasets: tuple[str, ...]
    _config: ProducerConfig
    _lock: threading.Lock
    _cancel_reason: str | None
    _results: dict[str, DatasetResult]
    _finishing: bool

    @property
    def expectations(self) -> dict[str, DatasetExpectation]:
        raise NotImplementedError

    @property
    def cancel_reason(self) -> str | None:
        raise NotImplementedError

    def cancel(self, reason: str = "cancelled") -> None:
        raise NotImplementedError

    def _publish(self, ev: QueueEvent) -> None:
        raise NotImplementedError

    def _publish_finished(self) -> None:
        """Publish ``JobFinished``, unless the fleet has already ended part of the job.

        Raises:
            JobNotCommitted: the fleet ended some datasets first (timed out
                while the driver was silent, say); the others get ``JobFailed``
                so the job stays all-or-nothing, and nothing is published as
                finished.
        """
        # Retried like a publish: a Redis blip here must not fail a job that ran well.
        ended = retry_sync(
            lambda: read_outcome(self._config, self._job_id, self._datasets),
            publisher_for(self._config).policy,
        )
        if ended.results or ended.forgotten:
            self._fail_rest(ended)
        self._publish(
            JobFinished(
                job=self._job_id,
                datasets={d: self.expectations[d] for d in self._datasets},
                finished_at=time.time(),
            )
        )

    def _fail_rest(self, ended: JobOutcome) -> None:
        rest, reason, error = ended_first(self._job_id, self._datasets, ended)
        if rest:
            self._publish(JobFailed(job=self._job_id, datasets=rest, reason=reason, failed_at=time.time()))
        raise error

    def _stop_cancelling(self) -> None:
        with self._lock:
            self._finishing = True

    def _wait(self, timeout: float) -> None:
        results = wait_for_outcome(self._config, self._job_id, self._datasets, timeout)
        with self._lock:
            self._results = results

    def _on_beat(self, outcome: JobOutcome) -> None:
        """Heartbeat callback (its thread): stop the Spark work of a job that is over.

        While the body runs, a result means the fleet ended part of the job:
        cancel it. A cancelled job's group is cancelled again on every beat,
        because ``cancelJobGroup`` only reaches actions already submitted: an
        action that started just after a cancel is stopped at the next beat.
        After the body (``JobFinished`` on its way, results expected) nothing
        is done.
        """
        with self._lock:
            if self._finishing:
                return
            first = self._cancel_reason is None and bool(outcome.results)
        if first:
            why = ", ".join(f"{d}: {r.status} ({r.reason})" for d, r in sorted(outcome.results.items()))
            log.error("the fleet ended job %s while it ran (%s): cancelling it", self._job_id, why)
            self.cancel(f"the fleet ended the job while it ran: {why}")
        elif self.cancel_reason is not None:
            self._spark.sparkContext.cancelJobGroup(self._job_id)


__all__ = ["FinishMixin"]
