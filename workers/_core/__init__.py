"""The worker's pure core: what a shard's owner decides, and the state it decides from.

No module here does I/O, imports asyncio, redis or the store, or reads a clock:
where a decision needs "now" it is passed in (``tests/unit/test_worker_core_pure.py``
keeps it so). The runner's parts (``workers._intake``, ``workers._scheduler``,
``workers._actions``) carry the decisions out.

- :mod:`._work`: every kind of work (commit, abort, clean-up, recovery, operator request), its key.
- :mod:`._jobstate`: the job records and the shard's in-memory state (:class:`ShardJobs`).
- :mod:`._decide`: one queue event -> a :class:`Decision`.
- :mod:`._tally`: how many of a dataset's tasks are in, kept exact incrementally.
- :mod:`._work_queue`: the order work runs in (turns across jobs, one at a time per dataset).
- :mod:`._liveness`: which jobs timed out, from when their drivers were last seen.
- :mod:`._health`: the health endpoint's verdicts (``/livez``, ``/readyz``, ``/startupz``).
"""

from __future__ import annotations

from ._decide import all_tasks_in, decide
from ._health import LAG_WINDOW_S, HealthMarks, Limits, Verdict, livez, readyz, startupz
from ._jobstate import (
    COMMIT_OWNED,
    PASSED,
    READS,
    STATE_VERSION,
    STATUSES,
    TERMINAL,
    Attempt,
    DatasetState,
    Decision,
    Ended,
    JobMeta,
    ShardJobs,
    Status,
    attempt_field,
    dataset_field,
)
from ._liveness import TimedOut, assume_alive, live_jobs, observe, timed_out
from ._tally import TaskTally, count_in, satisfies
from ._work import Abort, Action, CleanupAttempt, Commit, Operate, QueuedWork, Recover, Work, work_key
from ._work_queue import Queued, WorkQueue

__all__ = [
    "COMMIT_OWNED",
    "LAG_WINDOW_S",
    "PASSED",
    "READS",
    "STATE_VERSION",
    "STATUSES",
    "TERMINAL",
    "Abort",
    "Action",
    "Attempt",
    "CleanupAttempt",
    "Commit",
    "DatasetState",
    "HealthMarks",
    "Limits",
    "Decision",
    "Ended",
    "JobMeta",
    "Operate",
    "Queued",
    "QueuedWork",
    "Recover",
    "ShardJobs",
    "Status",
    "TaskTally",
    "TimedOut",
    "Verdict",
    "Work",
    "WorkQueue",
    "all_tasks_in",
    "assume_alive",
    "attempt_field",
    "count_in",
    "dataset_field",
    "decide",
    "live_jobs",
    "livez",
    "observe",
    "readyz",
    "satisfies",
    "startupz",
    "timed_out",
    "work_key",
]
