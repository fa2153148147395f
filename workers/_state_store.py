"""The durable side of a shard's job state: Redis hashes under the shard's hash tag.

Keys (all in the shard's slot, see :class:`shared.queue.Keys`)::

    ...:{s<n>}:state:owner     the shard's owner token "<worker>@<epoch>" (set by the coordinator)
    ...:{s<n>}:state:jobs      hash job -> JobMeta JSON (open jobs; since v2 without their datasets)
    ...:{s<n>}:state:datasets  hash "<job>/<dataset>" -> DatasetState JSON (each dataset of an open job, v2)
    ...:{s<n>}:state:attempts  hash "<job>/<dataset>/<task>/<attempt>" -> Attempt JSON
    ...:{s<n>}:state:ended     hash job -> Ended JSON (ended jobs, to drop late events)
    ...:{s<n>}:result:<job>    hash dataset -> DatasetResult JSON (what the job's driver waits for)
    ...:{s<n>}:state:results   sorted set "<job>\\n<dataset>" -> when its result was written (ms):
                               the results' age order, to keep at most ``results_max`` per shard
    ...:{s<n>}:state:aside     hash: why the shard is set aside (only while it is)
    ...:{s<n>}:state:counts    hash: dataset records per status, ``jobs``, ``gen`` (see COUNTS)

Every record carries ``v`` (:data:`STATE_VERSION`); one that does not decode,
or has a version this code does not read (:data:`~workers._core.READS`), makes
:meth:`ShardStateStore.load` raise :class:`ShardStateUnreadable`, and the shard
is set aside (``_aside.py``). A v1 job record (its datasets inside) is migrated
by the load itself: one fenced save writes it as v2 and each of its datasets
as a field of ``state:datasets``; the order its datasets' commits run in, which
v1 did not record, is then taken from when the jobs opened on the shard.

Every write is one Lua script (one round trip, atomic) that first compares
the owner token and writes nothing unless it is ours, together with the XACK
of the messages it accounts for: a message is acknowledged exactly when what
it says is durable, and a worker that no longer owns the shard (a frozen one
that woke up, say) writes nothing (:class:`~shared.Fenced`). The batch travels
as one msgpack argument: redis-py packs each command argument in Python, and a
500-event batch as separate arguments cost about a fifth of the intake.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec
import redis.asyncio
import redis.exceptions as rx

from shared import BadInput, Durability, Fenced, resolve_durability
from shared.queue import (
    DEFAULT_GROUP,
    RESULT_RETENTION_S,
    DatasetResult,
    Entry,
    Keys,
    as_text,
    check_durable,
    encode_result,
    entries_from_reply,
    is_cluster,
    keep_repeated_fields,
    queue_durable,
    redis_errors,
)

from ._core import (
    READS,
    STATE_VERSION,
    STATUSES,
    Attempt,
    DatasetState,
    Ended,
    JobMeta,
    ShardJobs,
    attempt_field,
    dataset_field,
)

_R = TypeVar("_R", JobMeta, Attempt, Ended, DatasetState)

DEFAULT_RESULTS_MAX = 10_000
"""Job results kept at most per shard (the default of ``queue.results_max``)."""
RESULTS_INDEX = "results"
"""The shard-state key (``state:results``) that orders the shard's job results by age."""
DATASETS = "datasets"
"""The shard-state key (``state:datasets``) of every open job's datasets, field ``<job>/<dataset>`` (v2)."""
COUNTS = "counts"
"""The shard-state key (``state:counts``): the shard's dataset records per status (a field per
status of :data:`~workers._core.STATUSES`), ``jobs`` (its open job records) and ``gen`` (moves
whenever a job record comes or goes). Written by the save script with the records themselves, and
whole by each load (:meth:`ShardStateStore.load`)."""

