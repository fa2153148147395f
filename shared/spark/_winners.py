"""Driver-side decisions about a finished Spark action (pure).

Spark accepts exactly one result per partition: the result of the attempt it
counted. The writer's action returns, per task, ``(task, attempt, files)``,
so what the action returns *is* the list of winning attempts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

import msgspec

from .._errors import BadInput
from ..events import DatasetExpectation, StagedFile

_CANCELLED_RE: Final = re.compile(r"\bcancell?ed\b", re.IGNORECASE)


class TaskResult(msgspec.Struct, frozen=True, array_like=True):
    """What one task attempt returns to the driver through the action.

    ``files`` are relative to the attempt's staging folder.
    """

    task: int
    attempt: int
    files: list[StagedFile]


def expectation_from_results(dataset: str, results: Iterable[TaskResult]) -> DatasetExpectation:
    """Return the dataset's expectation: task count and the winning attempt of each task.

    Raises:
        BadInput: the results do not hold exactly one attempt for each of the
            task indexes ``0..n-1`` (Spark broke its one-result-per-partition
            promise, or the action was not the writer's).
    """
    by_task: dict[int, int] = {}
    for r in results:
        if r.task in by_task:
            raise BadInput(f"dataset {dataset}: two results for task {r.task}")
        by_task[r.task] = r.attempt
    n = len(by_task)
    if set(by_task) != set(range(n)):
        missing = sorted(set(range(n)) - set(by_task))[:5]
        raise BadInput(f"dataset {dataset}: task indexes are not 0..{n - 1} (missing e.g. {missing})")
    return DatasetExpectation(tasks=n, winners=[by_task[i] for i in range(n)])


def looks_cancelled(error_text: str) -> bool:
    """Return True when a Spark error's text says the job was cancelled.

    Failed and cancelled jobs raise the same exception types; only the text
    ("Job 3 cancelled part of cancelled job group ...") tells them apart.
    """
    return _CANCELLED_RE.search(error_text) is not None


__all__ = ["TaskResult", "expectation_from_results", "looks_cancelled"]
