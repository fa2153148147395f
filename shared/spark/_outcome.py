"""The driver's side of job liveness and outcome: a heartbeat thread, and waiting for the fleet.

While a job is open its driver refreshes the job's liveness key on every
shard of the job (a daemon thread: the driver is synchronous PySpark code).
After ``JobFinished`` it reads the per-dataset result records the workers
write, until every dataset has one or its deadline passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from .._errors import CommitfleetError, OutcomeUnknown, TransientError
from ..queue import (
    DatasetResult,
    JobOutcome,
    Keys,
    beat_sync,
    describe_failures,
    heartbeat_interval,
    heartbeat_ttl,
    job_shards,
    read_outcome_sync,
)
from ._config import ProducerConfig
from ._publishing import publisher_for

log = logging.getLogger(__name__)

POLL_MIN_S = 0.05
POLL_MAX_S = 0.5
# A streaming batch's driver waits in short polls: the batch's latency is the
# query's. At 10 -> 50 ms the poll added 20-31 ms p50 (50 ms p99) to every batch
# (tests/bench/streaming_overhead.py); at 2 -> 5 ms, 3-4 ms, for at most 200
# pipelined reads a second of one driver while it waits.
STREAM_POLL_MIN_S = 0.002
STREAM_POLL_MAX_S = 0.005


class JobNotCommitted(CommitfleetError):
    """The fleet did not commit some datasets of the job: aborted, timed out, quarantined or blocked.

    ``failed`` maps each such dataset to its result (status and reason);
    ``results`` holds every dataset's result that is known.
    """

    def __init__(self, job: str, failed: dict[str, DatasetResult], results: dict[str, DatasetResult]):
        super().__init__(describe_failures(job, failed))
        self.job = job
        self.failed = failed
        self.results = results


class OutcomeTimeout(OutcomeUnknown):
    """The fleet gave no outcome for some datasets within the driver's deadline.

    The job may still commit: ``commitfleet wait JOB DATASET...`` keeps waiting.
    """

    def __init__(self, job: str, missing: Sequence[str], waited: float, results: dict[str, DatasetResult]):
        super().__init__(
            f"job {job}: no outcome from the fleet after {waited:.0f}s for datasets {list(missing)} "
            f"(it may still commit: `commitfleet wait {job} {' '.join(missing)}`)"
        )
        self.job = job
        self.missing = tuple(missing)
        self.results = results


class OutcomeForgotten(OutcomeUnknown):
    """The fleet ended the job, but some datasets' results are no longer kept (``queue.results_max``
    per shard, oldest first, or older than a day), so their outcome is unknown here.

    Raised at once, not after the wait's timeout: the answer will not come again.
    Each dataset's manifest (``<dataset>/_commits/<job>.json`` under the store root)
    says whether it committed; ``commitfleet audit`` checks the whole store.
    """

    def __init__(self, job: str, forgotten: Sequence[str], results: dict[str, DatasetResult]):
        super().__init__(
            f"job {job}: the fleet ended the job but no longer keeps the results of datasets "
            f"{list(forgotten)} (queue.results_max): their outcome is unknown here; each one's "
            f"manifest <dataset>/_commits/{job}.json exists if it committed"
        )
        self.job = job
        self.forgotten = tuple(forgotten)
        self.results = results


def read_outcome(config: ProducerConfig, job: str, datasets: Sequence[str]) -> JobOutcome:
    """Return what the fleet has decided so far about ``datasets`` of ``job`` (one round trip).

    Raises:
        TransientError: Redis unavailable.
        ConfigError: unresolved shard count, bad credentials.
    """
    pub = publisher_for(config)
    return read_outcome_sync(pub.redis, pub.keys, pub.shards, job, datasets)


def check_outcome(job: str, outcome: JobOutcome) -> dict[str, DatasetResult]:
    """Return the results when every dataset committed; raise otherwise (pure).

    Raises:
        JobNotCommitted: a dataset is aborted, quarantined or blocked.
        OutcomeForgotten: no dataset failed, but some results are no longer kept.
    """
    failed = outcome.failed
    if failed:
        raise JobNotCommitted(job, failed, dict(outcome.results))
    if outcome.forgotten:
        raise OutcomeForgotten(job, outcome.forgotten, dict(outcome.results))
    return dict(outcome.results)


def ended_first(
    job: str, datasets: Sequence[str], ended: JobOutcome
) -> tuple[list[str], str, JobNotCommitted]:
    """Decide what a driver does when the fleet ended part of its job before ``JobFinished`` (pure).

    Returns the datasets the fleet has not ended (they get ``JobFailed`` with
    the returned reason, so the job stays all-or-nothing) and the error to
    raise, naming every dataset.
    """
    rest = [d for d in datasets if d not in ended.results]
    why = "; ".join(f"{d}: {r.status} ({r.reason})" for d, r in sorted(ended.results.items()))
    reason = f"the fleet ended part of the job first: {why}"[:2000]
    failed = {
        d: DatasetResult(status="aborted", reason="the fleet ended part of the job first") for d in rest
    }
    failed.update(ended.results)
    return rest, reason, JobNotCommitted(job, failed, dict(ended.results))


def wait_for_outcome(
    config: ProducerConfig,
    job: str,
    datasets: Sequence[str],
    timeout: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll: tuple[float, float] = (POLL_MIN_S, POLL_MAX_S),
) -> dict[str, DatasetResult]:
    """Block until every dataset of ``job`` has a result; return them when all committed.

    Polls the result records (one pipelined round trip per poll, every
    ``poll[0]`` seconds growing to ``poll[1]``: 50 ms to 500 ms by default), so
    it returns at most about ``poll[1]`` after the last dataset's record is
    written. A Redis error is retried until the deadline.

    Returns:
        dataset -> result (files, bytes, manifest key), every one committed.

    Raises:
        JobNotCommitted: some dataset was aborted (failed, cancelled, timed
            out, skipped), quarantined or blocked; raised as soon as every
            dataset has an answer.
        OutcomeForgotten: the fleet ended the job but no longer keeps some
            datasets' results (none failed); raised at once, never waited out.
        OutcomeTimeout: ``timeout`` passed with datasets still unanswered.
    """
    start = clock()
    delay, delay_max = poll
    outcome: JobOutcome | None = None
    while True:
        try:
            outcome = read_outcome(config, job, datasets)
        except TransientError as exc:
            log.warning("could not read job results, retrying: %s", exc)
        if outcome is not None and outcome.done:
            return check_outcome(job, outcome)
        waited = clock() - start
        if waited >= timeout:
            missing = list(outcome.missing) if outcome is not None else list(datasets)
            known = dict(outcome.results) if outcome is not None else {}
            raise OutcomeTimeout(job, missing, waited, known)
        sleep(min(delay, max(0.0, timeout - waited)))
        delay = min(delay * 1.5, delay_max)


class Heartbeat:
    """A daemon thread that keeps a job alive in the fleet while the driver runs it.

    Every :func:`~shared.queue.heartbeat_interval` seconds it refreshes the
    job's liveness key on each of the job's shards (one pipelined ``SET ...
    PX`` round trip). With ``on_beat`` it also reads the job's result
    records and calls ``on_beat(outcome)`` after every successful beat, so
    the driver can see the fleet end the job while it runs (timed out while
    the driver could not reach Redis, say) and stop the Spark job instead of
    computing output nobody will commit. Redis errors are logged and retried
    at the next beat; the thread never raises.
    """

    def __init__(
        self,
        config: ProducerConfig,
        job: str,
        datasets: Sequence[str],
        *,
        on_beat: Callable[[JobOutcome], None] | None = None,
    ) -> None:
        if config.shards is None:
            raise ValueError("the shard count must be resolved before the heartbeat starts")
        self._config = config
        self._job = job
        self._datasets = tuple(datasets)
        self._shards = job_shards(datasets, config.shards)
        self._keys = Keys(config.fleet)
        self.interval = heartbeat_interval(config.job_timeout)
        self.ttl = heartbeat_ttl(config.job_timeout)
        self._on_beat = on_beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"commitfleet-heartbeat-{job}", daemon=True)
        self.beats = 0
        self.failures = 0

    def start(self) -> None:
        """Beat once now (so the key exists before the first task), then every interval in the thread.

        Returns even when the first beat fails (logged; the thread retries).
        """
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and wait for the thread (at most one Redis round trip). Idempotent.

        The liveness keys are left to expire: the job's end event says the rest.
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._beat()

    def _beat(self) -> None:
        pub = publisher_for(self._config)
        try:
            beat_sync(pub.redis, self._keys, self._shards, self._job, self.ttl, time.time())
            self.beats += 1
            if self._on_beat is not None:
                outcome = read_outcome_sync(pub.redis, self._keys, pub.shards, self._job, self._datasets)
                self._call(self._on_beat, outcome)
        except CommitfleetError as exc:
            self.failures += 1
            log.warning("commitfleet heartbeat of job %s failed (retrying): %s", self._job, exc)

    def _call(self, callback: Callable[[JobOutcome], None], outcome: JobOutcome) -> None:
        try:
            callback(outcome)
        except Exception:  # a thread has nobody to raise to: say it loudly, keep beating
            log.exception("commitfleet: the heartbeat's callback for job %s failed", self._job)


__all__ = [
    "STREAM_POLL_MAX_S",
    "STREAM_POLL_MIN_S",
    "Heartbeat",
    "JobNotCommitted",
    "OutcomeTimeout",
    "check_outcome",
    "ended_first",
    "read_outcome",
    "wait_for_outcome",
]
