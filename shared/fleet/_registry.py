"""The fleet's shared records in Redis: membership, the assignment, handoffs, owner tokens.

Keys (``Keys.fleet_key`` / ``Keys.shard_state``)::

    cf:<fleet>:{F}:workers             set of registered worker ids
    cf:<fleet>:{F}:worker.<id>         the worker's lease (JSON WorkerInfo, expires after worker.lease)
    cf:<fleet>:{F}:assignment          hash {epoch, doc}: the Assignment, replaced by compare-and-swap
    cf:<fleet>:{F}:handoff             hash shard -> worker that confirmed it stopped the shard
    cf:<fleet>:{F}:leader              the leading coordinator's id (expires with its lease)
    cf:<fleet>:{s<n>}:state:owner      the shard's owner token "<worker>@<epoch>"

``{F}`` is the fleet tag (``Keys.fleet_tag``): membership and leases share one
Redis Cluster slot, so registration (a script) and the lease lookup (MGET) work
on a cluster.

A worker writes its own lease and its handoff confirmations; the leading
coordinator writes the assignment and the owner tokens. The owner token fences
a shard's Redis state: a worker writes shard state only while the token is the
one it started the shard with.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import time

import msgspec
import redis.asyncio

from .._errors import ConfigError
from ..queue import Keys, as_text, redis_errors
from ._assignment import Assignment

_ID_BAD = re.compile(r"[^A-Za-z0-9_.-]")


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker tells the fleet about itself (the value of its lease key)."""

    v: int = 1
    id: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    # Which process holds the id (fresh per process): two live processes given the same
    # id would share its owner tokens, which then fence neither. Empty: not told.
    instance: str = ""


_dec_info = msgspec.json.Decoder(WorkerInfo)
_dec_assignment = msgspec.json.Decoder(Assignment)
_enc = msgspec.json.Encoder()

# Replace the assignment only if its epoch is still the one we read.
_CAS_ASSIGNMENT = """
local cur = redis.call('HGET', KEYS[1], 'epoch')
if (cur or '0') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'epoch', ARGV[2], 'doc', ARGV[3])
return 1
"""


# Registration and its undoing, atomic, as scripts rather than MULTI/EXEC: one plain command
# on Redis Cluster too (redis-py 8.1's asyncio cluster transactions run each command through
# a private event loop on a thread, which can hang a process during a failover).
# KEYS: lease, member set (one slot: the fleet tag). ARGV: worker id, lease JSON, lease ms,
# our instance, an instance we may replace (found dead). A lease held by another instance
# (both told) is left alone and returned; else the lease is written and '' returned.
_OTHER_INSTANCE = """
local function other(cur)
  if ARGV[4] == '' then return false end
  local ok, doc = pcall(cjson.decode, cur)
  if not ok or type(doc) ~= 'table' or type(doc.instance) ~= 'string' then return false end
  return doc.instance ~= '' and doc.instance ~= ARGV[4] and doc.instance ~= ARGV[5]
end
"""
_REGISTER = (
    _OTHER_INSTANCE
    + """
local cur = redis.call('GET', KEYS[1])
if cur and other(cur) then return cur end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
return ''
"""
)
# Renewal: extend the lease only if it is still there and ours, and then make sure of the
# membership too (SADD is idempotent), so a live worker is a member after every heartbeat
# whatever removed it. KEYS and ARGV as _REGISTER. Returns 1 when renewed, else 0 (nothing
# written: the lease expired, or another instance holds the id now).
_RENEW = (
    _OTHER_INSTANCE
    + """
local cur = redis.call('GET', KEYS[1])
if not cur or other(cur) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3], 'XX')
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"""
)
_DEREGISTER = """
redis.call('DEL', KEYS[1])
return redis.call('SREM', KEYS[2], ARGV[1])
"""
# Forgetting expired members, atomic with the check that each lease is still gone: a worker
# that re-registered (SET lease + SADD) since the caller read the leases keeps its membership.
# KEYS: member set, then one lease key per ARGV worker id (one slot). Returns the ids removed.
_FORGET = """
local gone = {}
for i, wid in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 and redis.call('SREM', KEYS[1], wid) == 1 then
    gone[#gone + 1] = wid
  end
end
return gone
"""


def new_worker_id(prefix: str = "") -> str:
    """Return a fresh id ``<host>-<pid>-<random>`` (safe in key names), or ``<prefix>`` when given."""
    raw = prefix or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    wid = _ID_BAD.sub("-", raw)[:80]
    if not wid:
        raise ConfigError(f"bad worker id {prefix!r}")
    return wid


