"""One shard, run by its owner: intake, job state, commits, aborts, recovery.

A :class:`ShardRunner` runs while the worker owns the shard. Its life:

1. Session start: read the shard's owner token (must name us), load the
   shard's job state from Redis, take over the pending entries of every
   other consumer of the shard's group (the two-step handoff guarantees they
   stopped: they confirmed, or their lease expired), re-schedule the commits
   and aborts that were under way, and recover every unfinished commit
   sequence in ``_wal/`` of the shard's datasets.
2. Intake: our own pending entries first, then new ones, in batches. Each
   entry is decoded and validated (a bad one goes to the dead-letter stream
   with its reason, and never stops the shard), folded into the job state
   (``_core.decide``) and made durable together with its
   acknowledgement (``ShardStateStore.save``). Only then do its actions run.
3. Actions (commit / abort / clean up a late attempt) are queued and run as
   tasks owned by the runner, bounded by the worker-wide in-flight semaphore,
   in turn across jobs and one at a time per dataset, each under the dataset's
   storage lock (:mod:`._scheduler`). Intake reads on while work is queued,
   and pauses while the queue holds ``worker.max_queued_work`` pieces
   (back-pressure, not unbounded memory).
4. Stop (shard taken away or worker draining): intake stops, queued and
   in-flight actions get ``drain_grace`` seconds to finish, then what runs is
   cancelled (their locks are released on the way out; an interrupted commit
   stays in the WAL for the next owner to recover) and what is queued is left.

A transient Redis error restarts the session (state reloaded, pending
re-read); losing the owner token (:class:`~shared.Fenced`) ends the runner.

The runner is composed of parts that each own their state and are given
what they need when it builds them:

- the ledger (:mod:`._ledger`): the job state, the session's state store, the save lock;
- the scheduler (:mod:`._scheduler`): the work queue, the work queued or
  running, the tasks; it runs each piece through :meth:`ShardRunner._do`;
- the intake (:mod:`._intake`): judges and saves what the consumer reads,
  then hands the actions to the scheduler;
- the actions (:mod:`._actions`): commit, abort, recover, clean up;
- the operator requests (:mod:`._operator_requests`), run with the actions.

This module holds the runner's life (sessions, drain) and its tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from shared import (
    CommitfleetError,
    Fenced,
    TransientError,
    cancel_until_done,
    kv,
)
from shared.commit import (
    list_unfinished,
)
from shared.events import (
    JobTimedOut,
)
from shared.fleet import ReportingTaskGroup
from shared.queue import Entry, ShardConsumer, redis_errors, shard_of
from shared.tracing import TraceCarrier

from ._actions import Actions
from ._aside import load_or_set_aside
from ._context import WorkerContext
from ._core import (
    Operate,
    Recover,
    TimedOut,
    Work,
    all_tasks_in,
    assume_alive,
    live_jobs,
    observe,
    timed_out,
)
from ._housekeeping import record_quarantined, trim_shard
from ._inflight import InFlightBoard, work_label
from ._intake import Intake
from ._ledger import ShardLedger
from ._operator_requests import OperatorRequests
from ._scheduler import Scheduler
from ._state_store import Batch, ShardStateStore

log = logging.getLogger("workers.shard")

# How often the runner looks at timeouts, operator requests and retention.
TICK_S = 1.0
# How long the board's last write after a drain may take (Redis slow or down) before the runner ends anyway.
BOARD_FLUSH_TIMEOUT_S = 2.0


class ShardRunner:
    """Runs one shard for as long as the worker owns it (see the module doc)."""

    def __init__(self, ctx: WorkerContext, shard: int) -> None:
        self.ctx = ctx
        self.shard = shard
        self.stopping = asyncio.Event()
        self._last_tick = 0.0
        self._last_trim = 0.0
        self._stop_asked: float | None = None  # time.monotonic() of the first request_stop
        self._seen: dict[str, float] = {}  # job -> when its liveness key was last seen
        self.board = InFlightBoard(ctx.redis, ctx.keys, shard)
        # Dead letters keep any entry that was not oversized whole (docs/queue.md).
        self._consumer = ShardConsumer(
            ctx.redis,
            ctx.keys,
            shard,
            consumer=ctx.worker_id,
            max_copy_bytes=ctx.settings.security.max_message_bytes,
        )
        self.scheduler = Scheduler(
            do=self._do,
            inflight=ctx.inflight,
            max_queued=ctx.settings.worker.max_queued_work,
            worker_id=ctx.worker_id,
            board=self.board,
            stopping=self.stopping,
        )
        # A status change that passes a dataset on queues the next job's commit of it.
        self.ledger = ShardLedger(release=self.scheduler.schedule)
        self.actions = Actions(ctx, shard, self.ledger)
        self.operator = OperatorRequests(ctx, shard, self.ledger, self.actions)
        self.intake = Intake(
            ctx,
            shard,
            consumer=self._consumer,
            ledger=self.ledger,
            schedule=self.scheduler.schedule,
            has_room=self.scheduler.has_room,
            stopping=self.stopping,
        )

    def request_stop(self) -> None:
        """Ask the runner to stop intake and drain (idempotent; the grace counts from the first ask)."""
        if self._stop_asked is None:
            self._stop_asked = time.monotonic()
        self.stopping.set()
        self.scheduler.wake()  # wakes an intake paused for room (Scheduler.wait_room)

    async def _do(self, work: Work) -> None:
        """Carry out one piece of work: an operator request by the operator requests, the rest by
        the actions (raises as they do: the scheduler retries)."""
        if isinstance(work, Operate):
            await self.operator.operate(work)
        else:
            await self.actions.do(work)

    # -- life ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the shard until :meth:`request_stop`; then drain in-flight work.

        Raises:
            Fenced: another worker owns the shard now (nothing more was written).

        Cancellation: in-flight actions are cancelled with it; each releases its
        lock shielded, and an interrupted commit stays in the WAL for recovery.
        """
        delay = 0.1
        try:
            # A bug in the session or in an action is reported to the process at once.
            async with ReportingTaskGroup(f"shard {self.shard}") as tg:
                writer = tg.create_task(self.board.run())
                dispatcher = tg.create_task(self.scheduler.dispatch(tg))
                while not self.stopping.is_set():
                    try:
                        await self._session()
                        delay = 0.1
                    except TransientError as exc:
                        log.warning(
                            "shard session interrupted, restarting",
                            extra=kv(shard=self.shard, error=str(exc), retry_in=round(delay, 2)),
                        )
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self.stopping.wait(), delay)
                        delay = min(delay * 2, 5.0)
                await self._drain(dispatcher)
                # Until it has ended: a cancel that lands as its Redis write
                # completes is lost on Python 3.11, and the group would wait
                # for the writer forever (the shard assigned here, served by nobody).
                await cancel_until_done(writer)
                # What the drain ended leaves the board now; bounded, as the worker's exit waits for
                # it (the board only informs: the next owner's session rewrites it).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(BOARD_FLUSH_TIMEOUT_S):
                        await self.board.flush()
        except* Fenced as eg:
            raise eg.exceptions[0] from None
        except* CommitfleetError as eg:
            raise eg.exceptions[0] from None

    async def _drain(self, dispatcher: asyncio.Task[None]) -> None:
        """Give the shard's queued and running work what is left of ``drain_grace`` since the stop was
        asked, then cancel what is left.

        The dispatcher goes on starting queued work meanwhile: work decided
        before the stop is tried before the shard is handed on, as far as the
        grace allows. What is still queued then is left to the next owner,
        which schedules it again from the saved state and the store (except a
        clean-up of a late attempt, which is in neither: its files stay
        staged, as after a crash, and ``audit`` reports them).
        """
        scheduler = self.scheduler
        if scheduler.queue.datasets:
            grace = self._grace_left()
            log.info(
                "draining shard",
                extra=kv(
                    shard=self.shard,
                    queued=len(scheduler.queue),
                    in_flight=len(scheduler.tasks),
                    grace_left_s=round(grace, 2),
                ),
            )
            await scheduler.settle(grace)
        await cancel_until_done(dispatcher)  # first: it must start nothing more
        # Each releases its lock on the way out; its WAL stays for the next owner.
        await scheduler.cancel_running()
        scheduler.forget_queued()

    def _grace_left(self) -> float:
        """Return the seconds left of ``worker.drain_grace`` since the stop was asked.

        The grace counts from the ask, not from when the session ended (it
        finishes the read and the batch under way first, which under load took
        seconds): a worker's drain then fits ``drain_grace`` plus what follows.
        """
        grace = self.ctx.settings.worker.drain_grace
        if self._stop_asked is None:
            return grace
        return max(0.0, grace - (time.monotonic() - self._stop_asked))

    async def _session(self) -> None:
        ctx = self.ctx
        token = await ctx.registry.owner_token(self.shard)
        if token is None or not token.decode().startswith(f"{ctx.worker_id}@"):
            raise Fenced(f"shard {self.shard} owner token is {token!r}, not ours")
        store = ShardStateStore(
            ctx.redis,
            ctx.keys,
            self.shard,
            token,
            durability=ctx.settings.redis.durable,
            results_max=ctx.settings.queue.results_max,
            consumer=self._consumer.consumer,
        )
        self.ledger.begin(store)
        # Replaces the ledger's state under its save lock: work still running from the last
        # session changes statuses meanwhile (ShardLedger.reload).
        state = await load_or_set_aside(ctx, self.ledger, self.stopping)  # waits while unreadable
        if state is None:
            return
        if ctx.tracer.enabled:  # spans of work resumed here hang under the jobs' producer contexts
            for meta in state.jobs.values():
                if meta.trace is not None:
                    ctx.traces.note(meta.job, TraceCarrier(meta.trace.traceparent, meta.trace.tracestate))
        await self.board.keep_only({work_label(k) for k in self.scheduler.running})
        await self._consumer.ensure_group()
        await self._claim_others(forget_idle=True)
        if self.stopping.is_set():
            return  # stopped while starting: what was under way is resumed by the next owner
        await self._resume_work()
        after = b"0"
        while not self.stopping.is_set():
            entries = await self._consumer.read_pending(ctx.settings.worker.read_batch, after)
            if not entries:
                break
            await self.intake.process(entries)
            after = entries[-1].id
        size = ctx.settings.worker.read_batch
        ahead: list[Entry] = []
        # Entries read ahead are ours already: they are processed even when a
        # stop comes meanwhile (one batch more), never left pending to us.
        while ahead or not self.stopping.is_set():
            if ahead:
                entries, ahead = ahead, []
            else:
                while not self.scheduler.has_room() and not self.stopping.is_set():
                    # Paused for room: the tick goes on (timeouts, operator requests, takeovers).
                    await self.scheduler.wait_room(TICK_S)
                    await self._tick_if_due()
                if self.stopping.is_set():
                    break
                entries = await self._consumer.read(size, ctx.settings.worker.read_block_ms)
            if entries:
                # A full batch says there is a backlog: its save reads the next one
                # (same round trip), unless the shard is stopping or has no room.
                more = len(entries) >= size and not self.stopping.is_set() and self.scheduler.has_room()
                if more and store.sends_ahead:
                    ahead = await self.intake.process_ahead(entries, size)
                else:
                    ahead = await self.intake.process(entries, read_next=size if more else 0)
            await self._tick_if_due()

    async def _tick_if_due(self) -> None:
        if time.monotonic() - self._last_tick >= TICK_S:
            self._last_tick = time.monotonic()
            await self._tick()

    async def _claim_others(self, *, forget_idle: bool = False) -> list[Entry]:
        """Take over the entries pending to any other consumer of the shard's group.

        We hold the shard's owner token, so every other consumer is a previous
        owner that stopped (it confirmed, or its lease expired). A frozen one
        that wakes up can still read a batch before it notices it was fenced:
        those entries become pending to it, and this (called at session start
        and on every tick) brings them back.
        """
        others = [
            c.name for c in await self._consumer.consumers() if c.name != self.ctx.worker_id and c.pending
        ]
        if not others:
            return []
        claimed = await self._consumer.claim_from(others)
        log.info(
            "took over pending entries", extra=kv(shard=self.shard, consumers=others, entries=len(claimed))
        )
        return claimed

    # -- background checks ----------------------------------------------------------------

    async def _tick(self) -> None:
        claimed = await self._claim_others()
        if claimed:
            await self.intake.process(claimed)
        await self._check_liveness()
        for op in await self.operator.pending():
            self.scheduler.schedule(op)
        q = self.ctx.settings.queue
        now = time.time()
        state = self.ledger.state
        old = [job for job, e in state.ended.items() if e.at < now - q.ended_retention]
        if old:
            assert self.ledger.store is not None
            await self.ledger.store.forget_ended(old)
            for job in old:
                del state.ended[job]
        if q.trim_interval and time.monotonic() - self._last_trim >= q.trim_interval:
            self._last_trim = time.monotonic()
            await trim_shard(self.ctx, self.shard, now)
        await self.ctx.flush_counters()

    async def _check_liveness(self) -> None:
        """Abort the jobs whose driver went silent for their timeout (or that ran too long).

        One MGET of the liveness keys of every open job of the shard per
        tick; one ``job_timed_out`` per job and shard (this shard, the job's
        datasets here, the timeout that applied: the owner of each of the
        job's shards decides from its own shard's key, so a job on several
        shards gets one from each), then one abort per dataset.
        """
        state = self.ledger.state
        jobs = live_jobs(state)
        alive: set[str] = set()
        if jobs:
            keys = [self.ctx.keys.job_alive(self.shard, job) for job in jobs]
            with redis_errors("MGET liveness"):
                values = await self.ctx.redis.mget(keys)
            alive = {job for job, value in zip(jobs, values, strict=True) if value is not None}
        now = time.time()
        self._seen = observe(self._seen, jobs, alive, now)
        max_duration = self.ctx.settings.worker.max_job_duration
        for out in timed_out(state, self._seen, now, max_duration=max_duration):

            def aborting(out: TimedOut = out) -> Batch:
                batch = Batch()
                for abort in out.aborts():
                    if state.set_status(abort.job, abort.dataset, "aborting", abort.reason) is not None:
                        batch.datasets.add((abort.job, abort.dataset))
                return batch

            await self.ledger.save_change(out.job, aborting)
            log.warning(
                "job timed out",
                extra=kv(shard=self.shard, job=out.job, datasets=list(out.datasets), reason=out.reason),
            )
            await self.ctx.emit(
                JobTimedOut(
                    at=now,
                    worker=self.ctx.worker_id,
                    job=out.job,
                    datasets=list(out.datasets),
                    timeout_s=out.timeout_s,
                    shard=self.shard,
                )
            )
            for abort in out.aborts():
                self.scheduler.schedule(abort)

    async def _resume_work(self) -> None:
        """Re-schedule what was under way when the shard last changed hands.

        Also restarts every open job's liveness clock: at a session start the
        worker cannot tell a dead driver from a liveness key it could not see
        (owner change, worker restart, Redis restart), so each job gets a full
        timeout from now (``_core.assume_alive``).
        """
        state = self.ledger.state
        self._seen = assume_alive(state.jobs, time.time())
        await self._commit_the_complete()
        # In the order the jobs finished, not the order the saved state lists them: each
        # dataset's first commit (later ones follow as those before them pass: ShardJobs.due).
        for work in state.resumed():
            self.scheduler.schedule(work)
        shards = self.ctx.settings.fleet.shards
        tracked = {
            (name, meta.job)
            for meta in state.jobs.values()
            for name, ds in meta.datasets.items()
            if ds.status in ("committing", "blocked")
        }
        seen: set[str] = set()
        # Only this shard's logs are read (each log is one store read; every shard's were read before).
        unfinished = await list_unfinished(
            self.ctx.store, datasets=lambda ds: shard_of(ds, shards) == self.shard
        )
        await record_quarantined(
            self.ctx, self.shard, {f"{q.dataset}/{q.job}": q.quarantined or "" for q in unfinished}
        )
        for seq in unfinished:
            if seq.dataset in seen:
                continue
            if (seq.dataset, seq.job) in tracked or seq.quarantined is not None:
                continue
            seen.add(seq.dataset)
            self.scheduler.schedule(Recover(dataset=seq.dataset))

    async def _commit_the_complete(self) -> None:
        """Move to ``committing`` every dataset left ``waiting`` although all its tasks are in.

        A dataset is committed when the event that completes it is judged; a
        state that lacks that decision (written by two processes under one
        worker id before ids were checked, or by hand) would otherwise wait
        until its job timed out, whatever is sent again (duplicates change
        nothing). Saved before its commit is scheduled, like a decision.

        Raises:
            Fenced, TransientError: as the save's.
        """
        state = self.ledger.state
        for meta in list(state.jobs.values()):
            for name, ds in meta.datasets.items():
                exp = ds.expected
                if ds.status != "waiting" or exp is None or not all_tasks_in(state, meta.job, name, exp):
                    continue
                log.warning(
                    "dataset has every task in but was left waiting; committing it",
                    extra=kv(shard=self.shard, job=meta.job, dataset=name),
                )
                await self.ledger.set_status(meta.job, name, "committing")


__all__ = ["ShardRunner"]