_meta_dec = msgspec.json.Decoder(JobMeta)
_attempt_dec = msgspec.json.Decoder(Attempt)
_ended_dec = msgspec.json.Decoder(Ended)
_dataset_dec = msgspec.json.Decoder(DatasetState)
_enc = msgspec.json.Encoder()
_pack = msgspec.msgpack.Encoder().encode


# KEYS: owner, jobs, attempts, ended, stream, results index, datasets, counts, then one result hash
# per batch.results job.
# ARGV: token, group, result retention (s), msgpack of
#   [jobs flat, attempts flat, ended flat, ended names, dropped attempts, ack ids, results, result jobs,
#    datasets flat, dropped datasets]
# where each "flat" is [field, value, field, value, ...] and results is, per
# result key (in KEYS order from 9), [dataset, value, dataset, value, ...], whose
# job names are in result jobs; then results_max, now (ms), the result keys' prefix.
# Returns 1 when written, else the current owner token (or "" when none): the
# comparison and every write are one atomic script, so a fenced worker writes
# nothing and acknowledges nothing.
#
# The next batch is not read here but by an XREADGROUP sent right behind the
# script (same round trip): Redis turns a read made inside a script into Lua
# tables and back, which cost more than the whole save (0.9 ms against 0.34 for
# the plain read of 500 entries, measured).
#
# The shard's counts (state:counts, see COUNTS) change in the same script as the records they
# count, so they can never disagree with them: each dataset record written or dropped moves its
# old status's count down and its new one's up, the old status read from the record the script
# replaces (a retried save finds its own record: no change; a fenced one writes nothing);
# ``jobs`` is the jobs hash's length and ``gen`` moves whenever a job record comes or goes
# (GET /status reuses its count of distinct jobs while no shard's gen moved).
#
# Results beyond results_max (the oldest first), and those older than the retention,
# are forgotten in the same script that writes one: the cap holds after every save.
# Their hashes are named from the prefix inside the script: every one carries the
# shard's hash tag, the slot of the declared keys.
_SAVE_LUA = """
local owner = redis.call('GET', KEYS[1])
if owner ~= ARGV[1] then return owner or '' end
local b = cmsgpack.unpack(ARGV[4])
local function chunks(cmd, key, list, extra)
  -- unpack() is bounded by Lua's C stack: 1000 elements a call (an even number keeps pairs).
  -- Returns the sum of the replies (fields added by HSET, removed by HDEL).
  local n = 0
  for i = 1, #list, 1000 do
    if extra then
      n = n + redis.call(cmd, key, extra, unpack(list, i, math.min(i + 999, #list)))
    else
      n = n + redis.call(cmd, key, unpack(list, i, math.min(i + 999, #list)))
    end
  end
  return n
end
local delta = {}
local function status_of(raw)
  -- The first "status" of a DatasetState's JSON is its own (a string value's quotes are escaped).
  if raw then return string.match(raw, '"status":"([a-z]+)"') end
end
local function moved(st, n)
  if st then delta[st] = (delta[st] or 0) + n end
end
local function ds_written(flat)
  for i = 1, #flat, 2 do
    moved(status_of(redis.call('HGET', KEYS[7], flat[i])), -1)
    moved(status_of(flat[i + 1]), 1)
  end
end
local function ds_dropped(fields)
  for _, f in ipairs(fields) do moved(status_of(redis.call('HGET', KEYS[7], f)), -1) end
end
local jobs_moved = chunks('HSET', KEYS[2], b[1])
chunks('HSET', KEYS[3], b[2])
chunks('HSET', KEYS[4], b[3])
jobs_moved = jobs_moved + chunks('HDEL', KEYS[2], b[4])
chunks('HDEL', KEYS[3], b[5])
ds_written(b[9])
chunks('HSET', KEYS[7], b[9])
ds_dropped(b[10])
chunks('HDEL', KEYS[7], b[10])
chunks('XACK', KEYS[5], b[6], ARGV[2])
for st, n in pairs(delta) do
  if n ~= 0 then redis.call('HINCRBY', KEYS[8], st, n) end
end
if jobs_moved > 0 then
  redis.call('HSET', KEYS[8], 'jobs', redis.call('HLEN', KEYS[2]))
  redis.call('HINCRBY', KEYS[8], 'gen', 1)
end
local now = tonumber(ARGV[6])
-- Scores follow the write order (ms, moved past the newest so that the same millisecond,
-- or an owner whose clock is behind, never puts a newer result before an older one).
local seq = now
local top = redis.call('ZRANGE', KEYS[6], -1, -1, 'WITHSCORES')
if top[2] and tonumber(top[2]) >= seq then seq = tonumber(top[2]) + 1 end
for i, flat in ipairs(b[7]) do
  chunks('HSET', KEYS[8 + i], flat)
  redis.call('EXPIRE', KEYS[8 + i], ARGV[3])
  for j = 1, #flat, 2 do
    redis.call('ZADD', KEYS[6], seq, b[8][i] .. '\\n' .. flat[j])
    seq = seq + 1
  end
end
local function forget(members)
  for _, m in ipairs(members) do
    local nl = string.find(m, '\\n', 1, true)
    redis.call('HDEL', ARGV[7] .. string.sub(m, 1, nl - 1), string.sub(m, nl + 1))
    redis.call('ZREM', KEYS[6], m)
  end
end
forget(redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now - 1000 * tonumber(ARGV[3]), 'LIMIT', 0, 1000))
local over = redis.call('ZCARD', KEYS[6]) - tonumber(ARGV[5])
if over > 0 then forget(redis.call('ZRANGE', KEYS[6], 0, over - 1)) end
return 1
"""


