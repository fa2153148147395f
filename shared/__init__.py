"""commitfleet's shared contract and libraries: errors, settings, storage, locks,
events, commit core, queue and the Spark producer side."""

from ._aio import TaskGroup, cancel_until_done, raise_if_cancelling, run_shielded
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
from ._lazy import lazy_exports
from ._logging import configure_logging, kv
from ._nonce import nonce
from ._recent import GUESS_LIMIT, Recent
from ._retry import RetryPolicy, retry
from .settings import Durability, Secret, Settings, load_settings, resolve_durability

__all__ = [
    "GUESS_LIMIT",
    "Recent",
    "TaskGroup",
    "cancel_until_done",
    "configure_logging",
    "kv",
    "lazy_exports",
    "nonce",
    "raise_if_cancelling",
    "run_shielded",
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
    "Durability",
    "Secret",
    "Settings",
    "Throttled",
    "TransientError",
    "load_settings",
    "resolve_durability",
    "retry",
]
