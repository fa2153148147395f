"""The two Redis records that link a job's driver with the fleet while the job runs and after.

- **Liveness** (driver -> fleet): ``cf:<fleet>:{s<n>}:alive:<job>``, one key per
  shard that holds one of the job's datasets, refreshed by the driver with
  ``SET <key> <unix time> PX <ttl ms>`` every :func:`heartbeat_interval`
  seconds. The worker owning the shard reads the keys of all its open jobs
  with one ``MGET`` per tick; a job whose key it has not seen for the job's
  timeout is aborted.
- **Outcome** (fleet -> driver): ``cf:<fleet>:{s<n>}:result:<job>``, a hash
  ``dataset -> DatasetResult JSON`` written by the shard's owner in the same
  MULTI/EXEC as the dataset's status change, expiring after
  :data:`RESULT_RETENTION_S`, and forgotten sooner, oldest first, beyond
  ``queue.results_max`` results per shard. ``commit_job`` and ``commitfleet
  wait`` read it; a result missing from a job that has ended on its shard
  (``state:ended``) was forgotten: that dataset's outcome is unknown to the
  reader (:attr:`JobOutcome.forgotten`), never waited for.

Both keys carry the shard's hash tag, so every command touches one slot.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from typing import Any, Final, Literal

import msgspec
import redis
import redis.asyncio

from ._connect import redis_errors
from ._keys import Keys
from ._routing import shard_of

HEARTBEAT_MIN_S: Final = 0.2
HEARTBEAT_MAX_S: Final = 30.0
TTL_BEATS: Final = 3
"""The liveness key lives this many heartbeat intervals: two refreshes may fail before it lapses."""

RESULT_RETENTION_S: Final = 86400
"""How long a job's outcome records stay in Redis after their shard last wrote one (1 day).

