"""Redis key names of a fleet, in one place.

Every key of one shard carries the hash tag ``{s<shard>}``, so all of a shard's
keys live in one Redis Cluster slot and shard-local MULTI/EXEC and Lua scripts
work on a cluster too. Fleet-level keys carry no tag.

Layout (``<fleet>`` is the fleet name, ``<n>`` the shard number)::

    cf:<fleet>:{s<n>}:events        the shard's event stream (consumer group "workers")
    cf:<fleet>:{s<n>}:dead          the shard's dead-letter stream
    cf:<fleet>:{s<n>}:state:<name>  shard-local state owned by the shard's worker
    cf:<fleet>:{s<n>}:alive:<job>   a job's liveness key: refreshed with a TTL by its driver
    cf:<fleet>:{s<n>}:result:<job>  hash dataset -> outcome of a job's datasets on the shard (expires)
    cf:<fleet>:meta                 hash: shards, created_at
    cf:<fleet>:admin                the capped admin event stream
    cf:<fleet>:{cf:<fleet>:admin}:outcome-markers
                                    hash "<dataset>/<job>" -> the admin outcome marker (capped)
    cf:<fleet>:{cf:<fleet>:admin}:outcome-order
                                    stream of the markers' fields, oldest first (their eviction order)
    cf:<fleet>:{cf:<fleet>:admin}:outcome:<dataset>/<job>
                                    a marker as older versions wrote it (read, never written; expires)
    cf:<fleet>:{cf:<fleet>:admin}:outcomes
                                    hash: exact committed / aborted counts
    cf:<fleet>:workers              fleet membership (owned by the fleet code)
    cf:<fleet>:<name>               any other fleet-level key (see Keys.fleet_key)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FLEET_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Braces would open another hash tag and colons would make names ambiguous.
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


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
        """Return the fleet membership key (its structure belongs to the fleet code)."""
        return f"{self.prefix}:workers"

    @property
    def admin_tag(self) -> str:
        """Return ``{cf:<fleet>:admin}``: the hash tag of the admin stream's slot."""
        return "{" + self.admin + "}"

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
        """Return a further fleet-level key ``cf:<fleet>:<name>``.

        ``name`` is 1-128 letters, digits, ``_``, ``.`` or ``-`` and must not be
        one of the names above; raises ValueError otherwise.
        """
        if not _NAME_RE.match(name) or name in ("meta", "admin", "workers"):
            raise ValueError(f"bad fleet key name {name!r}")
        return f"{self.prefix}:{name}"


__all__ = ["Keys"]