# KEYS: owner, counts. ARGV: token, then the counts flat [field, value, ...].
# Replaces the shard's counts whole (the load's recount), fenced like a save; ``gen`` moves on
# from the value it had, so a reader never sees an old gen again.
_RECOUNT_LUA = """
local owner = redis.call('GET', KEYS[1])
if owner ~= ARGV[1] then return owner or '' end
local gen = redis.call('HINCRBY', KEYS[2], 'gen', 1)
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'gen', gen, unpack(ARGV, 2))
return 1
"""


def status_counts(state: ShardJobs) -> dict[str, int]:
    """Return the shard's counts as ``state:counts`` holds them: dataset records per status (every
    status, zeros too) and ``jobs``, the open job records. O(open datasets): once per load."""
    counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for meta in state.jobs.values():
        for ds in meta.datasets.values():
            counts[ds.status] += 1
    counts["jobs"] = len(state.jobs)
    return counts


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
    """What to make durable together: names of changed jobs and (job, dataset)
    of changed datasets (their current records are encoded at save time, so
    the last save always carries the newest state), new attempt records, ended
    jobs, fields of records to drop, and the stream ids this accounts for."""

    jobs: set[str] = field(default_factory=set)
    datasets: set[tuple[str, str]] = field(default_factory=set)
    drop_datasets: list[str] = field(default_factory=list)
    attempts: dict[tuple[str, str, int, int], Attempt] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    drop_attempts: list[str] = field(default_factory=list)
    ack: list[bytes] = field(default_factory=list)
    # (job, dataset) -> the outcome its driver reads (written with the status change)
    results: dict[tuple[str, str], DatasetResult] = field(default_factory=dict)

    def empty(self) -> bool:
        """Return True when there is nothing to write or acknowledge."""
        return not (
            self.jobs
            or self.datasets
            or self.attempts
            or self.ended
            or self.drop_attempts
            or self.drop_datasets
            or self.ack
            or self.results
        )


