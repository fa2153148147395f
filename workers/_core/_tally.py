"""How many of a waiting dataset's tasks are in, kept per (job, dataset).

A dataset whose job has finished (``waiting``) commits once every task of its
expectation has an attempt (or, with ``winners``, its winning attempt). Each
TaskFinished used to find that out by copying and scanning every task of the
dataset: for a job whose JobFinished came before its tasks' events, the n-th
event cost O(n), and a 16,000-task dataset took 4.7 s of its shard's time
(100,000 tasks: minutes). Now each event costs O(1): the number of tasks in
is counted once, then kept up to date as attempts are added.

A cache, never the truth: an entry is computed from the attempts (one scan)
the first time it is needed and kept exact by :meth:`TaskTally.added` for
every attempt added after (``ShardJobs.load_attempt`` calls it for each);
whatever else changes a job's attempts (its end, a change put back) drops the
job's entries with :meth:`TaskTally.forget`. A dataset is committed only after
a full check confirms the count (once per dataset).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.events import DatasetExpectation


def satisfies(exp: DatasetExpectation, task: int, attempt: int, before: Mapping[int, Any]) -> bool:
    """Return True when adding ``attempt`` to ``task`` (whose attempts were ``before``) brings one
    more of ``exp``'s tasks in: the task's first attempt, or with ``winners`` its winner."""
    if task >= exp.tasks:
        return False
    winners = exp.winners
    if winners is None:
        return not before
    return attempt == winners[task] and attempt not in before


def count_in(exp: DatasetExpectation, tasks: Mapping[int, Mapping[int, Any]]) -> int:
    """Return how many of ``exp``'s tasks are in ``tasks`` (task -> attempt -> record)."""
    winners = exp.winners
    if winners is None:
        return sum(1 for t, seen in tasks.items() if t < exp.tasks and seen)
    return sum(1 for t, seen in tasks.items() if t < exp.tasks and winners[t] in seen)


class TaskTally:
    """Tasks in per (job, dataset), each with the expectation it was counted against."""

    def __init__(self) -> None:
        # (job, dataset) -> (expectation, tasks in). Public for one reason: a caller on the
        # per-event path tests it for emptiness (``len()`` would be a Python call); read only.
        self.counts: dict[tuple[str, str], tuple[DatasetExpectation, int]] = {}
        # job -> its datasets with an entry: forget() touches the job's entries only (it runs at
        # every job end, and a shard can have many datasets waiting for a straggler task).
        self._datasets: dict[str, set[str]] = {}

    def count(
        self, job: str, dataset: str, exp: DatasetExpectation, tasks: Mapping[int, Mapping[int, Any]]
    ) -> int:
        """Return how many of ``exp``'s tasks are in ``tasks`` (the dataset's attempts), from the
        entry when it was counted against this very expectation, else by counting (then kept)."""
        key = (job, dataset)
        entry = self.counts.get(key)
        if entry is not None and entry[0] is exp:  # identity: comparing winners lists would cost a scan
            return entry[1]
        n = count_in(exp, tasks)
        if entry is None:
            self._datasets.setdefault(job, set()).add(dataset)
        self.counts[key] = (exp, n)
        return n

    def added(self, job: str, dataset: str, task: int, attempt: int, before: Mapping[int, Any]) -> None:
        """Note ``attempt`` added to ``task`` of ``dataset``, whose attempts were ``before``."""
        key = (job, dataset)
        entry = self.counts.get(key)
        if entry is not None and satisfies(entry[0], task, attempt, before):
            self.counts[key] = (entry[0], entry[1] + 1)

    def forget(self, job: str) -> None:
        """Drop every entry of ``job`` (its attempts changed other than by :meth:`added`)."""
        for dataset in self._datasets.pop(job, ()):
            del self.counts[(job, dataset)]


__all__ = ["TaskTally", "count_in", "satisfies"]
