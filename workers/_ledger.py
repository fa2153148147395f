"""A shard's job state and how it is made durable: one save at a time, a failed change put back.

:class:`ShardLedger` owns the shard's in-memory job state (:class:`~workers._core.ShardJobs`),
the session's state store, and the save lock every writer of that state takes:
intake saves its batches under it (``workers._intake``), the actions record
each dataset's new status through :meth:`ShardLedger.set_status`. The runner
starts it afresh at each session (:meth:`ShardLedger.begin`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from shared.events import manifest_key
from shared.queue import DatasetResult

from ._core import PASSED, Commit, DatasetState, Ended, JobMeta, ShardJobs, Status
from ._state_store import Batch, ShardStateStore, attempt_fields, dataset_fields


class ShardLedger:
    """The shard's job state (``state``), its session's store (``store``), the save lock (``save_lock``)."""

    def __init__(self, release: Callable[[Commit], None] | None = None) -> None:
        """``release`` queues the commit a status change lets go (the next job's commit of the
        dataset: :meth:`ShardJobs.due`), once the change is durable."""
        self._release = release
        self.state = ShardJobs()
        self.store: ShardStateStore | None = None  # None until the first session starts
        self.save_lock = asyncio.Lock()
        self._save_wanted = 0  # saves waiting for the lock (see save_turn)

    def begin(self, store: ShardStateStore) -> None:
        """Use ``store`` from now on (a session starts; its state is loaded next)."""
        self.store = store

    def load(self, state: ShardJobs) -> None:
        """Replace the in-memory state with ``state`` (tests and benches; a session uses :meth:`reload`)."""
        self.state = state

    async def reload(self) -> ShardJobs:
        """Read the shard's saved state through the session's store, make it the in-memory state and
        return it; under the save lock.

        Work goes on running across a session restart (the scheduler outlives
        sessions), and its status changes with it. Under the lock each change is
        either saved before the read (so in what is read) or applied to what was
        read: none is saved after the read but applied to the state being
        replaced. One that was (a commit's ``committed`` saved while a restarted
        session read the state) left the reloaded state with that job still
        first in the dataset's line, its commit the one that had just ended, and
        every later job's commit of the dataset unreleased until the next
        session start (issue 31 item 2: found across a Redis restart).

        Raises:
            ShardStateUnreadable, Fenced, TransientError: as :meth:`ShardStateStore.load`;
                the state in memory is then unchanged.

        Cancelled: the state in memory is unchanged; re-raised.
        """
        assert self.store is not None
        async with self.save_turn():
            self.state = await self.store.load()
            return self.state

    @property
    def save_wanted(self) -> bool:
        """Return whether a save waits for the lock (a run of saves sent ahead then ends early)."""
        return self._save_wanted > 0

    @contextlib.asynccontextmanager
    async def save_turn(self) -> AsyncIterator[None]:
        """Hold the save lock, counted in :attr:`save_wanted` while waiting for it (a run of
        saves sent ahead ends early for it). Cancelled while waiting: re-raised, nothing held."""
        self._save_wanted += 1
        try:
            await self.save_lock.acquire()
        finally:
            self._save_wanted -= 1
        try:
            yield
        finally:
            self.save_lock.release()

    async def save(self, batch: Batch) -> None:
        """Save ``batch`` in its turn.

        Raises:
            Fenced, TransientError: as :meth:`ShardStateStore.save`.
        """
        assert self.store is not None
        async with self.save_turn():
            await self.store.save(batch, self.state)

    async def save_change(
        self, job: str, change: Callable[[], Batch | None], saved: Callable[[], None] | None = None
    ) -> None:
        """Apply ``change`` to ``job``'s records, save the batch it returns, then call ``saved``;
        all under the save lock.

        Another save writes the metadata of the jobs it names as the state has
        it: were the change applied before the lock is ours, a save queued
        before it could write it (a dataset marked committed, say) ahead of the
        change's own records (the result its driver reads, the job's end), and
        a crash in between would lose them. ``change`` returns None when there
        is nothing to save; it may change ``job``'s metadata and end record
        only (what is put back on failure). What may only happen once the save
        is durable (dropping an ended job's attempts) is ``saved``'s: so a
        failed save never has to rebuild them, and a status change costs no
        copy of the job's attempts. Dataset states ``change`` sets (through
        :meth:`ShardJobs.put`) are journaled and put back one by one: a
        change costs no copy of the job's datasets either.

        Raises:
            Fenced, TransientError: as :meth:`ShardStateStore.save`; ``job``'s
                records are then put back as they were, so that a retry makes
                the same change again (the writes are idempotent).

        Cancelled: ``job``'s records are put back too, then it is re-raised.
        """
        assert self.store is not None
        async with self.save_turn():
            state = self.state
            before = _records_of(state, job)
            journal: list[tuple[str, str, DatasetState | None]] = []
            try:
                state.journal = journal
                try:
                    batch = change()
                finally:
                    state.journal = None
                if batch is not None:
                    await self.store.save(batch, state)
            except BaseException:
                _put_back(state, job, before)
                state.undo(journal)
                raise
            if saved is not None:
                saved()

    async def set_status(self, job: str, dataset: str, status: Status, reason: str = "") -> None:
        """Record a dataset's new status durably; end the job when all its datasets are done.

        The status, the result and the job's end are applied and saved under
        the save lock, and put back should the save fail (see :meth:`save_change`).
        One field of the saved state is written (and the job's records dropped when
        it ends): the cost does not grow with the job's datasets. A status that
        passes the dataset on (:data:`~workers._core.PASSED`) then releases the
        next job's commit of it, if that one is ``committing``.

        Raises:
            Fenced, TransientError: the save failed; nothing changed in memory.
        """
        ending: list[Ended] = []  # the job's end, when this change ends it

        def change() -> Batch | None:
            meta = self.state.set_status(job, dataset, status, reason)
            if meta is None:
                return None
            batch = Batch(datasets={(job, dataset)})  # one field: O(1) whatever the job's size
            result = self._result(job, dataset, status, reason)
            if result is not None:
                batch.results[(job, dataset)] = result
            done = self.state.job_done(job)
            if done is not None:
                batch.drop_attempts.extend(attempt_fields(self.state, job))
                batch.drop_datasets.extend(dataset_fields(self.state, job))
                # Only the end record before the save (the save writes it); the
                # job's records go once it is durable (see save_change).
                ending.append(Ended(status=done, at=time.time()))
                self.state.ended[job] = ending[0]
                batch.datasets.clear()
                batch.ended.add(job)
            return batch

        def saved() -> None:
            if ending:
                self.state.end_job(job, ending[0].status, ending[0].at)
            if status in PASSED and self._release is not None:
                # This job no longer holds the dataset: the next job's commit of it may run.
                due = self.state.due(dataset)
                if due is not None:
                    self._release(due)

        await self.save_change(job, change, saved)

    def _result(self, job: str, dataset: str, status: Status, reason: str) -> DatasetResult | None:
        """Return the outcome record the job's driver reads, for a status it waits for (else None)."""
        if status == "committed":
            winners = self.state.winners(job, dataset) or []
            return DatasetResult(
                status="committed",
                files=sum(len(a.files) for a in winners),
                bytes=sum(f.size for a in winners for f in a.files),
                manifest=manifest_key(dataset, job),
                at=time.time(),
            )
        if status in ("aborted", "quarantined", "blocked"):
            return DatasetResult(status=status, reason=reason, at=time.time())
        return None


_JobRecords = tuple[JobMeta | None, Ended | None]


def _records_of(state: ShardJobs, job: str) -> _JobRecords:
    """Return what a change may alter of ``job`` in ``state`` (its metadata and end), to put back later.

    Constant time: the job's attempts are not part of it (a change leaves them
    alone; :meth:`ShardLedger.save_change`).
    """
    return state.jobs.get(job), state.ended.get(job)


def _put_back(state: ShardJobs, job: str, records: _JobRecords) -> None:
    meta, ended = records
    if meta is None:
        state.remove_job(job)
    else:
        state.add_job(meta)
    if ended is None:
        state.ended.pop(job, None)
    else:
        state.ended[job] = ended


__all__ = ["ShardLedger"]
