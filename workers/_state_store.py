"""The durable side of a shard's job state: Redis hashes under the shard's hash tag.

Keys (all in the shard's slot, see :class:`shared.queue.Keys`)::

    ...:{s<n>}:state:owner     the shard's owner token "<worker>@<epoch>" (set by the coordinator)
    ...:{s<n>}:state:jobs      hash job -> JobMeta JSON (open jobs)
    ...:{s<n>}:state:attempts  hash "<job>/<dataset>/<task>/<attempt>" -> Attempt JSON
    ...:{s<n>}:state:ended     hash job -> Ended JSON (ended jobs, to drop late events)
    ...:{s<n>}:result:<job>    hash dataset -> DatasetResult JSON (what the job's driver waits for)
    ...:{s<n>}:state:aside     hash: why the shard is set aside (only while it is)

Every record carries ``v`` (:data:`STATE_VERSION`); one that does not decode,
or has another version, makes :meth:`ShardStateStore.load` raise
:class:`ShardStateUnreadable`, and the shard is set aside (``_aside.py``).

Every write is one MULTI/EXEC under WATCH of the owner token, together with
the XACK of the messages it accounts for: a message is acknowledged exactly
when what it says is durable, and a worker that no longer owns the shard (a
frozen one that woke up, say) writes nothing (:class:`~shared.Fenced`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec
import redis.asyncio
import redis.exceptions as rx

from shared import BadInput, Fenced
from shared.queue import (
    DEFAULT_GROUP,
    RESULT_RETENTION_S,
    DatasetResult,
    Keys,
    as_text,
    encode_result,
    redis_errors,
    wait_replicated,
)

from ._jobstate import STATE_VERSION, Attempt, Ended, JobMeta, ShardJobs, attempt_field

_R = TypeVar("_R", JobMeta, Attempt, Ended)

_meta_dec = msgspec.json.Decoder(JobMeta)
_attempt_dec = msgspec.json.Decoder(Attempt)
_ended_dec = msgspec.json.Decoder(Ended)
_enc = msgspec.json.Encoder()


class ShardStateUnreadable(BadInput):
    """A record of the shard's state in Redis does not decode, or has an unknown version
    (written by another version of commitfleet, or edited by hand).

    The shard cannot run on a guess: it is set aside until an operator fixes
    or deletes the record (docs/queue.md). ``key`` and ``field`` name it.
    """

    def __init__(self, shard: int, key: str, field: bytes | str, reason: str) -> None:
        self.shard = shard
        self.key = key
        self.field = as_text(field)
        self.reason = reason[:500]
        super().__init__(f"shard {shard}: {key} field {self.field!r}: {self.reason}")


@dataclass(slots=True)
class Batch:
    """What to make durable together: names of changed jobs (their current
    metadata is encoded at save time, so the last save always carries the
    newest state), new attempt records, ended jobs, and the stream ids this
    accounts for."""

    jobs: set[str] = field(default_factory=set)
    attempts: dict[tuple[str, str, int, int], Attempt] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    drop_attempts: list[str] = field(default_factory=list)
    ack: list[bytes] = field(default_factory=list)
    # (job, dataset) -> the outcome its driver reads (written with the status change)
    results: dict[tuple[str, str], DatasetResult] = field(default_factory=dict)

    def empty(self) -> bool:
        """Return True when there is nothing to write or acknowledge."""
        return not (
            self.jobs or self.attempts or self.ended or self.drop_attempts or self.ack or self.results
        )


class ShardStateStore:
    """Loads and saves one shard's job state, fenced by the shard's owner token."""

    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        keys: Keys,
        shard: int,
        token: bytes,
        *,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
    ) -> None:
        self._r = redis_client
        # redis.wait_replicas: each save waits for that many replicas (docs/queue.md "Redis Cluster").
        self._wait = (wait_replicas, wait_timeout)
        self._keys = keys
        self.shard = shard
        self.token = token
        self._owner = keys.shard_state(shard, "owner")
        self._jobs = keys.shard_state(shard, "jobs")
        self._attempts = keys.shard_state(shard, "attempts")
        self._ended = keys.shard_state(shard, "ended")
        self._stream = keys.events(shard)

    async def check_owner(self) -> None:
        """Return if the owner token is still ours; raise Fenced otherwise."""
        with redis_errors("GET owner"):
            current = await self._r.get(self._owner)
        if current != self.token:
            raise Fenced(f"shard {self.shard} is now owned by {current!r}, not {self.token!r}")

    async def load(self) -> ShardJobs:
        """Return the shard's persisted state (open jobs, their attempts, ended jobs).

        Raises:
            ShardStateUnreadable: a record does not decode, or has a version
                this code does not read (the shard must be set aside).
            TransientError: Redis unavailable.
        """
        jobs = await self._hash(self._jobs)
        attempts = await self._hash(self._attempts)
        ended = await self._hash(self._ended)
        state = ShardJobs()
        for name, raw in jobs.items():
            meta = self._decode(_meta_dec, self._jobs, name, raw)
            state.jobs[meta.job] = meta
        for key, raw in attempts.items():
            parts = as_text(key).split("/")
            if len(parts) != 4:
                raise ShardStateUnreadable(
                    self.shard, self._attempts, key, "field is not <job>/<dataset>/<task>/<attempt>"
                )
            state.load_attempt(parts[0], parts[1], self._decode(_attempt_dec, self._attempts, key, raw))
        for name, raw in ended.items():
            state.ended[as_text(name)] = self._decode(_ended_dec, self._ended, name, raw)
        return state

    async def _hash(self, key: str) -> dict[bytes | str, bytes | str]:
        with redis_errors("load shard state"):
            try:
                return dict(await self._r.hgetall(key))
            except rx.ResponseError as exc:
                if not str(exc).startswith("WRONGTYPE"):
                    raise
        # Outside redis_errors, which would make it a ConfigError (a process-level stop).
        raise ShardStateUnreadable(self.shard, key, "", "the key is not a hash (WRONGTYPE)")

    def _decode(
        self, decoder: msgspec.json.Decoder[_R], key: str, field: bytes | str, raw: bytes | str
    ) -> _R:
        try:
            rec = decoder.decode(raw)
        except (msgspec.DecodeError, UnicodeError, RecursionError) as exc:
            raise ShardStateUnreadable(self.shard, key, field, f"does not decode: {exc}") from None
        if rec.v != STATE_VERSION:
            raise ShardStateUnreadable(
                self.shard, key, field, f"record version {rec.v}, this worker reads v{STATE_VERSION}"
            )
        return rec

    async def save(self, batch: Batch, state: ShardJobs) -> None:
        """Write ``batch`` (job metadata as ``state`` has it now) and acknowledge its
        messages atomically, if we still own the shard.

        Callers serialise saves of one shard, so a later save never carries
        older metadata than an earlier one.

        Raises:
            Fenced: the owner token changed (nothing was written).
            TransientError: Redis unavailable (nothing, or everything, was written:
                MULTI/EXEC is atomic, and every write here is idempotent).
        """
        if batch.empty():
            return
        with redis_errors("save shard state"):
            async with self._r.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(self._owner)
                    current = await pipe.get(self._owner)
                    if current != self.token:
                        raise Fenced(f"shard {self.shard} is now owned by {current!r}")
                    pipe.multi()  # type: ignore[no-untyped-call]
                    jobs = {j: _enc.encode(state.jobs[j]) for j in batch.jobs if j in state.jobs}
                    if jobs:
                        pipe.hset(self._jobs, mapping=jobs)  # type: ignore[arg-type]
                    if batch.attempts:
                        attempts = {attempt_field(*k): _enc.encode(v) for k, v in batch.attempts.items()}
                        pipe.hset(self._attempts, mapping=attempts)  # type: ignore[arg-type]
                    ended = {j: _enc.encode(state.ended[j]) for j in batch.ended if j in state.ended}
                    if ended:
                        pipe.hset(self._ended, mapping=ended)  # type: ignore[arg-type]
                        pipe.hdel(self._jobs, *ended)
                    if batch.drop_attempts:
                        pipe.hdel(self._attempts, *batch.drop_attempts)
                    if batch.ack:
                        pipe.xack(self._stream, DEFAULT_GROUP, *batch.ack)
                    for (job, dataset), result in batch.results.items():
                        key = self._keys.job_result(self.shard, job)
                        pipe.hset(key, dataset, encode_result(result))
                        pipe.expire(key, RESULT_RETENTION_S)
                    await pipe.execute()
                except rx.WatchError:
                    raise Fenced(f"shard {self.shard} changed owner during a write") from None
            if self._wait[0]:
                await wait_replicated(self._r, self._keys.shard_state(self.shard, "wait"), *self._wait)

    async def forget_ended(self, jobs: Iterable[str]) -> None:
        """Drop the records of ended jobs past their retention."""
        names = list(jobs)
        if names:
            with redis_errors("HDEL ended"):
                await self._r.hdel(self._ended, *names)


def attempt_fields(state: ShardJobs, job: str) -> Sequence[str]:
    """Return the Redis hash fields of every attempt recorded for ``job``."""
    return [
        attempt_field(job, dataset, a.task, a.attempt)
        for (j, dataset), per_task in state.attempts.items()
        if j == job
        for per_attempt in per_task.values()
        for a in per_attempt.values()
    ]
