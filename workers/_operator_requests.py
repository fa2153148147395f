"""Operator requests on a shard: an operator's ``retry`` or ``skip`` of a quarantined sequence.

``commitfleet retry`` / ``skip`` (or the console) leave a request in the
shard's ``operator`` hash; the shard's owner reads them on every tick
(:meth:`OperatorRequests.pending`) and schedules each as an
:class:`~workers._core.Operate`, which :meth:`OperatorRequests.operate` carries out:
it verifies the request (refused once and dropped when forged, replayed or
unsigned while signing is on), runs it under the dataset's storage lock,
announces the outcome (``operator_action``) and drops the request.

An :class:`OperatorRequests` is given the commit side it runs the request
with (:class:`CommitSide`: the shard's :class:`workers._actions.Actions`) and
the shard's ledger, where the new status is recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

import msgspec

from shared import BadInput, NotFound, kv
from shared.commit import CommitResult, CommitStepFailed, retry_quarantined, skip_quarantined
from shared.events import InvalidMessage, OperatorAction, verify_operator_request
from shared.locks import HeldLease
from shared.queue import drop_operator_request, read_operator_requests

from ._announce import announce_aborted, announce_from_manifest
from ._context import WorkerContext
from ._core import Commit, Operate
from ._housekeeping import note_quarantine
from ._ledger import ShardLedger

log = logging.getLogger("workers.shard")


class CommitSide(Protocol):
    """What an operator request needs of the shard's actions (:class:`workers._actions.Actions`)."""

    async def locked(self, dataset: str, body: Callable[[HeldLease], Awaitable[None]]) -> None:
        """Run ``body`` under ``dataset``'s storage lock."""

    async def commit(self, work: Commit) -> None:
        """Commit ``work``'s dataset (from the job state, else from the store)."""

    async def after_commit(self, result: CommitResult, epoch: int) -> None:
        """Announce ``result`` and record the dataset's new status."""


class OperatorRequests:
    """Reads a shard's operator requests and carries each out (see the module doc)."""

    def __init__(self, ctx: WorkerContext, shard: int, ledger: ShardLedger, actions: CommitSide) -> None:
        self.ctx = ctx
        self.shard = shard
        self._ledger = ledger
        self._actions = actions

    async def pending(self) -> list[Operate]:
        """Return the shard's operator requests, as left in its ``operator`` hash.

        Raises:
            TransientError: Redis unavailable.
        """
        requests = await read_operator_requests(self.ctx.redis, self.ctx.keys, self.shard)
        return [Operate(dataset=r.dataset, job=r.job, op=r.op) for r in requests]

    async def _refuse(self, work: Operate, action: Literal["retry", "skip"], why: str) -> None:
        """Log and announce (``operator_action`` outcome ``refused``) a request that will never apply.

        Raises:
            TransientError: the event could not be published (the request stays, tried again).
        """
        log.warning(
            "operator request refused", extra=kv(op=work.op, dataset=work.dataset, job=work.job, reason=why)
        )
        await self.ctx.emit(
            OperatorAction(
                at=time.time(),
                worker=self.ctx.worker_id,
                dataset=work.dataset,
                job=work.job,
                action=action,
                outcome="refused",
                detail=why[:500],
            )
        )

    async def operate(self, work: Operate) -> None:
        """Verify ``work`` and carry it out under its dataset's lock; announce it and drop the request.

        Raises:
            Fenced, TransientError, LockTimeout, LockLost: the request stays, tried again.
        """
        ctx = self.ctx
        try:
            op = verify_operator_request(work.op, ctx.limits.signing, dataset=work.dataset, job=work.job)
        except InvalidMessage as exc:
            # A forged, replayed or unsigned request: refuse it (once) and drop it.
            await self._refuse(
                work, "skip" if work.op.startswith("skip") else "retry", f"{exc.reason}: {exc.detail}"
            )
            await drop_operator_request(ctx.redis, ctx.keys, self.shard, work.dataset, work.job)
            return
        work = msgspec.structs.replace(work, op=op)

        async def body(lease: HeldLease) -> None:
            action: Literal["retry", "skip"]
            if work.op == "retry":
                action = "retry"
                result = await retry_quarantined(ctx.store, work.dataset, work.job, lease, ctx.settings)
                await self._actions.after_commit(result, lease.epoch)
                if result.status != "quarantined":
                    await note_quarantine(ctx, self.shard, work.dataset, work.job, None)
            else:
                action = "skip"
                skipped = await skip_quarantined(ctx.store, work.dataset, work.job, lease, ctx.settings)
                if skipped.outcome == "forgotten":
                    # The manifest was there: the commit is complete, only its log was dropped.
                    await announce_from_manifest(self.ctx, work.dataset, work.job, lease.epoch)
                    await self._ledger.set_status(work.job, work.dataset, "committed")
                else:
                    deleted = skipped.published_deleted + skipped.staged_deleted
                    await announce_aborted(self.ctx, work.dataset, work.job, "skipped by operator", deleted)
                    await self._ledger.set_status(work.job, work.dataset, "aborted", "skipped by operator")
                await note_quarantine(ctx, self.shard, work.dataset, work.job, None)
            await ctx.emit(
                OperatorAction(
                    at=time.time(), worker=ctx.worker_id, dataset=work.dataset, job=work.job, action=action
                )
            )

        if work.op in ("retry", "skip"):
            try:
                await self._actions.locked(work.dataset, body)
            except (BadInput, NotFound, CommitStepFailed) as exc:
                # The request cannot apply (and never will): say so once, drop it.
                await self._refuse(work, "retry" if work.op == "retry" else "skip", str(exc))
        else:
            log.error("unknown operator request", extra=kv(op=work.op, dataset=work.dataset))
        await drop_operator_request(ctx.redis, ctx.keys, self.shard, work.dataset, work.job)
        # A dataset blocked behind the quarantined sequence can go on now (in
        # this task: it already holds an in-flight slot and the dataset's turn).
        # In the order the jobs finished (a blocked commit holds its dataset's line: see ShardJobs.lines).
        blocked = []
        for meta in self._ledger.state.jobs.values():
            ds = meta.datasets.get(work.dataset)
            if ds is not None and ds.status == "blocked":
                blocked.append((ds.fin, meta.job))
        for _fin, job in sorted(blocked):
            await self._actions.commit(Commit(job=job, dataset=work.dataset))


__all__ = ["CommitSide", "OperatorRequests"]