class FleetRegistry:
    """Typed access to the fleet's membership and assignment records."""

    def __init__(self, redis_client: redis.asyncio.Redis, keys: Keys) -> None:
        self._r = redis_client
        self.keys = keys
        self._assignment = keys.fleet_key("assignment")
        self._handoff = keys.fleet_key("handoff")
        self._leader = keys.fleet_key("leader")

    def _lease_key(self, worker: str) -> str:
        return self.keys.fleet_key(f"worker.{worker}")

    # -- membership -------------------------------------------------------------------

    async def register(self, info: WorkerInfo, lease: float, *, replacing: str = "") -> WorkerInfo | None:
        """Create or refresh the worker's lease and add it to the member set.

        ``replacing``: the instance of an earlier holder of the id known to be
        dead (its lease may be taken over before it expires).

        Returns:
            None when registered; else the lease of another live process holding
            the id (both told their instance), and nothing was written.
        """
        with redis_errors("register worker"):
            keys = Keys.one_slot([self._lease_key(info.id), self.keys.workers])
            holder = await self._r.eval(
                _REGISTER, 2, *keys, info.id, _enc.encode(info), int(lease * 1000), info.instance, replacing
            )
        if not holder:
            return None
        try:
            return _dec_info.decode(holder)
        except msgspec.DecodeError:
            # Refused all the same (nothing was written): a holder this version cannot read
            # in full is still another live process, named as far as it can be.
            return WorkerInfo(id=info.id, host="?", pid=0, started_at=0.0, heartbeat_at=0.0, instance="?")

    async def renew(self, info: WorkerInfo, lease: float) -> bool:
        """Extend the worker's lease and restore its membership; return False when the lease had expired
        or another process holds the id now (nothing written).

        One script: the lease is extended only if it is still there (and ours), and then
        the worker is put back in the member set should anything have taken
        it out (so a live worker is a member after each heartbeat). An expired
        lease means the fleet may have moved our shards: the caller
        re-registers (:meth:`register`) and carries on, fenced by owner tokens.
        """
        with redis_errors("renew worker lease"):
            keys = Keys.one_slot([self._lease_key(info.id), self.keys.workers])
            ok = await self._r.eval(
                _RENEW, 2, *keys, info.id, _enc.encode(info), int(lease * 1000), info.instance, ""
            )
        return bool(ok)

    async def deregister(self, worker: str) -> bool:
        """Remove the worker's lease and membership (safe to call twice).

        Returns:
            True when this call removed the member; False when it was not a
            member any more (the coordinator forgot it when its lease expired,
            and announced that departure itself: ``forget`` and this are one
            atomic ``SREM`` each, so exactly one of them removes it).
        """
        with redis_errors("deregister worker"):
            keys = Keys.one_slot([self._lease_key(worker), self.keys.workers])
            return bool(await self._r.eval(_DEREGISTER, 2, *keys, worker))

    async def members(self) -> tuple[dict[str, WorkerInfo], set[str]]:
        """Return (live workers by id, registered ids whose lease has expired)."""
        with redis_errors("read members"):
            ids = sorted(as_text(m) for m in await self._r.smembers(self.keys.workers))
            leases = Keys.one_slot(self._lease_key(w) for w in ids)
            values = await self._r.mget(leases) if ids else []
        live: dict[str, WorkerInfo] = {}
        dead: set[str] = set()
        for wid, raw in zip(ids, values, strict=True):
            if raw is None:
                dead.add(wid)
            else:
                live[wid] = _dec_info.decode(raw)
        return live, dead

    async def forget(self, workers: set[str]) -> set[str]:
        """Drop from the member set those of ``workers`` whose lease is still expired; return them.

        Only those this call removed are returned (a worker that deregistered
        meanwhile announced its own departure).

        The check and the removal are one script: a worker that re-registered
        after :meth:`members` saw its lease expired (a Redis failover can
        outlast a lease) stays a member. Removing it anyway left a worker
        whose lease renewals kept succeeding outside the member set, so the
        coordinator never gave it a shard again and the fleet stalled.

        Raises:
            TransientError: Redis is unreachable (nothing or everything was removed).
        """
        if not workers:
            return set()
        ids = sorted(workers)
        keys = Keys.one_slot([self.keys.workers, *(self._lease_key(w) for w in ids)])
        with redis_errors("forget workers"):
            removed = await self._r.eval(_FORGET, len(keys), *keys, *ids)
        return {as_text(w) for w in removed}

    # -- assignment -------------------------------------------------------------------

    async def assignment(self, shards: int) -> Assignment:
        """Return the assignment in force (an empty one for a new fleet).

        ``shards`` is the fleet's count, from its meta record (see
        :func:`shared.queue.join_fleet`).

        Raises:
            ConfigError: the stored assignment covers another number of shards.
            TransientError: Redis is unreachable.
        """
        with redis_errors("read assignment"):
            raw = await self._r.hget(self._assignment, "doc")
        if raw is None:
            return Assignment.empty(shards)
        a = _dec_assignment.decode(raw)
        if len(a.slots) != shards:
            raise ConfigError(
                f"the fleet has {shards} shards but its stored assignment covers {len(a.slots)} "
                f"({self._assignment} is stale or was edited)"
            )
        return a

    async def replace_assignment(self, before: Assignment, after: Assignment) -> bool:
        """Write ``after`` if the stored epoch is still ``before.epoch``; return whether it was written."""
        with redis_errors("write assignment"):
            ok = await self._r.eval(
                _CAS_ASSIGNMENT,
                1,
                self._assignment,
                str(before.epoch),
                str(after.epoch),
                _enc.encode(after),
            )
        return bool(ok)

    async def confirmations(self) -> dict[int, str]:
        """Return shard -> worker that confirmed it stopped the shard."""
        with redis_errors("read handoffs"):
            raw = await self._r.hgetall(self._handoff)
        return {int(k): as_text(v) for k, v in raw.items()}

    async def confirm_stopped(self, shard: int, worker: str) -> None:
        """Record that ``worker`` stopped ``shard`` (the first step of a handoff)."""
        with redis_errors("confirm handoff"):
            await self._r.hset(self._handoff, str(shard), worker)

    async def confirm_all_stopped(self, shards: list[int], worker: str) -> None:
        """Record that ``worker`` stopped each of ``shards``, in one write (a worker leaving hands
        back every shard it ran at once)."""
        if shards:
            with redis_errors("confirm handoffs"):
                await self._r.hset(self._handoff, mapping={str(s): worker for s in shards})

    async def clear_confirmations(self, shards: list[int]) -> None:
        """Forget handoff confirmations of shards whose move completed."""
        if shards:
            with redis_errors("clear handoffs"):
                await self._r.hdel(self._handoff, *[str(s) for s in shards])

    # -- owner tokens -----------------------------------------------------------------

    async def owner_tokens(self, shards: int) -> list[bytes | None]:
        """Return every shard's owner token (None where unset)."""
        with redis_errors("read owner tokens"):
            async with self._r.pipeline(transaction=False) as pipe:
                for s in range(shards):
                    pipe.get(self.keys.shard_state(s, "owner"))
                return list(await pipe.execute())

    async def set_owner_token(self, shard: int, owner: str, epoch: int) -> bytes:
        """Set the shard's owner token to ``<owner>@<epoch>`` and return it."""
        token = f"{owner}@{epoch}".encode()
        with redis_errors("set owner token"):
            await self._r.set(self.keys.shard_state(shard, "owner"), token)
        return token

    async def owner_token(self, shard: int) -> bytes | None:
        """Return the shard's owner token (None when unset)."""
        with redis_errors("read owner token"):
            value = await self._r.get(self.keys.shard_state(shard, "owner"))
        return value.encode() if isinstance(value, str) else value

    # -- leader -----------------------------------------------------------------------

    async def set_leader(self, coordinator: str, ttl: float) -> None:
        """Advertise the leading coordinator (for status displays)."""
        with redis_errors("set leader"):
            await self._r.set(self._leader, coordinator, px=int(ttl * 1000))

    async def leader(self) -> str | None:
        """Return the advertised leading coordinator, if any."""
        with redis_errors("read leader"):
            raw = await self._r.get(self._leader)
        return as_text(raw) if raw else None


def worker_info(worker: str, started_at: float, instance: str = "") -> WorkerInfo:
    """Return this process's WorkerInfo with a fresh heartbeat time."""
    return WorkerInfo(
        id=worker,
        host=socket.gethostname(),
        pid=os.getpid(),
        started_at=started_at,
        heartbeat_at=time.time(),
        instance=instance,
    )
