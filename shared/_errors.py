"""The one exception tree of commitfleet.

Every error the project raises on purpose derives from :class:`CommitfleetError`.
The tree is split by *cause*, because the cause decides what a caller does:

- :class:`TransientError`: try again (throttling, 5xx, connection reset, Redis
  restarting). Retry helpers retry exactly these.
- :class:`PreconditionFailed`: a conditional write lost a race (412, 409
  already-exists, stale version). Never retried blindly: re-read, then decide.
- :class:`NotFound`: the object or key is not there.
- :class:`LockLost`: the lock that protected some work is gone; the work stops.
- :class:`OutcomeUnknown`: a request may or may not have taken effect (timeout
  after sending). Re-read, never assume, never clean up on a guess.
- :class:`BadInput`: a message, key or argument that can never succeed
  (:class:`LinkRefused`: a symbolic link met by the local-files store).
- :class:`ConfigError`: a bad setting; the process stops at start.

Adapters translate their SDK's exceptions into these at the boundary and
nowhere else.
"""

from __future__ import annotations


class CommitfleetError(Exception):
    """Root of every error commitfleet raises on purpose."""


class TransientError(CommitfleetError):
    """A failure that may go away on its own; retrying is safe and useful."""


class Throttled(TransientError):
    """The service asked us to slow down (429, SlowDown, 503)."""


class PreconditionFailed(CommitfleetError):
    """A conditional write was refused: the object exists, or its version moved."""


class NotFound(CommitfleetError):
    """The object, key or record does not exist."""


class LockLost(CommitfleetError):
    """The lock protecting a piece of work was lost (renew refused or lease ran out)."""


class Fenced(LockLost):
    """A newer lock holder (higher epoch) exists; this holder must stop at once."""


class LockTimeout(CommitfleetError):
    """The lock could not be acquired within the caller's deadline."""


class OutcomeUnknown(CommitfleetError):
    """A request was sent but its effect is unknown (timeout after sending)."""


class BadInput(CommitfleetError):
    """Input that can never succeed: malformed message, unsafe path, bad argument."""


class LinkRefused(BadInput):
    """A symbolic link where the local store expected an object or a folder of a key.

    The local-files store never follows a link (it could lead out of its root):
    reading, writing, copying, deleting or listing through one is refused.
    """


class ConfigError(CommitfleetError):
    """A setting is missing or invalid; the process must stop at start."""


__all__ = [
    "BadInput",
    "CommitfleetError",
    "ConfigError",
    "Fenced",
    "LinkRefused",
    "LockLost",
    "LockTimeout",
    "NotFound",
    "OutcomeUnknown",
    "PreconditionFailed",
    "Throttled",
    "TransientError",
]