A driver reads them while it waits, right after its job's end; ``commitfleet
wait`` answers for a day after that. Longer would keep about 200 bytes per
dataset for nobody (docs/queue.md, "What is kept")."""

ResultStatus = Literal["committed", "aborted", "quarantined", "blocked"]
FAILED: Final[frozenset[str]] = frozenset({"aborted", "quarantined", "blocked"})


def heartbeat_interval(timeout_s: float) -> float:
    """Return how often a driver refreshes its liveness keys for a job timeout of ``timeout_s``.

    A tenth of the timeout, between 0.2 s and 30 s: at the default 300 s
    timeout a driver writes one ``SET`` per shard every 30 s.
    """
    return min(max(timeout_s / 10.0, HEARTBEAT_MIN_S), HEARTBEAT_MAX_S)


def heartbeat_ttl(timeout_s: float) -> float:
    """Return the TTL of a liveness key: :data:`TTL_BEATS` heartbeat intervals."""
    return TTL_BEATS * heartbeat_interval(timeout_s)


class DatasetResult(msgspec.Struct, frozen=True, kw_only=True):
    """The fleet's outcome for one dataset of one job (JSON in the job's result hash).

    ``status``: ``committed``; ``aborted`` (failed, cancelled, timed out,
    skipped by an operator: ``reason`` says which); ``quarantined`` (the
    commit keeps failing and waits for an operator's retry or skip);
    ``blocked`` (an older quarantined commit of the dataset blocks this one).
    ``files``/``bytes`` count what was published; ``manifest`` is the
    manifest's key under the store root (committed only); ``at`` is when the
    worker wrote the record.
    """

    v: int = 1
    status: ResultStatus
    reason: str = ""
    files: int = 0
    bytes: int = 0
    manifest: str = ""
    at: float = 0.0


_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(DatasetResult)


def encode_result(result: DatasetResult) -> bytes:
    """Return ``result`` as the JSON bytes stored in the result hash."""
    return _enc.encode(result)


def _decode(raw: bytes) -> DatasetResult:
    try:
        return _dec.decode(raw)
    except msgspec.DecodeError as exc:
        # Written by a newer fleet, or by hand: report it rather than guess.
        return DatasetResult(status="blocked", reason=f"unreadable result record: {exc}")


class JobOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What the fleet has decided so far about a job's datasets (pure view).

    ``missing``: no result yet, the job still open on the dataset's shard (wait).
    ``forgotten``: no result, but the job has ended on the dataset's shard: its
    result was written and has since been forgotten (``queue.results_max`` or
    the one-day retention), so the outcome is unknown here; the dataset's
    manifest (``<dataset>/_commits/<job>.json``) says whether it committed.
    """

    results: dict[str, DatasetResult]
    missing: tuple[str, ...]
    forgotten: tuple[str, ...] = ()

    @property
    def done(self) -> bool:
        """True when no dataset is still to be answered: nothing more to wait for.

        Quarantined and blocked datasets count as answered: they wait for an
        operator, which may take longer than any driver should. Forgotten ones
        too: their answer will not come again.
        """
        return not self.missing

    @property
    def failed(self) -> dict[str, DatasetResult]:
        """Datasets not committed (and not without an operator): aborted, quarantined, blocked."""
        return {d: r for d, r in self.results.items() if r.status in FAILED}

    @property
    def ok(self) -> bool:
        """True when every dataset is known to be committed."""
        return self.done and not self.failed and not self.forgotten


def outcome_of(
    datasets: Iterable[str], found: Mapping[str, DatasetResult], ended: Container[str] = ()
) -> JobOutcome:
    """Return the outcome view of ``datasets`` given the records ``found`` and the datasets
    whose shard has ended the job (``ended``: a missing result there was forgotten) (pure)."""
    names = list(datasets)
    return JobOutcome(
        results={d: found[d] for d in names if d in found},
        missing=tuple(d for d in names if d not in found and d not in ended),
        forgotten=tuple(d for d in names if d not in found and d in ended),
    )


def _by_shard(datasets: Iterable[str], shards: int) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for d in datasets:
        out.setdefault(shard_of(d, shards), []).append(d)
    return out


def job_shards(datasets: Iterable[str], shards: int) -> list[int]:
    """Return the shards holding ``datasets`` (sorted): where a job's keys live."""
    return sorted(_by_shard(datasets, shards))


def _queue_reads(pipe: Any, keys: Keys, by_shard: dict[int, list[str]], job: str) -> None:
    # Per shard: the job's results, and whether the job has ended there.
    for shard in by_shard:
        pipe.hgetall(keys.job_result(shard, job))
        pipe.hexists(keys.shard_state(shard, "ended"), job)


def _parse(names: list[str], by_shard: dict[int, list[str]], replies: list[Any]) -> JobOutcome:
    found: dict[str, DatasetResult] = {}
    ended: set[str] = set()
    for i, shard_names in enumerate(by_shard.values()):
        reply, job_ended = replies[2 * i], replies[2 * i + 1]
        for name in shard_names:
            raw = reply.get(name.encode())
            if raw is not None:
                found[name] = _decode(raw)
            elif job_ended:
                ended.add(name)
    return outcome_of(names, found, ended)


def read_outcome_sync(
    client: redis.Redis, keys: Keys, shards: int, job: str, datasets: Iterable[str]
) -> JobOutcome:
    """Return the job's outcome so far: one ``HGETALL`` and one ``HEXISTS`` of ``state:ended``
    per shard, pipelined (one round trip).

    Raises:
        TransientError: Redis unavailable.
    """
    names = list(datasets)
    by_shard = _by_shard(names, shards)
    with redis_errors("read job results"):
        pipe = client.pipeline(transaction=False)
        _queue_reads(pipe, keys, by_shard, job)
        replies = pipe.execute()
    return _parse(names, by_shard, replies)


async def read_outcome(
    client: redis.asyncio.Redis, keys: Keys, shards: int, job: str, datasets: Iterable[str]
) -> JobOutcome:
    """Async twin of :func:`read_outcome_sync`."""
    names = list(datasets)
    by_shard = _by_shard(names, shards)
    with redis_errors("read job results"):
        async with client.pipeline(transaction=False) as pipe:
            _queue_reads(pipe, keys, by_shard, job)
            replies = await pipe.execute()
    return _parse(names, by_shard, replies)


def beat_sync(
    client: redis.Redis, keys: Keys, shard_ids: Iterable[int], job: str, ttl_s: float, now: float
) -> None:
    """Refresh the job's liveness key on every shard in ``shard_ids`` (one pipelined round trip).

    Raises:
        TransientError: Redis unavailable (the caller tries again at its next beat).
    """
    px = max(1, int(ttl_s * 1000))
    with redis_errors("SET liveness"):
        pipe = client.pipeline(transaction=False)
        for shard in shard_ids:
            pipe.set(keys.job_alive(shard, job), repr(now), px=px)
        pipe.execute()


def describe_failures(job: str, failed: Mapping[str, DatasetResult]) -> str:
    """Return one line per dataset that did not commit: ``dataset: status (reason)``."""
    lines = [f"job {job}: {len(failed)} dataset(s) not committed:"]
    for name, r in sorted(failed.items()):
        lines.append(f"  {name}: {r.status}" + (f" ({r.reason})" if r.reason else ""))
    return "\n".join(lines)


__all__ = [
    "FAILED",
    "HEARTBEAT_MAX_S",
    "HEARTBEAT_MIN_S",
    "RESULT_RETENTION_S",
    "TTL_BEATS",
    "DatasetResult",
    "JobOutcome",
    "ResultStatus",
    "beat_sync",
    "describe_failures",
    "encode_result",
    "heartbeat_interval",
    "heartbeat_ttl",
    "job_shards",
    "outcome_of",
    "read_outcome",
    "read_outcome_sync",
]
