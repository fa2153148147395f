"""commitfleet's shared contract and libraries: errors, settings, storage, locks,
events, commit core, queue and the Spark producer side."""

from ._errors import (
    BadInput,
    CommitfleetError,
    ConfigError,
    Fenced,
    LockLost,
    LockTimeout,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    Throttled,
    TransientError,
)
from ._retry import RetryPolicy, retry
from .settings import Secret, Settings, load_settings

__all__ = [
    "BadInput",
    "CommitfleetError",
    "ConfigError",
    "Fenced",
    "LockLost",
    "LockTimeout",
    "NotFound",
    "OutcomeUnknown",
    "PreconditionFailed",
    "RetryPolicy",
    "Secret",
    "Settings",
    "Throttled",
    "TransientError",
    "load_settings",
    "retry",
]
