"""Redis key names of a fleet, in one place.

The layout is made for Redis Cluster, where a transaction, a Lua script or a
multi-key command (MGET) must touch keys of one hash slot only:

- every key of one shard carries the hash tag ``{s<shard>}``, so all of a
  shard's keys live in one slot (its stream, state, results, liveness keys);
- every fleet-wide key that any multi-key operation needs carries the fleet
  tag ``{cf:<fleet>:admin}``, whose slot is also the admin stream's (the
  admin stream's own name hashes whole, and ``cf:<fleet>:admin`` is its tag);
- ``cf:<fleet>:meta`` keeps its untagged name: it is part of the producer
  contract (``HGET cf:<fleet>:meta shards``) and only ever used alone.

:meth:`Keys.one_slot` is the guard callers use for their multi-key calls,
and ``tests/unit/test_keys_slots.py`` proves the rule for every builder.

Layout (``<fleet>`` is the fleet name, ``<n>`` the shard number, ``{F}`` the
fleet tag ``{cf:<fleet>:admin}``)::

    cf:<fleet>:{s<n>}:events        the shard's event stream (consumer group "workers")
    cf:<fleet>:{s<n>}:dead          the shard's dead-letter stream
    cf:<fleet>:{s<n>}:state:<name>  shard-local state owned by the shard's worker
    cf:<fleet>:{s<n>}:alive:<job>   a job's liveness key: refreshed with a TTL by its driver
    cf:<fleet>:{s<n>}:result:<job>  hash dataset -> outcome of a job's datasets on the shard (expires)
    cf:<fleet>:meta                 hash: shards, created_at (untagged: single-key use only)
    cf:<fleet>:admin                the capped admin event stream (slot of {F})
    cf:<fleet>:{F}:outcome-markers  hash "<dataset>/<job>" -> the admin outcome marker (capped)
    cf:<fleet>:{F}:outcome-order    stream of the markers' fields, oldest first (their eviction order)
    cf:<fleet>:{F}:outcome:<dataset>/<job>
                                    a marker as older versions wrote it (read, never written; expires)
    cf:<fleet>:{F}:outcomes         hash: exact committed / aborted counts
    cf:<fleet>:{F}:workers          fleet membership (owned by the fleet code)
    cf:<fleet>:{F}:<name>           any other fleet-level key (see Keys.fleet_key): worker
                                    leases, assignment, handoffs, leader, metrics

Before this layout (storage format 1) ``workers`` and the ``fleet_key`` keys had
no tag (``cf:<fleet>:<name>``); see docs/queue.md "Redis Cluster" for moving a
fleet over.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from redis.crc import key_slot

_FLEET_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Braces would open another hash tag and colons would make names ambiguous.
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_RESERVED = frozenset({"meta", "admin", "workers", "outcomes", "outcome-markers", "outcome-order"})


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names of one fleet.

    Raises:
        ValueError: at construction when the fleet name is not 1-64 letters,
            digits, ``-`` or ``_``.
    """

    fleet: str

    def __post_init__(self) -> None:
        if not _FLEET_RE.match(self.fleet):
            raise ValueError(f"bad fleet name {self.fleet!r}: use 1-64 letters, digits, '-' or '_'")

    @property
    def prefix(self) -> str:
        """Return ``cf:<fleet>``, the prefix of every key of the fleet."""
        return f"cf:{self.fleet}"

    # -- shard-local keys (one hash tag per shard) --------------------------

    @staticmethod
    def shard_tag(shard: int) -> str:
        """Return the hash tag of a shard, ``{s<shard>}``."""
        if shard < 0:
            raise ValueError(f"bad shard {shard}")
        return f"{{s{shard}}}"

    def events(self, shard: int) -> str:
        """Return the name of the shard's event stream."""
        return f"{self.prefix}:{self.shard_tag(shard)}:events"

    def dead(self, shard: int) -> str:
        """Return the name of the shard's dead-letter stream."""
        return f"{self.prefix}:{self.shard_tag(shard)}:dead"

    def shard_state(self, shard: int, name: str) -> str:
        """Return the name of a shard-local state key (same slot as the shard's stream).

        ``name`` is 1-128 letters, digits, ``_``, ``.`` or ``-``; raises ValueError otherwise.
        """
        if not _NAME_RE.match(name):
            raise ValueError(f"bad state key name {name!r}")
        return f"{self.prefix}:{self.shard_tag(shard)}:state:{name}"

    def job_alive(self, shard: int, job: str) -> str:
        """Return the key a job's driver refreshes (``SET ... PX``) while it is alive, on one shard.

        The job id is not checked here (the contract's job pattern has no
        braces or colons); callers pass validated ids.
        """
        return f"{self.prefix}:{self.shard_tag(shard)}:alive:{job}"

    def job_result(self, shard: int, job: str) -> str:
        """Return the hash of the outcomes of a job's datasets on one shard (dataset -> result JSON)."""
        return f"{self.prefix}:{self.shard_tag(shard)}:result:{job}"

    # -- fleet-level keys ----------------------------------------------------

    @property
    def meta(self) -> str:
        """Return the fleet's meta hash (``shards``, ``created_at``)."""
        return f"{self.prefix}:meta"

    @property
    def admin(self) -> str:
        """Return the capped admin event stream."""
        return f"{self.prefix}:admin"

    @property
    def workers(self) -> str:
        """Return the fleet membership key (its structure belongs to the fleet code; fleet slot)."""
        return f"{self.prefix}:{self.fleet_tag}:workers"

    @property
    def fleet_tag(self) -> str:
        """Return ``{cf:<fleet>:admin}``: the hash tag of the fleet slot (the admin stream's slot)."""
        return "{" + self.admin + "}"

    @property
    def admin_tag(self) -> str:
        """Return the fleet tag (the admin stream's slot); kept as the admin code's name for it."""
        return self.fleet_tag

    @property
    def fleet_slot(self) -> int:
        """Return the Redis Cluster slot of every fleet-tagged key (and of the admin stream)."""
        return key_slot(self.admin.encode())

    def outcome_marker(self, dataset: str, job: str) -> str:
        """Return the key of the admin outcome marker of (``dataset``, ``job``).

        Set in the same script as the ``committed`` / ``aborted`` admin entry,
        so that exactly one is appended per (dataset, job); same slot as the
        admin stream. ``/`` separates the two (a dataset name has none).
        Raises ValueError when ``dataset`` holds a ``/`` or either is empty.
        """
        if not dataset or not job or "/" in dataset:
            raise ValueError(f"bad outcome marker names {dataset!r}, {job!r}")
        return f"{self.prefix}:{self.admin_tag}:outcome:{dataset}/{job}"

    @property
    def outcome_markers(self) -> str:
        """Return the hash of admin outcome markers (``<dataset>/<job>`` -> ``<outcome> <entry id>``)."""
        return f"{self.prefix}:{self.admin_tag}:outcome-markers"

    @property
    def outcome_order(self) -> str:
        """Return the stream that lists the markers' fields oldest first (what is forgotten first)."""
        return f"{self.prefix}:{self.admin_tag}:outcome-order"

    @property
    def outcome_counts(self) -> str:
        """Return the hash of exact ``committed`` / ``aborted`` counts (the admin stream's slot)."""
        return f"{self.prefix}:{self.admin_tag}:outcomes"

    def fleet_key(self, name: str) -> str:
        """Return a further fleet-level key ``cf:<fleet>:{F}:<name>`` (the fleet slot).

        ``name`` is 1-128 letters, digits, ``_``, ``.`` or ``-`` and must not be
        one of the names above; raises ValueError otherwise.
        """
        if not _NAME_RE.match(name) or name in _RESERVED:
            raise ValueError(f"bad fleet key name {name!r}")
        return f"{self.prefix}:{self.fleet_tag}:{name}"

    # -- the one-slot rule ---------------------------------------------------

    @staticmethod
    def slot(key: str | bytes) -> int:
        """Return the Redis Cluster hash slot of ``key`` (CRC16 of its hash tag, mod 16384)."""
        return key_slot(key.encode() if isinstance(key, str) else key)

    @classmethod
    def one_slot(cls, keys: Iterable[str]) -> list[str]:
        """Return ``keys`` as a list after checking that they all hash to one cluster slot.

        For every transaction, Lua script and multi-key command: on Redis
        Cluster they fail (CROSSSLOT) otherwise, on one node they would work
        and hide the bug; this check fails on both.

        Raises:
            ValueError: the keys span two or more slots (a programming error).
        """
        names = list(keys)
        slots = {cls.slot(k) for k in names}
        if len(slots) > 1:
            raise ValueError(f"keys of one command span {len(slots)} cluster slots: {names[:6]}")
        return names


__all__ = ["Keys"]