@dataclass(frozen=True, slots=True)
class Prepared:
    """One save, encoded (:meth:`ShardStateStore.prepare`): the save script's keys and arguments."""

    keys: list[str]
    args: list[bytes | str | int]


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
        results_max: int = DEFAULT_RESULTS_MAX,
        consumer: str = "",
        durability: Durability | None = None,
    ) -> None:
        """``results_max``: job results kept at most on this shard (``queue.results_max``);
        ``consumer``: the name :meth:`save` reads ahead for (the shard consumer's);
        ``durability``: what each save waits for once Redis ran it (``redis.durability``;
        ``wait_replicas`` / ``wait_timeout`` are its older spelling)."""
        if results_max < 1:
            raise ValueError("results_max must be >= 1")
        self.consumer = consumer
        self._results_max = results_max
        self.redis = keep_repeated_fields(redis_client)  # the read ahead sees a repeated field name
        # redis.durability: each save (state, job results and XACK) returns only once it is as durable
        # as the level says (docs/queue.md "Durability").
        self._durability = durability or resolve_durability("", wait_replicas, wait_timeout)
        self._keys = keys
        self.shard = shard
        self.token = token
        self._owner = keys.shard_state(shard, "owner")
        self._jobs = keys.shard_state(shard, "jobs")
        self._attempts = keys.shard_state(shard, "attempts")
        self._ended = keys.shard_state(shard, "ended")
        self._datasets = keys.shard_state(shard, DATASETS)
        self._counts = keys.shard_state(shard, COUNTS)
        self.stream = keys.events(shard)
        self._fixed_keys = [
            self._owner,
            self._jobs,
            self._attempts,
            self._ended,
            self.stream,
            keys.shard_state(shard, RESULTS_INDEX),
            self._datasets,
            self._counts,
        ]
        self._result_prefix = keys.job_result(shard, "")
        self._save = redis_client.register_script(_SAVE_LUA)
        self.script_sha: str = self._save.sha

    async def check_owner(self) -> None:
        """Return if the owner token is still ours; raise Fenced otherwise."""
        with redis_errors("GET owner"):
            current = await self.redis.get(self._owner)
        if current != self.token:
            raise Fenced(f"shard {self.shard} is now owned by {current!r}, not {self.token!r}")

    async def load(self) -> ShardJobs:
        """Return the shard's persisted state (open jobs, their datasets and attempts, ended jobs),
        and write the shard's counts (``state:counts``) whole from it.

        A v1 shard (job records with their datasets inside) is migrated here: one
        save, fenced like any other, writes each such job as v2 and its datasets as
        their own records; dataset records of no open job (its record deleted by an
        operator) are dropped by the same save.

        Raises:
            ShardStateUnreadable: a record does not decode, or has a version
                this code does not read (the shard must be set aside).
            Fenced: the shard is no longer ours (nothing written).
            TransientError: Redis unavailable.
        """
        jobs = await self._hash(self._jobs)
        datasets = await self._hash(self._datasets)
        attempts = await self._hash(self._attempts)
        ended = await self._hash(self._ended)
        state = ShardJobs()
        old: list[JobMeta] = []
        for name, raw in jobs.items():
            meta = self._decode(_meta_dec, self._jobs, name, raw)
            if meta.v == STATE_VERSION:
                state.add_job(msgspec.structs.replace(meta, datasets={}))
            else:
                old.append(meta)
        for key, raw in attempts.items():
            parts = as_text(key).split("/")
            if len(parts) != 4:
                raise ShardStateUnreadable(
                    self.shard, self._attempts, key, "field is not <job>/<dataset>/<task>/<attempt>"
                )
            state.load_attempt(parts[0], parts[1], self._decode(_attempt_dec, self._attempts, key, raw))
        fix = Batch()
        migrating = {meta.job for meta in old}
        for key, raw in datasets.items():
            job, slash, dataset = as_text(key).partition("/")
            if not slash or not dataset or "/" in dataset:
                raise ShardStateUnreadable(self.shard, self._datasets, key, "field is not <job>/<dataset>")
            ds = self._decode(_dataset_dec, self._datasets, key, raw)
            if ds.v != STATE_VERSION:
                why = f"record version {ds.v}, this worker reads v{STATE_VERSION}"
                raise ShardStateUnreadable(self.shard, self._datasets, key, why)
            if job in state.jobs:
                state.put(job, dataset, ds)
            elif job not in migrating:  # (a v1 job's come from its record)
                fix.drop_datasets.append(as_text(key))
        for name, raw in ended.items():
            state.ended[as_text(name)] = self._decode(_ended_dec, self._ended, name, raw)
        for meta in _migrated(old, state.seq):
            state.add_job(meta)
            fix.jobs.add(meta.job)
            fix.datasets.update((meta.job, d) for d in meta.datasets)
        if not fix.empty():
            await self.save(fix, state)
        await self._recount(state)
        return state

    async def _recount(self, state: ShardJobs) -> None:
        """Write the shard's counts whole from ``state`` as loaded, if the shard is still ours.

        Raises:
            Fenced: it is not (nothing written).
            TransientError: Redis unavailable.
        """
        flat = [x for pair in status_counts(state).items() for x in pair]
        durability = self._durability
        with redis_errors("write shard counts"):
            if not durability.waits:
                reply = await self.redis.eval(_RECOUNT_LUA, 2, self._owner, self._counts, self.token, *flat)
            else:
                # Like every durable write: the level's wait right behind it, on its connection.
                if is_cluster(self.redis):
                    await self.redis.initialize()  # the slot map routes the wait
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.eval(_RECOUNT_LUA, 2, self._owner, self._counts, self.token, *flat)
                    waits = queue_durable(self.redis, pipe, [self._counts], durability)
                    replies = list(await pipe.execute(raise_on_error=False))
                reply = replies[0]
                if isinstance(reply, BaseException):
                    raise reply
                if reply == 1:
                    for r in replies[1:]:
                        if isinstance(r, BaseException):
                            raise r
                    check_durable(replies, waits, durability, client=self.redis)
        self.check_saved(reply)

    async def _hash(self, key: str) -> dict[bytes | str, bytes | str]:
        with redis_errors("load shard state"):
            try:
                return dict(await self.redis.hgetall(key))
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
        if rec.v not in READS:
            raise ShardStateUnreadable(
                self.shard, key, field, f"record version {rec.v}, this worker reads v{STATE_VERSION}"
            )
        return rec

    async def save(self, batch: Batch, state: ShardJobs, *, read_next: int = 0) -> list[Entry]:
        """Write ``batch`` (job metadata as ``state`` has it now) and acknowledge its
        messages atomically, if we still own the shard.

        Callers serialise saves of one shard, so a later save never carries
        older metadata than an earlier one.

        Returns:
            With ``read_next`` > 0 (and a non-empty batch), up to that many new
            entries of the shard's stream, read for the store's consumer by a
            ``XREADGROUP`` pipelined behind the save (one round trip): they
            are pending to it from then on, like the entries of any read. A
            read that fails (the group deleted, say) returns nothing and
            leaves the problem to the next plain read. Else an empty list.

        Raises:
            Fenced: the owner token changed: nothing was written or
                acknowledged. The pipelined read may still have taken entries
                (not returned): they are pending to our consumer, and the
                owner takes them over on its next tick, like those a frozen
                worker reads before it notices it was fenced.
            TransientError: Redis unavailable (nothing, or everything, was written:
                the script is atomic, and every write here is idempotent; entries
                read stay pending to the consumer).
        """
        if read_next and not self.consumer:
            raise ValueError("reading ahead needs the store's consumer name")
        if batch.empty():
            return []
        prep = self.prepare(batch, state)
        ahead: list[Entry] = []
        with redis_errors("save shard state"):
            if read_next or self._durability.waits:
                reply, ahead = await self._save_and_read(prep, read_next)
            else:
                reply = await self.run_script(prep)
        self.check_saved(reply)
        return ahead

    def prepare(self, batch: Batch, state: ShardJobs) -> Prepared:
        """Return the save of ``batch`` encoded now: job metadata and ends as ``state`` has them
        at this call (a later change of ``state`` is not in it). Never raises."""
        jobs: list[str] = []
        for j in batch.jobs:
            meta = state.jobs.get(j)
            if meta is not None:  # the job's own fields: its datasets are records of their own
                jobs += (j, _enc.encode(msgspec.structs.replace(meta, datasets={})).decode())
        datasets: list[str] = []
        for j, name in batch.datasets:
            meta = state.jobs.get(j)
            ds = meta.datasets.get(name) if meta is not None else None
            if ds is not None:
                datasets += (dataset_field(j, name), _enc.encode(ds).decode())
        attempts: list[str] = []
        add, encode = attempts.extend, _enc.encode  # per event: bound once
        for (job, dataset, task, number), attempt in batch.attempts.items():
            add((attempt_field(job, dataset, task, number), encode(attempt).decode()))
        ended: list[str] = []
        ended_names: list[str] = []
        for j in batch.ended:
            rec = state.ended.get(j)
            if rec is not None:
                ended += (j, _enc.encode(rec).decode())
                ended_names.append(j)
        per_job: dict[str, list[str]] = {}
        for (job, dataset), result in batch.results.items():
            per_job.setdefault(job, []).extend((dataset, encode_result(result).decode()))
        # Stream ids are ASCII; msgpack "str" is what Redis's cmsgpack reads (it has no "bin").
        ack = [i.decode("ascii") for i in batch.ack]
        results = list(per_job.values())
        blob = _pack(
            [
                jobs,
                attempts,
                ended,
                ended_names,
                batch.drop_attempts,
                ack,
                results,
                list(per_job),
                datasets,
                batch.drop_datasets,
            ]
        )
        keys = [*self._fixed_keys, *(self._keys.job_result(self.shard, job) for job in per_job)]
        args: list[bytes | str | int] = [self.token, DEFAULT_GROUP, RESULT_RETENTION_S, blob]
        args += [self._results_max, int(time.time() * 1000), self._result_prefix]
        return Prepared(keys, args)

    async def run_script(self, prep: Prepared) -> object:
        """Run the save script (loading it first when Redis lost it); return its reply (see ``check_saved``).

        Raises: a redis-py error (callers map it with ``redis_errors``)."""
        return await self._save(keys=prep.keys, args=prep.args)

    async def settle(self, prep: Prepared, reply: object) -> object:
        """Return the reply of ``prep``'s script sent without raising on errors (a pipeline's):
        as it was, or from running the script again when Redis did not know it (NOSCRIPT:
        restarted, or its scripts flushed; the writes are idempotent).

        Raises: the script's own error (a redis-py exception; callers map it with ``redis_errors``).
        """
        if isinstance(reply, rx.NoScriptError):
            return await self.run_script(prep)  # loads it first
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def check_saved(self, reply: object) -> None:
        """Return if the save script's ``reply`` says it wrote; raise Fenced when it found another owner."""
        if reply != 1:
            raise Fenced(f"shard {self.shard} is now owned by {reply!r}, not {self.token!r}")

    @property
    def sends_ahead(self) -> bool:
        """True when a save can be sent ahead (``workers._save_pipe``): a plain Redis client, a
        consumer to read for, and durability ``memory`` (nothing to wait for after each save)."""
        return (
            bool(self.consumer) and not self._durability.waits and isinstance(self.redis, redis.asyncio.Redis)
        )

    async def _save_and_read(self, prep: Prepared, count: int) -> tuple[object, list[Entry]]:
        """Return the save script's reply and, with ``count`` > 0, the entries of an XREADGROUP sent
        right behind it; with a durability level, the level's wait follows, on the same connection
        (one round trip), and a save that wrote returns only once it is as durable as the level says.

        The wait comes after a one-byte write of the shard's marker key: when this save wrote
        nothing new (an earlier try, on another connection, wrote it and its reply was lost), the
        wait still covers that try, since the log it waits on is one ordered log per master.

        Raises: the script's own error (a redis-py exception; a refused WAITAOF one too); a failed
        read is an empty list; TransientError when the wait fell short (the save is idempotent).
        """
        durability = self._durability
        if durability.waits and is_cluster(self.redis):
            await self.redis.initialize()  # the slot map routes the wait
        replies = await self._pipelined(prep, count)
        read = replies[1] if count else None
        ahead = [] if read is None or isinstance(read, BaseException) else entries_from_reply(read)
        read_replies = 1 if count else 0
        if isinstance(replies[0], rx.NoScriptError):
            # Redis did not know the script (restarted, or its scripts flushed): nothing was written
            # and the wait covered nothing. Load it and save again, the wait behind it as before.
            await self.redis.script_load(_SAVE_LUA)
            replies = await self._pipelined(prep, 0)
            read_replies = 0
        saved = await self.settle(prep, replies[0])
        waits = len(replies) - 1 - read_replies - 1  # after the script (and the read): the SET, the waits
        if saved == 1 and durability.waits:
            for reply in replies[-waits - 1 :]:  # the marker's SET, then the waits
                if isinstance(reply, BaseException):
                    raise reply
            check_durable(replies, waits, durability, client=self.redis)
        return saved, ahead

    async def _pipelined(self, prep: Prepared, count: int) -> list[object]:
        """Return the replies (errors included) of the save script, the read behind it (``count`` > 0)
        and, with a durability level, the marker's one-byte write and the level's waits."""
        durability = self._durability
        async with self.redis.pipeline(transaction=False) as pipe:
            if is_cluster(self.redis):
                # redis-py refuses EVALSHA in a cluster pipeline; the script's text it sends as is.
                pipe.eval(_SAVE_LUA, len(prep.keys), *prep.keys, *prep.args)
            else:
                pipe.evalsha(self.script_sha, len(prep.keys), *prep.keys, *prep.args)
            if count:
                pipe.xreadgroup(DEFAULT_GROUP, self.consumer, {self.stream: ">"}, count=count)
            if durability.waits:
                marker = self._keys.shard_state(self.shard, "wait")
                pipe.set(marker, b"1")
                queue_durable(self.redis, pipe, [marker], durability)
            return list(await pipe.execute(raise_on_error=False))

    async def forget_ended(self, jobs: Iterable[str]) -> None:
        """Drop the records of ended jobs past their retention."""
        names = list(jobs)
        if names:
            with redis_errors("HDEL ended"):
                await self.redis.hdel(self._ended, *names)


