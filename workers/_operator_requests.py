"""Operator requests on a shard: an operator's ``retry`` or ``skip`` of a quarantined sequence.

``commitfleet retry`` / ``skip`` (or the console) leave a request in the
shard's ``operator`` hash; the shard's owner reads them on every tick
(:meth:`OperatorRequestsMixin._operator_requests`) and schedules each as an
:class:`Operate`, which :meth:`OperatorRequestsMixin._operate` carries out:
it verifies the request (refused once and dropped when forged, replayed or
unsigned while signing is on), runs it under the dataset's storage lock,
announces the outcome (``operator_action``) and drops the request.

Mixed into :class:`workers._shard.ShardRunner`, which takes the commit side
(:class:`workers._actions.ActionsMixin`) from its other bases.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

import msgspec

from shared import BadInput, NotFound
from shared._logging import kv
from shared.commit import CommitResult, CommitStepFailed, retry_quarantined, skip_quarantined
from shared.events import InvalidMessage, OperatorAction, verify_operator_request
from shared.locks import HeldLease
from shared.queue import as_text, redis_errors

from ._announce import announce_aborted, announce_from_manifest
from ._context import WorkerContext
from ._housekeeping import note_quarantine
from ._jobstate import Commit, ShardJobs, Status

log = logging.getLogger("workers.shard")


class Operate(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's ``retry`` or ``skip`` of a quarantined sequence (``op`` as requested)."""

    dataset: str
    job: str
    op: str


class OperatorRequestsMixin:
    """The operator-request part of a shard runner."""

    ctx: WorkerContext
    shard: int
    state: ShardJobs

    if TYPE_CHECKING:
        # Provided by ActionsMixin (declared for type checking only, so that no placeholder
        # here can hide the real methods, whatever the order of ShardRunner's bases).
        async def _locked(self, dataset: str, body: Callable[[HeldLease], Awaitable[None]]) -> None: ...

        async def _commit(self, work: Commit) -> None: ...

        async def _after_commit(self, result: CommitResult, epoch: int) -> None: ...

        async def _set_status(self, job: str, dataset: str, status: Status, reason: str = "") -> None: ...

    async def _operator_requests(self) -> list[Operate]:
        key = self.ctx.keys.shard_state(self.shard, "operator")
        with redis_errors("read operator requests"):
            raw = await self.ctx.redis.hgetall(key)
        out: list[Operate] = []
        for field, op in raw.items():
            dataset, _, job = as_text(field).partition("/")
            out.append(Operate(dataset=dataset, job=job, op=as_text(op)))
        return out

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

    async def _operate(self, work: Operate) -> None:
        ctx = self.ctx
        key = ctx.keys.shard_state(self.shard, "operator")
        try:
            op = verify_operator_request(work.op, ctx.limits.signing, dataset=work.dataset, job=work.job)
        except InvalidMessage as exc:
            # A forged, replayed or unsigned request: refuse it (once) and drop it.
            await self._refuse(
                work, "skip" if work.op.startswith("skip") else "retry", f"{exc.reason}: {exc.detail}"
            )
            with redis_errors("HDEL operator request"):
                await ctx.redis.hdel(key, f"{work.dataset}/{work.job}")
            return
        work = msgspec.structs.replace(work, op=op)

        async def body(lease: HeldLease) -> None:
            action: Literal["retry", "skip"]
            if work.op == "retry":
                action = "retry"
                result = await retry_quarantined(ctx.store, work.dataset, work.job, lease, ctx.settings)
                await self._after_commit(result, lease.epoch)
                if result.status != "quarantined":
                    await note_quarantine(ctx, self.shard, work.dataset, work.job, None)
            else:
                action = "skip"
                skipped = await skip_quarantined(ctx.store, work.dataset, work.job, lease, ctx.settings)
                if skipped.outcome == "forgotten":
                    # The manifest was there: the commit is complete, only its log was dropped.
                    await announce_from_manifest(self.ctx, work.dataset, work.job, lease.epoch)
                    await self._set_status(work.job, work.dataset, "committed")
                else:
                    deleted = skipped.published_deleted + skipped.staged_deleted
                    await announce_aborted(self.ctx, work.dataset, work.job, "skipped by operator", deleted)
                    await self._set_status(work.job, work.dataset, "aborted", "skipped by operator")
                await note_quarantine(ctx, self.shard, work.dataset, work.job, None)
            await ctx.emit(
                OperatorAction(
                    at=time.time(), worker=ctx.worker_id, dataset=work.dataset, job=work.job, action=action
                )
            )

        if work.op in ("retry", "skip"):
            try:
                await self._locked(work.dataset, body)
            except (BadInput, NotFound, CommitStepFailed) as exc:
                # The request cannot apply (and never will): say so once, drop it.
                await self._refuse(work, "retry" if work.op == "retry" else "skip", str(exc))
        else:
            log.error("unknown operator request", extra=kv(op=work.op, dataset=work.dataset))
        with redis_errors("HDEL operator request"):
            await ctx.redis.hdel(key, f"{work.dataset}/{work.job}")
        # A dataset blocked behind the quarantined sequence can go on now (in
        # this task: it already holds an in-flight slot and the dataset's turn).
        for meta in list(self.state.jobs.values()):
            ds = meta.datasets.get(work.dataset)
            if ds is not None and ds.status == "blocked":
                await self._commit(Commit(job=meta.job, dataset=work.dataset))


__all__ = ["Operate", "OperatorRequestsMixin"]
