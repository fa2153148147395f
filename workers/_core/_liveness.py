"""When the fleet aborts a job for time (pure): its driver went silent, or it ran too long.

A job's driver refreshes a liveness key on each shard of the job
(:mod:`shared.queue._job_outcome`). The shard's owner looks at the keys of
all its open jobs once per tick and remembers, per job, when it last saw the
key (``seen``, the worker's own clock). A job whose key it has not seen for
the job's timeout (``JobStarted.timeout_s``, else ``worker.job_timeout``) is
aborted; so is any job older than ``worker.max_job_duration`` when that is
set. A job's opening on the shard counts as a sign of life, so a producer
that never refreshes a key gets the old behaviour: aborted ``timeout_s``
after its ``job_started``.

Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

import msgspec

from ._jobstate import JobMeta, ShardJobs
from ._work import Abort


class TimedOut(msgspec.Struct, frozen=True, kw_only=True):
    """A job this shard aborts for time: its datasets here that no commit owns, and why.

    ``timeout_s`` is the limit that applied (the job's silence timeout, or
    the fleet's ``max_job_duration``).
    """

    job: str
    datasets: tuple[str, ...]
    timeout_s: float
    reason: str

    def aborts(self) -> list[Abort]:
        """Return one abort per dataset."""
        return [Abort(job=self.job, dataset=d, reason=self.reason) for d in self.datasets]


def live_jobs(state: ShardJobs) -> list[str]:
    """Return the jobs whose fate can still depend on their driver (a dataset open or waiting)."""
    return [job for job in state.jobs if state.live(job)]  # counted per job: O(jobs), not O(datasets)


def timed_out(
    state: ShardJobs, seen: Mapping[str, float], now: float, *, max_duration: float = 0.0
) -> list[TimedOut]:
    """Return the jobs to abort for time, one record per job.

    A job times out when its driver has shown no sign of life for the job's
    timeout: ``seen[job]`` is when this worker last saw its liveness key,
    and the job's opening on this shard counts too. With ``max_duration > 0``
    a job also times out that long after it opened, alive or not. Only
    datasets still ``open`` or ``waiting`` are aborted: a commit that started
    wins.
    """
    out: list[TimedOut] = []
    for meta in state.jobs.values():
        if not state.live(meta.job):
            continue
        if max_duration > 0 and now - meta.opened_at >= max_duration:
            names = _live_names(meta)
            reason = f"timed out: ran longer than the fleet's max_job_duration ({max_duration:g}s)"
            out.append(TimedOut(job=meta.job, datasets=names, timeout_s=max_duration, reason=reason))
            continue
        last = max(seen.get(meta.job, meta.opened_at), meta.opened_at)
        if now - last >= meta.timeout_s:
            names = _live_names(meta)
            reason = f"timed out: no sign of life from its driver for {meta.timeout_s:g}s"
            out.append(TimedOut(job=meta.job, datasets=names, timeout_s=meta.timeout_s, reason=reason))
    return out


def observe(
    seen: Mapping[str, float], jobs: Iterable[str], alive: AbstractSet[str], now: float
) -> dict[str, float]:
    """Return the new last-seen map of ``jobs`` after one look at their liveness keys.

    A job whose key was there is seen ``now``; the others keep their last
    sighting (none yet: the job's opening counts, see :func:`timed_out`).
    Jobs not in ``jobs`` are forgotten, so the map follows open work.
    """
    out: dict[str, float] = {}
    for job in jobs:
        if job in alive:
            out[job] = now
        elif job in seen:
            out[job] = seen[job]
    return out


def assume_alive(jobs: Iterable[str], now: float) -> dict[str, float]:
    """Return a last-seen map that counts every job as seen ``now``.

    Used when a worker (re)starts a shard session: after an owner change, a
    worker restart or a Redis restart it cannot tell a silent driver from a
    liveness key it could not see (a restarted Redis may have lost it, and
    while Redis was away the driver could not refresh it either), so every
    open job gets a full timeout from that moment to show up again. The
    price: a dead driver's job is aborted up to one timeout later.
    """
    return dict.fromkeys(jobs, now)


def _live_names(meta: JobMeta) -> tuple[str, ...]:
    """Return the job's datasets still ``open`` or ``waiting`` (once, for a job that timed out)."""
    return tuple(n for n, ds in meta.datasets.items() if ds.status in ("open", "waiting"))


__all__ = ["TimedOut", "assume_alive", "live_jobs", "observe", "timed_out"]