def _migrated(old: list[JobMeta], seq: int) -> list[JobMeta]:
    """Return v1 job records as v2 ones, each finished dataset given a ``fin`` above ``seq``.

    v1 did not record the order the jobs finished in: the order they opened on
    the shard (then their names) stands in for it, one ``fin`` per job.
    """
    out: list[JobMeta] = []
    for meta in sorted(old, key=lambda m: (m.opened_at, m.job)):
        seq += 1
        datasets = {
            name: msgspec.structs.replace(ds, v=STATE_VERSION, fin=seq if ds.expected is not None else 0)
            for name, ds in meta.datasets.items()
        }
        out.append(msgspec.structs.replace(meta, v=STATE_VERSION, datasets=datasets))
    return out


def dataset_fields(state: ShardJobs, job: str) -> list[str]:
    """Return the Redis hash fields of every dataset record of ``job`` (dropped when the job ends)."""
    meta = state.jobs.get(job)
    return [] if meta is None else [dataset_field(job, name) for name in meta.datasets]


def attempt_fields(state: ShardJobs, job: str) -> Sequence[str]:
    """Return the Redis hash fields of every attempt recorded for ``job``."""
    return [
        attempt_field(job, dataset, a.task, a.attempt)
        for (_job, dataset), per_task in state.attempts_of(job).items()
        for per_attempt in per_task.values()
        for a in per_attempt.values()
    ]
