"""The durability level of the fleet's writes to Redis: ``redis.durability`` with ``redis.wait_replicas``.

A level says when a write the fleet's guarantees rest on (a producer's
publish, a worker's save-and-ack with its job results, an admin outcome and
its marker) counts as done:

- ``memory``: when the master has it (Redis's own acknowledgement);
- ``replicas``: when ``n`` replicas have it too (``WAIT n``);
- ``aof``: when the master has written it to its append-only file and fsynced
  it (``WAITAOF 1 0``, Redis 7.2+);
- ``aof+replicas``: both: the master fsynced it and ``n`` replicas fsynced it
  to their own append-only files (``WAITAOF 1 n``).

The rules that combine ``redis.durability`` with the older ``redis.wait_replicas``
(kept as an alias) are :func:`resolve_durability`'s; a contradiction is a
ValueError whose message is one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

DurabilityLevel = Literal["memory", "replicas", "aof", "aof+replicas"]
LEVELS: Final[tuple[str, ...]] = get_args(DurabilityLevel)


@dataclass(frozen=True, slots=True)
class Durability:
    """A resolved durability level: what each durable write waits for after it, and for how long.

    ``replicas`` is 0 for ``memory`` and ``aof``; ``timeout`` is the seconds
    one ``WAIT`` / ``WAITAOF`` may take (``redis.wait_timeout``).
    """

    level: DurabilityLevel = "memory"
    replicas: int = 0
    timeout: float = 1.0

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"unknown durability level {self.level!r}")
        wants_replicas = self.level in ("replicas", "aof+replicas")
        if wants_replicas != (self.replicas > 0) or self.replicas < 0:
            raise ValueError(f"durability {self.level!r} with {self.replicas} replicas")
        if not self.timeout > 0:
            raise ValueError("the durability timeout must be > 0 seconds")

    @property
    def waits(self) -> bool:
        """True when writes wait for something after Redis acknowledged them (every level but memory)."""
        return self.level != "memory"

    @property
    def aof(self) -> bool:
        """True when the master must fsync the write to its append-only file (``WAITAOF``)."""
        return self.level in ("aof", "aof+replicas")

    def command(self) -> tuple[str | int, ...]:
        """Return the command that waits after a write, its timeout last (milliseconds, at least 1).

        Raises:
            ValueError: the level is ``memory`` (nothing to wait for).
        """
        ms = max(1, int(self.timeout * 1000))
        if self.level == "replicas":
            return ("WAIT", self.replicas, ms)
        if self.aof:
            return ("WAITAOF", 1, self.replicas, ms)
        raise ValueError("durability 'memory' waits for nothing")

    def describe(self) -> str:
        """Return the level as settings would write it, with its replica count: ``replicas (2)``."""
        return f"{self.level} ({self.replicas})" if self.replicas else self.level


MEMORY: Final = Durability()


def resolve_durability(level: str, wait_replicas: int, wait_timeout: float = 1.0) -> Durability:
    """Return the :class:`Durability` that ``redis.durability`` and ``redis.wait_replicas`` describe.

    The rules (docs/queue.md, "Durability"):

    - ``level`` empty (not set): ``memory``, or ``replicas`` with ``wait_replicas``
      replicas when that is above 0 (the older setting alone, as before);
    - ``memory`` or ``aof`` with ``wait_replicas`` above 0: a contradiction
      (``aof+replicas`` / ``replicas`` say "and wait for replicas");
    - ``replicas`` or ``aof+replicas``: ``wait_replicas`` replicas, 1 when it is 0.

    Raises:
        ValueError: an unknown level, a negative count or timeout, or a contradiction (one line).
    """
    if wait_replicas < 0:
        raise ValueError("redis.wait_replicas must be >= 0")
    if not wait_timeout > 0:
        raise ValueError("redis.wait_timeout must be > 0 seconds")
    if level == "":
        if wait_replicas:
            return Durability("replicas", wait_replicas, wait_timeout)
        return Durability("memory", 0, wait_timeout)
    if level not in LEVELS:
        raise ValueError(f"redis.durability must be one of {', '.join(LEVELS)} (got {level!r})")
    if level in ("memory", "aof"):
        if wait_replicas:
            with_replicas = "aof+replicas" if level == "aof" else "replicas"
            raise ValueError(
                f'redis.durability = "{level}" waits for no replica, but redis.wait_replicas = '
                f'{wait_replicas}: set durability = "{with_replicas}", or wait_replicas = 0'
            )
        return Durability(level, 0, wait_timeout)  # type: ignore[arg-type]
    return Durability(level, wait_replicas or 1, wait_timeout)  # type: ignore[arg-type]


__all__ = ["LEVELS", "MEMORY", "Durability", "DurabilityLevel", "resolve_durability"]
