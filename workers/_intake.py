"""A shard's intake: decode, validate and route each entry, fold it into the job state,
make it durable together with its acknowledgement, then hand its actions on.

An :class:`Intake` is given the shard's consumer (it reads, dead-letters,
takes what a save read ahead), the shard's ledger (the job state it folds
decisions into, the save lock it saves under), where its actions go
(``schedule``), whether the shard's queue has room (``has_room``) and the
shard's stop event. The runner decides when to read; this judges and saves.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

from shared import GUESS_LIMIT, ConfigError, LockLost, TransientError, kv
from shared.events import (
    InvalidMessage,
    MessageRejected,
    QueueEvent,
    RepeatedFields,
    TaskFinished,
    TraceContext,
    ValidationLimits,
    decode_entry,
    event_datasets,
    event_type,
)
from shared.queue import Entry, ShardConsumer, shard_of
from shared.tracing import Attributes, TraceCarrier

from ._context import WorkerContext
from ._core import Action, Decision, decide
from ._ledger import ShardLedger
from ._save_pipe import send_save
from ._state_store import Batch, Prepared

log = logging.getLogger("workers.shard")

# Errors that say the session or the process is in trouble, not the entry at
# hand. The guarded part of intake does no I/O, so none should arise there; if
# a later change lets one through, it must still end the session, not an entry.
_NOT_ABOUT_THE_ENTRY = (LockLost, TransientError, ConfigError)

# Batches one run of saves sent ahead takes at most before the session loop has
# its turn again (its tick: takeovers, liveness, operator requests).
_RUN = 16

# A SHA-256 per event was a measurable part of intake; a fleet sees few
# dataset names again and again. Bounded like the validation memo.
_route = functools.lru_cache(maxsize=GUESS_LIMIT)(shard_of)


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ fails: still name its type
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Intake:
    """A shard's intake (see the module doc)."""

    def __init__(
        self,
        ctx: WorkerContext,
        shard: int,
        *,
        consumer: ShardConsumer,
        ledger: ShardLedger,
        schedule: Callable[[Action], None],
        has_room: Callable[[], bool],
        stopping: asyncio.Event,
    ) -> None:
        """``schedule`` queues an action once its batch is saved; ``has_room`` says whether the
        shard's queue may take more; ``stopping`` is set when the shard stops (read only)."""
        self.ctx = ctx
        self.shard = shard
        self._consumer = consumer
        self._ledger = ledger
        self._schedule = schedule
        self._has_room = has_room
        self._stopping = stopping
        self._probe = ctx.probe
        self._tracing = ctx.tracer.enabled
        # Traced job-level events judged, not saved yet: (context, type, job, datasets, judged at in ns).
        self._traced: list[tuple[TraceCarrier, str, str, int, int]] = []

    def _mine(self, ev: QueueEvent, shards: int) -> QueueEvent:
        """Return ``ev`` when every dataset it names belongs to this shard (of ``shards``).

        A producer sends each shard a copy naming only that shard's datasets
        (docs/contract.md), so an event naming another shard's dataset is
        malformed: acting on the part that is ours would hide the mistake.

        Raises:
            InvalidMessage: ``inconsistent``.
        """
        if type(ev) is TaskFinished:  # most events: one dataset, no list to build
            if _route(ev.dataset, shards) == self.shard:
                return ev
            names = [ev.dataset]
        else:
            names = event_datasets(ev)
            for d in names:
                if _route(d, shards) != self.shard:
                    break
            else:
                return ev
        foreign = {d: shard_of(d, shards) for d in names if shard_of(d, shards) != self.shard}
        if foreign:
            where = ", ".join(f"{d!r} -> shard {s}" for d, s in sorted(foreign.items())[:5])
            raise InvalidMessage(
                "inconsistent",
                f"{len(foreign)} of the {len(names)} datasets belong to other shards ({where}),"
                f" not {self.shard}",
            )
        return ev

    def _judge(
        self, entry: Entry, now: float, limits: ValidationLimits, stream: str, timeout: float, shards: int
    ) -> Decision | InvalidMessage:
        """Return what one entry does to the shard's job state, or why it is rejected.

        ``limits``, ``stream``, ``timeout`` and ``shards`` are the worker's
        validation limits, the shard's stream, the default job timeout and the
        fleet's shard count, looked up by the caller once per batch: looked up
        here, per event, they were 4% of intake's instructions.

        Pure (no I/O, nothing changed): decode, validate, route, decide. Total:
        an error nobody expected while judging one entry is that entry's
        problem, never the shard's; it is logged with its traceback and the
        entry is rejected with reason ``internal``.

        Raises:
            LockLost, TransientError, ConfigError: never from this code today
                (it does no I/O); passed on should a change let one through.
        """
        try:
            if not entry.fields:  # Entry.deleted, or a field name repeats; spelled out: this runs per event
                if type(entry.fields) is RepeatedFields:
                    return entry.fields.rejection()  # schema, naming the field; dead-lettered as sent
                return InvalidMessage(
                    "deleted", "the entry was trimmed or deleted while pending: no content left"
                )
            ev = self._mine(
                decode_entry(entry.fields, limits=limits, stream=stream, entry_id=entry.id), shards
            )
            d = decide(self._ledger.state, ev, now=now, default_timeout=timeout)
        except InvalidMessage as exc:
            return exc
        except _NOT_ABOUT_THE_ENTRY:
            raise
        except Exception as exc:  # no await above: nothing here can be a cancellation
            log.exception(
                "unexpected error while handling an entry; dead-lettering it",
                extra=kv(shard=self.shard, id=entry.id.decode("ascii", "replace")),
            )
            return InvalidMessage("internal", _describe(exc))
        if d.replayed:
            return InvalidMessage("replayed", d.note)
        if d.reject is not None:
            return InvalidMessage(d.reject, d.note)
        if self._tracing and type(ev) is not TaskFinished:
            self._note_trace(ev)
        return d

    def _note_trace(self, ev: QueueEvent) -> None:
        """Keep a traced job-level event's context for the job's spans, and its intake span's start."""
        trace = getattr(ev, "trace", None)
        if not isinstance(trace, TraceContext):
            return
        carrier = TraceCarrier(trace.traceparent, trace.tracestate)
        self.ctx.traces.note(ev.job, carrier)
        self._traced.append((carrier, event_type(ev), ev.job, len(event_datasets(ev)), time.time_ns()))

    def _end_intake_spans(self) -> None:
        """Record the intake span of each traced event judged since the last call: judged -> saved."""
        if not self._traced:
            return
        tracer, now = self.ctx.tracer, time.time_ns()
        for carrier, kind, job, datasets, start in self._traced:
            attributes: Attributes = {
                "commitfleet.job": job,
                "commitfleet.event": kind,
                "commitfleet.shard": self.shard,
                "commitfleet.datasets": datasets,
            }
            tracer.record(
                "commitfleet.intake", start_ns=start, end_ns=now, parent=carrier, attributes=attributes
            )
        self._traced.clear()

    async def process(self, entries: list[Entry], *, read_next: int = 0) -> list[Entry]:
        """Judge each entry, make the batch durable with its acknowledgements, then schedule its actions.

        Rejected entries are dead-lettered (and acknowledged) one by one as
        they come; the others are acknowledged by the batch's save.

        Returns:
            Up to ``read_next`` new entries read by the same save (a round
            trip less per batch under a backlog): already taken, so the caller
            must process them (or leave them pending to us, e.g. when the
            session ends). Empty without ``read_next`` or when nothing was saved.

        Raises:
            Fenced: another worker owns the shard (nothing of the batch was saved).
            TransientError: Redis unavailable; unacknowledged entries stay pending.

        Cancellation: what was not saved stays pending and is read again.
        """
        # Judged and saved under the save lock: another save (an action's status
        # change) writes the metadata of the jobs it names as the state has it, and
        # must never write decisions of this batch before this batch's own save
        # (their records and acknowledgements) is durable.
        async with self._ledger.save_lock:
            self._traced.clear()  # a batch that failed to save is read and judged again
            batch, todo, rejected, duplicates = await self._judge_all(entries)
            store = self._ledger.store
            assert store is not None
            ahead = await store.save(batch, self._ledger.state, read_next=read_next)
        self._end_intake_spans()
        self._count(len(entries), rejected, duplicates)
        for action in todo:
            self._schedule(action)
        return self._consumer.took(ahead)

    async def process_ahead(self, entries: list[Entry], size: int) -> list[Entry]:
        """Process ``entries`` (a full batch) and the backlog behind it, each batch judged while
        Redis runs the save of the one before (``workers._save_pipe``).

        The save lock is held for the whole run: until a save is durable the
        decisions of its batch are in the state, and no other save may write
        them. The run ends after ``_RUN`` batches, at the end of the backlog,
        or when an action waits to save, the shard stops or its work queue
        is full. Its actions are queued after it.

        Returns:
            Entries read and not judged yet (pending to us): the caller
            processes them, like those read by a save.

        Raises:
            Fenced, TransientError: as :meth:`process`; what was not saved
                stays pending, and the session's next start reloads the state.

        Cancellation: the save on the wire is dropped (its outcome unknown:
            it is atomic and idempotent); what was not saved stays pending.
        """
        store = self._ledger.store
        assert store is not None
        todo: list[Action] = []
        tally = [0, 0, 0]  # judged, rejected, duplicates
        held: list[Entry] = []
        async with self._ledger.save_lock:
            self._traced.clear()  # a batch that failed to save is read and judged again
            prep = await self._judge_prepared(entries, todo, tally)
            # Two batches read: one to judge while the next save runs.
            await self._probe("intake.run")
            sent = await send_save(store, prep, 2 * size)
            try:
                rounds = 1
                while True:
                    nxt, held = held[:size], held[size:]
                    after = await self._judge_prepared(nxt, todo, tally) if nxt else None
                    new = self._consumer.took(await sent.result())
                    held += new
                    if after is None and held:  # the run's first save: nothing was judged meanwhile
                        nxt, held = held[:size], held[size:]
                        after = await self._judge_prepared(nxt, todo, tally)
                    if after is None:
                        break
                    rounds += 1
                    more = (
                        len(new) >= sent.asked
                        and rounds < _RUN
                        and not self._stopping.is_set()
                        and not self._ledger.save_wanted
                        and self._has_room()
                    )
                    sent = await send_save(store, after, size if more else 0)
                    if not more:
                        await sent.result()  # nothing read
                        break
            except BaseException:
                await sent.abandon()
                raise
        self._end_intake_spans()
        self._count(*tally)
        for action in todo:
            self._schedule(action)
        return held

    async def _judge_prepared(self, entries: list[Entry], todo: list[Action], tally: list[int]) -> Prepared:
        """Judge ``entries`` (see :meth:`_judge_all`), add their actions to ``todo`` and their
        figures to ``tally``; return their save, encoded now."""
        await self._probe("intake.judge")
        batch, actions, rejected, duplicates = await self._judge_all(entries)
        todo += actions
        tally[0] += len(entries)
        tally[1] += rejected
        tally[2] += duplicates
        store = self._ledger.store
        assert store is not None
        return store.prepare(batch, self._ledger.state)

    def _count(self, judged: int, rejected: int, duplicates: int) -> None:
        counters = self.ctx.counters
        counters.add("intake", judged)
        if rejected:
            counters.add("rejected", rejected)
        if duplicates:
            counters.add("duplicates", duplicates)

    async def _judge_all(self, entries: list[Entry]) -> tuple[Batch, list[Action], int, int]:
        """Return the batch to save, the actions to run after it, and how many entries
        were rejected (dead-lettered here) and were duplicates; applies each decision."""
        now = time.time()
        batch = Batch()
        todo: list[Action] = []
        rejected = duplicates = 0
        # Bound once: this loop runs per event.
        judge, apply, acked, attempts = (
            self._judge,
            self._ledger.state.apply,
            batch.ack.append,
            batch.attempts,
        )
        add_job, changed = batch.jobs.add, batch.datasets
        limits, stream, settings = self.ctx.limits, self._consumer.stream, self.ctx.settings
        timeout, shards = settings.worker.job_timeout, settings.fleet.shards
        for entry in entries:
            d = judge(entry, now, limits, stream, timeout, shards)
            if isinstance(d, InvalidMessage):
                await self._reject(entry, d)
                rejected += 1
                continue
            apply(d)
            if d.job is not None:
                add_job(d.job.job)
            if d.datasets:  # only those the event changed: its size, not the job's
                job_id = d.job_id
                changed.update((job_id, name) for name in d.datasets)
            if d.attempt is not None:
                ds, rec = d.attempt
                attempts[(d.job_id, ds, rec.task, rec.attempt)] = rec
            elif d.duplicate:
                duplicates += 1  # e.g. a publisher's retry delivered the entry twice
            if d.actions:
                todo.extend(d.actions)
            acked(entry.id)
        return batch, todo, rejected, duplicates

    async def _reject(self, entry: Entry, exc: InvalidMessage) -> None:
        dead_id = await self._consumer.dead_letter(entry, exc.reason, exc.detail)
        log.warning(
            "message rejected",
            extra=kv(
                shard=self.shard, id=entry.id.decode("ascii", "replace"), reason=exc.reason, detail=exc.detail
            ),
        )
        if dead_id is not None:
            await self.ctx.emit(
                MessageRejected(
                    at=time.time(),
                    worker=self.ctx.worker_id,
                    shard=self.shard,
                    reason=exc.reason,
                    detail=exc.detail[:500],
                    stream_id=entry.id.decode("ascii", "replace"),
                )
            )


__all__ = ["Intake"]
