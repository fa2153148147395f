"""The commitfleet worker process: owned shards -> event intake -> commit / abort / recovery.

The names are imported when first used (PEP 562): ``commitfleet status`` reads the
job-state records and the in-flight board without loading the worker itself (the commit
core, the storage adapters, the lock service).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._inflight import read_in_flight
    from ._jobstate import STATE_VERSION, JobMeta
    from ._worker import Worker, run_worker

_WHERE = {
    "read_in_flight": "._inflight",
    "STATE_VERSION": "._jobstate",
    "JobMeta": "._jobstate",
    "Worker": "._worker",
    "run_worker": "._worker",
}


def __getattr__(name: str) -> Any:
    """Return the public name ``name``, importing its module on first use.

    Raises:
        AttributeError: no such public name.
    """
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)


__all__ = ["STATE_VERSION", "JobMeta", "Worker", "read_in_flight", "run_worker"]
