"""The Redis ACL rules of a worker (and coordinator) and a producer, as docs/queue.md "ACLs" gives them.

:data:`WORKER` and :data:`PRODUCER` are the commands each may run on Redis 7.0;
:data:`MODERN` what Redis 7.2+ adds to each (7.0's ``ACL SETUSER`` refuses those
names). :func:`rule` is the ``ACL SETUSER <user>`` arguments for a fleet,
:func:`setuser_line` the line the docs print. Tested by
tests/integration/test_acl.py and tests/e2e/test_spark_acl.py.
"""

from __future__ import annotations

# Every role: authenticate, name its connection, answer the durability check.
_CONNECTION = ["+ping", "+hello", "+client|setname", "+info"]
WORKER = [
    *_CONNECTION,
    "+eval",
    "+evalsha",
    "+script|load",
    "+get",
    "+set",
    "+del",
    "+mget",
    "+exists",
    "+expire",
    "+hget",
    "+hgetall",
    "+hset",
    "+hsetnx",
    "+hdel",
    "+hincrby",
    "+hkeys",
    "+hexists",
    "+hlen",
    "+hmget",
    "+hscan",
    "+pttl",
    "+sadd",
    "+srem",
    "+smembers",
    "+zadd",
    "+zrem",
    "+zcard",
    "+zrange",
    "+zrangebyscore",
    "+xadd",
    "+xack",
    "+xclaim",
    "+xdel",
    "+xlen",
    "+xrange",
    "+xrevrange",
    "+xread",
    "+xreadgroup",
    "+xtrim",
    "+xpending",
    "+xgroup|create",
    "+xgroup|delconsumer",
    "+xinfo|groups",
    "+xinfo|consumers",
    "+publish",
    "+subscribe",
    "+unsubscribe",
    "+wait",
]
PRODUCER = [
    *_CONNECTION,
    "+eval",
    "+hget",
    "+hsetnx",
    "+hgetall",
    "+hexists",
    "+xadd",
    "+set",
    "+hset",
    "+expire",
    "+multi",
    "+exec",
    "+wait",
]
# Redis 7.2+ only (7.0's ACL SETUSER refuses the names): redis-py names its library on each new
# connection there (CLIENT SETINFO; denied, it goes on, but the ACL log fills up), and the aof levels.
MODERN = ["+client|setinfo", "+waitaof"]


def rule(fleet: str, commands: list[str], *, channels: bool, modern: bool) -> list[str]:
    """Return the ``ACL SETUSER <user>`` arguments after the user name (the password left out)."""
    pattern = f"&cf:{fleet}:*" if channels else "resetchannels"
    return ["on", "resetkeys", f"~cf:{fleet}:*", pattern, "-@all", *commands, *(MODERN if modern else [])]


def setuser_line(user: str, args: list[str]) -> str:
    """Return the rule as docs/queue.md writes it: ``ACL SETUSER <user> reset >PASSWORD <args>``."""
    return " ".join(["ACL SETUSER", user, "reset", ">PASSWORD", *args])


__all__ = ["MODERN", "PRODUCER", "WORKER", "rule", "setuser_line"]
