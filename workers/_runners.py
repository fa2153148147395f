"""The worker's shard runners: started and stopped as the assignment says, restarted after a failure,
and never left hanging.

A runner asked to stop gets ``worker.drain_grace`` seconds to drain, then
``STOP_OVERDUE_S`` more. One still running after that is a bug (the runner
waits for something that will not end, and while it is registered here its
shard, even when assigned to this worker again, gets no new runner: assigned,
served by nobody). It is reported once at ERROR with every task's await chain
(stderr) and cancelled until it ends; one that outlives ``STOP_OVERDUE_S``
more of that ends the process as a fatal error (exit 70, the shards move to
the other workers), which beats a shard nobody serves.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from shared import CommitfleetError, Fenced, Settings, kv
from shared.fleet import ProcessTasks, dump_tasks

from ._context import WorkerContext
from ._shard import ShardRunner

log = logging.getLogger("workers")

# A shard runner that failed or ended on its own is started again after a backoff.
RESTART_INITIAL_S = 2.0
RESTART_MAX_S = 60.0
# Beyond worker.drain_grace: how long a runner asked to stop may take before it is
# cancelled (and reported), then how long that may take before the process ends.
STOP_OVERDUE_S = 30.0
# How often wait_stopped looks at the runners still running.
CHECK_S = 0.25


class RunnerHung(RuntimeError):
    """A shard runner did not end although stopped and cancelled (a bug: fatal)."""


def restart_delay(failures: int, rng: random.Random) -> float:
    """Return the seconds to wait before starting a shard again after its ``failures``-th failure in a row.

    Capped exponential backoff with jitter: uniform in ``[c/2, c]``,
    ``c = min(RESTART_MAX_S, RESTART_INITIAL_S * 2**(failures-1))``.
    """
    cap = min(RESTART_MAX_S, RESTART_INITIAL_S * 2.0 ** min(max(failures - 1, 0), 30))
    return cap / 2 + rng.random() * cap / 2


def stop_overdue(asked_at: float, now: float, drain_grace: float, overdue_s: float) -> int:
    """Return how far past its deadline a stop asked at ``asked_at`` is at ``now`` (pure).

    0: in time (draining); 1: overdue, cancel the runner; 2: overdue even
    after ``overdue_s`` of cancelling, end the process.
    """
    late = now - asked_at - drain_grace
    if late < overdue_s:
        return 0
    return 1 if late < 2 * overdue_s else 2


class ShardRunners:
    """The runners of one worker, by shard (``by_shard``: shard -> (runner, its task))."""

    def __init__(self, settings: Settings, worker_id: str, *, overdue_s: float = STOP_OVERDUE_S) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.overdue_s = overdue_s
        self.by_shard: dict[int, tuple[ShardRunner, asyncio.Task[None]]] = {}
        self._retry_at: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._stop_asked: dict[int, float] = {}  # shard -> when its present runner was first asked
        self._reported: set[int] = set()
        self._rng = random.Random()

    def request_stop(self, shard: int) -> None:
        """Ask ``shard``'s runner to stop (idempotent; the first ask starts its stop clock)."""
        entry = self.by_shard.get(shard)
        if entry is None:
            return
        entry[0].request_stop()
        self._stop_asked.setdefault(shard, time.monotonic())

    def request_stop_all(self) -> None:
        """Ask every runner to stop."""
        for shard in list(self.by_shard):
            self.request_stop(shard)

    async def reconcile(
        self,
        ctx: WorkerContext,
        process: ProcessTasks,
        want: frozenset[int],
        releasing: frozenset[int],
        stop: asyncio.Event,
    ) -> None:
        """Stop the runners of shards not in ``want``, start those missing (none once ``stop`` is set);
        confirm ``releasing`` shards that have no runner. Cancels (then, later still, reports as fatal)
        a runner whose stop is overdue.

        Raises:
            TransientError: Redis is unreachable (a later call goes on).
        """
        now = time.monotonic()
        for shard, (_runner, task) in list(self.by_shard.items()):
            if task.done():
                self._forget(shard)  # how it ended was handled by _supervise (or is fatal)
                continue
            if shard not in want:
                self.request_stop(shard)
            self._enforce(shard, task, now, process)
        for shard in releasing:
            if shard not in self.by_shard:
                await ctx.registry.confirm_stopped(shard, self.worker_id)
        for shard in sorted(want - self.by_shard.keys()):
            if self._retry_at.get(shard, 0.0) > now or stop.is_set():
                continue
            token = await ctx.registry.owner_token(shard)
            if token is None or not token.decode().startswith(f"{self.worker_id}@"):
                continue  # the coordinator has not handed it to us yet
            if stop.is_set():
                return
            runner = ShardRunner(ctx, shard)
            self.by_shard[shard] = (runner, process.start(self._supervise(runner), f"shard {shard}"))
            log.info("shard started", extra=kv(shard=shard, worker=self.worker_id))

    async def wait_stopped(self, process: ProcessTasks) -> None:
        """Ask every runner to stop and return when all have ended (overdue ones are cancelled,
        then reported as fatal, as in :meth:`reconcile`)."""
        self.request_stop_all()
        while True:
            tasks = [t for _r, t in self.by_shard.values() if not t.done()]
            if not tasks:
                return
            await asyncio.wait(tasks, timeout=CHECK_S)
            now = time.monotonic()
            for shard, (_r, task) in list(self.by_shard.items()):
                if not task.done():
                    self._enforce(shard, task, now, process)
            if process.crashed is not None:
                return  # the process ends: the caller leaves without waiting more

    def _enforce(self, shard: int, task: asyncio.Task[None], now: float, process: ProcessTasks) -> None:
        asked = self._stop_asked.get(shard)
        if asked is None:
            return
        level = stop_overdue(asked, now, self.settings.worker.drain_grace, self.overdue_s)
        if level == 0:
            return
        waited = round(now - asked, 1)
        if shard not in self._reported:
            self._reported.add(shard)
            log.error(
                "shard runner did not end after it was asked to stop; cancelling it (task stacks on stderr)",
                extra=kv(shard=shard, waited_s=waited),
            )
            dump_tasks()
        task.cancel()  # again on every round: a cancel can be lost (see shared._aio.TaskGroup)
        if level == 2:
            process.fatal(RunnerHung(f"shard {shard} runner still running {waited}s after a stop"), "shard")

    def _forget(self, shard: int) -> None:
        del self.by_shard[shard]
        self._stop_asked.pop(shard, None)
        self._reported.discard(shard)

    async def _supervise(self, runner: ShardRunner) -> None:
        """Run one shard; an expected per-shard error ends that shard only.

        Raises:
            Anything but a CommitfleetError: a bug, fatal for the process
            (reported by ProcessTasks; an exception group counts as a bug when
            any member is one).
        """
        shard = runner.shard
        try:
            await runner.run()
        except Fenced as exc:
            log.warning("shard lost to another owner", extra=kv(shard=shard, error=str(exc)))
            return
        except CommitfleetError as exc:
            delay = self._back_off(shard)
            log.error(
                "shard runner failed; starting it again later",
                exc_info=True,
                extra=kv(shard=shard, error=repr(exc), retry_in=round(delay, 1)),
            )
            return
        if runner.stopping.is_set():
            self._failures.pop(shard, None)
            log.info("shard stopped", extra=kv(shard=shard))
        else:
            delay = self._back_off(shard)
            log.warning(
                "shard runner ended on its own; starting it again later",
                extra=kv(shard=shard, retry_in=round(delay, 1)),
            )

    def _back_off(self, shard: int) -> float:
        failures = self._failures[shard] = self._failures.get(shard, 0) + 1
        delay = restart_delay(failures, self._rng)
        self._retry_at[shard] = time.monotonic() + delay
        return delay


__all__ = [
    "RESTART_INITIAL_S",
    "RESTART_MAX_S",
    "STOP_OVERDUE_S",
    "RunnerHung",
    "ShardRunners",
    "restart_delay",
]
