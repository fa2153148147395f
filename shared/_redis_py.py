"""Telling a failure of Redis, or of redis-py itself, from a bug in our code."""

from __future__ import annotations

import os

import redis
import redis.exceptions

_REDIS_PY = os.path.dirname(os.path.abspath(redis.__file__)) + os.sep

# What a best-effort Redis call catches; check each with is_redis_failure (AttributeError and
# LookupError are Redis failures only when raised inside redis-py; ours are bugs and must propagate).
CAUGHT = (redis.exceptions.RedisError, OSError, AttributeError, LookupError)


def raised_in_redis_py(exc: BaseException) -> bool:
    """Return True when the innermost frame of ``exc``'s traceback is redis-py's own code.

    redis-py can trip over a connection closed under it (seen on a cluster
    failover: ``'NoneType' object has no attribute 'writelines'`` from a send
    on a connection another task had just dropped): a lost connection, not our bug.
    Its cluster client can likewise look a slot up in a slot map that is empty
    or being rebuilt (KeyError, IndexError).
    """
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_REDIS_PY)


def is_redis_failure(exc: BaseException) -> bool:
    """Return True for a Redis error, an OS (socket) error, or an AttributeError or LookupError
    (KeyError, IndexError) raised inside redis-py; False for anything else (raised by our code: a bug).

    Meant for an exception caught as :data:`CAUGHT`: a caller re-raises when this returns False.
    """
    if isinstance(exc, AttributeError | LookupError):
        return raised_in_redis_py(exc)
    return isinstance(exc, redis.exceptions.RedisError | OSError)


__all__ = ["CAUGHT", "is_redis_failure", "raised_in_redis_py"]
