"""Head starts: a step's preparation run ahead of its turn, while the steps before it run.

A step may do part of its work before its turn when that part changes
nothing anyone reads (:meth:`CommitStep.prepare`: the Iceberg step stages
its snapshot and writes files no table points at yet). The executor starts
every such preparation when a run begins, beside the publish phase, and the
step takes its result when its turn comes (:meth:`HeadStarts.take`), on
stores where that pays (:func:`worth_starting`). A
preparation that fails or is not ready is only time lost: the step then does
the whole of its work in turn, and meets the same failure there itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, ClassVar, Protocol

from .._aio import cancel_until_done
from .._errors import CommitfleetError


class Preparing(Protocol):
    """What a head start needs of a step (:class:`~._steps.CommitStep`, which imports this module)."""

    prepares: ClassVar[bool]

    async def prepare(self, ctx: Any) -> object | None: ...


def worth_starting(store_url: str, model_latency_ms: float) -> bool:
    """Return True when head starts pay on the store at ``store_url``: not local files, or modelled latency.

    A preparation pays where it waits on the store (its uploads overlap the
    publish phase's requests). On local files it is CPU, which competes with
    the publish phase for the interpreter's lock: measured there, a bound
    append took 1.63-1.72x the unbound commit with head starts and 1.52-1.63x
    without (docs/tables.md, "Cost").
    """
    return not store_url.startswith("file:") or model_latency_ms > 0


class HeadStarts:
    """The preparations of one run's steps, by step: their tasks' owner, which :meth:`close` ends."""

    def __init__(self) -> None:
        self._tasks: dict[int, asyncio.Task[object | None]] = {}

    def start(self, steps: Iterable[Preparing], ctx: Any) -> None:
        """Start the preparation of each of ``steps`` that ``prepares``, with the run's ``ctx``.

        Returns at once. The caller must :meth:`close` this object when the run ends.
        """
        for step in steps:
            if step.prepares:
                self._tasks[id(step)] = asyncio.create_task(_prepared(step, ctx))

    async def take(self, step: object) -> object | None:
        """Return ``step``'s preparation (waiting for it to end), once; None when it has none or failed.

        Raises: what the preparation raised when that is not a CommitfleetError (a bug).
        Cancelled: the preparation goes on; :meth:`close` ends it.
        """
        task = self._tasks.get(id(step))
        if task is None:
            return None
        result = await asyncio.shield(task)
        del self._tasks[id(step)]
        return result

    async def close(self) -> BaseException | None:
        """Cancel the preparations not taken (their steps did not run) and wait until they ended.

        Returns what one of them raised that is not a CommitfleetError (a bug),
        for the caller to raise when nothing else is propagating; else None.
        Safe to call twice. Cancelled itself: stops waiting (they were asked to stop).
        """
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            await cancel_until_done(task)
        for task in tasks:
            if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
                return exc
        return None


NO_HEAD_STARTS = HeadStarts()
"""A context's head starts outside a run: none started, so every :meth:`HeadStarts.take` gives None."""


async def _prepared(step: Preparing, ctx: Any) -> object | None:
    try:
        return await step.prepare(ctx)
    except CommitfleetError:
        return None  # the step meets the same cause in turn and handles it as its own


__all__ = ["NO_HEAD_STARTS", "HeadStarts", "Preparing", "worth_starting"]
