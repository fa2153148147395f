"""The end of a job on the driver: ``JobFinished`` (unless the fleet ended the job first), waiting
for the outcome, and the heartbeat's reaction to a job the fleet ended while it ran.

A part of :class:`shared.spark._job.JobContext`, given what it needs in its constructor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from ..events import DatasetExpectation, JobFailed, JobFinished, QueueEvent
from ..queue import DatasetResult, JobOutcome, retry_sync
from ._config import ProducerConfig
from ._outcome import POLL_MAX_S, POLL_MIN_S, ended_first, read_outcome, wait_for_outcome
from ._publishing import publisher_for

log = logging.getLogger("shared.spark._job")


class JobEnd:
    """How one job ends on the driver; owns the job's outcome and whether the body is over.

    Thread safety: :meth:`on_beat` runs in the heartbeat's thread, the rest in
    the thread inside ``commit_job``.
    """

    def __init__(
        self,
        config: ProducerConfig,
        job_id: str,
        datasets: tuple[str, ...],
        *,
        publish: Callable[[QueueEvent], None],
        cancel: Callable[[str], None],
        cancel_reason: Callable[[], str | None],
    ) -> None:
        """``publish`` sends one event of the job; ``cancel(reason)`` cancels the job (idempotent,
        the first reason kept; it cancels the job's Spark group on every call); ``cancel_reason()``
        says why the job was cancelled, or None."""
        self._config = config
        self._job_id = job_id
        self._datasets = datasets
        self._publish = publish
        self._cancel = cancel
        self._cancel_reason = cancel_reason
        self._lock = threading.Lock()
        self._results: dict[str, DatasetResult] = {}
        self._finishing = False  # the body is over: the heartbeat no longer cancels

    @property
    def results(self) -> dict[str, DatasetResult]:
        """The fleet's outcome per dataset once :meth:`wait` has returned (else empty; a copy)."""
        with self._lock:
            return dict(self._results)

    def publish_finished(self, expectations: Mapping[str, DatasetExpectation]) -> None:
        """Publish ``JobFinished`` with ``expectations``, unless the fleet has already ended part of the job.

        Raises:
            JobNotCommitted: the fleet ended some datasets first (timed out
                while the driver was silent, say); the others get ``JobFailed``
                so the job stays all-or-nothing, and nothing is published as
                finished.
            TransientError: Redis kept failing.
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
                datasets={d: expectations[d] for d in self._datasets},
                finished_at=time.time(),
            )
        )

    def _fail_rest(self, ended: JobOutcome) -> None:
        rest, reason, error = ended_first(self._job_id, self._datasets, ended)
        if rest:
            self._publish(JobFailed(job=self._job_id, datasets=rest, reason=reason, failed_at=time.time()))
        raise error

    def stop_cancelling(self) -> None:
        """Mark the body over: from now on the heartbeat cancels nothing."""
        with self._lock:
            self._finishing = True

    def wait(self, timeout: float, poll: tuple[float, float] = (POLL_MIN_S, POLL_MAX_S)) -> None:
        """Wait up to ``timeout`` seconds for the fleet's outcome of each dataset; keep it as :attr:`results`.

        Raises:
            JobNotCommitted, OutcomeTimeout, OutcomeForgotten: see
                :func:`~._outcome.wait_for_outcome`.
        """
        results = wait_for_outcome(self._config, self._job_id, self._datasets, timeout, poll=poll)
        with self._lock:
            self._results = results

    def on_beat(self, outcome: JobOutcome) -> None:
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
        reason = self._cancel_reason()
        if reason is None and outcome.results:
            why = ", ".join(f"{d}: {r.status} ({r.reason})" for d, r in sorted(outcome.results.items()))
            log.error("the fleet ended job %s while it ran (%s): cancelling it", self._job_id, why)
            self._cancel(f"the fleet ended the job while it ran: {why}")
        elif reason is not None:
            self._cancel(reason)  # the first reason is kept; the group is cancelled again


__all__ = ["JobEnd"]
