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

from .._errors import BadInput, ConfigError
from ..events import DatasetExpectation, StagedFile

_CANCELLED_RE: Final = re.compile(r"\bcancell?ed\b", re.IGNORECASE)
_STAGED_PATH_RE: Final = re.compile(r"_staging/[^\s:]+")


class TaskResult(msgspec.Struct, frozen=True, array_like=True):
    """What one task attempt returns to the driver through the action.

    ``files`` are relative to the attempt's staging folder. ``error`` is set
    (with ``error_kind`` ``"config"`` or ``"bad_input"``) when the attempt hit
    an error no retry can fix: it returned it instead of raising, so that
    Spark does not run the task again, and published nothing.
    """

    task: int
    attempt: int
    files: list[StagedFile]
    error: str = ""
    error_kind: str = ""


def hopeless_kind(exc: BaseException) -> str:
    """Return ``"config"`` or ``"bad_input"`` for an error no retry can fix, else ``""`` (pure)."""
    if isinstance(exc, ConfigError):
        return "config"
    if isinstance(exc, BadInput):
        return "bad_input"
    return ""


def raise_task_errors(dataset: str, results: Iterable[TaskResult]) -> None:
    """Raise one error for every task attempt that returned a hopeless error; return if none did.

    The message has one line per distinct error, with the tasks that hit it.

    Raises:
        ConfigError: at least one attempt reported a configuration error.
        BadInput: otherwise, at least one attempt reported bad input.
    """
    # Errors that differ only in the staged file they name are one error.
    by_message: dict[str, tuple[str, list[int]]] = {}
    kinds: set[str] = set()
    for r in results:
        if r.error:
            key = _STAGED_PATH_RE.sub("_staging/*", r.error)
            by_message.setdefault(key, (r.error, []))[1].append(r.task)
            kinds.add(r.error_kind)
    if not by_message:
        return
    lines = [
        f"  tasks {','.join(map(str, sorted(tasks)[:10]))}{'...' if len(tasks) > 10 else ''}: {example}"
        for example, tasks in sorted(by_message.values(), key=lambda v: min(v[1]))
    ]
    text = f"dataset {dataset}: executors reported errors no retry can fix:\n" + "\n".join(lines)
    raise ConfigError(text) if "config" in kinds else BadInput(text)


def expectation_from_results(dataset: str, results: Iterable[TaskResult]) -> DatasetExpectation:
    """Return the dataset's expectation: task count and the winning attempt of each task.

    Raises:
        ConfigError / BadInput: an attempt reported an error no retry can fix
            (:func:`raise_task_errors`).
        BadInput: the results do not hold exactly one attempt for each of the
            task indexes ``0..n-1`` (Spark broke its one-result-per-partition
            promise, or the action was not the writer's).
    """
    results = list(results)
    raise_task_errors(dataset, results)
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


__all__ = ["TaskResult", "expectation_from_results", "hopeless_kind", "looks_cancelled", "raise_task_errors"]
