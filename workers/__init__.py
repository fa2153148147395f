"""The commitfleet worker process: owned shards -> event intake -> commit / abort / recovery.

The names are imported when first used (PEP 562): ``commitfleet status`` reads the
job-state records and the in-flight board without loading the worker itself (the commit
core, the storage adapters, the lock service).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared import lazy_exports

if TYPE_CHECKING:
    from ._core import READS, STATE_VERSION, STATUSES, DatasetState, JobMeta
    from ._heap import tune_gc
    from ._inflight import read_in_flight
    from ._probe import Probe
    from ._state_store import COUNTS
    from ._worker import Worker, run_worker

_WHERE = {
    "read_in_flight": "._inflight",
    "READS": "._core",
    "STATE_VERSION": "._core",
    "STATUSES": "._core",
    "COUNTS": "._state_store",
    "DatasetState": "._core",
    "JobMeta": "._core",
    "Probe": "._probe",
    "Worker": "._worker",
    "run_worker": "._worker",
    "tune_gc": "._heap",
}

__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = [
    "COUNTS",
    "READS",
    "STATE_VERSION",
    "STATUSES",
    "DatasetState",
    "JobMeta",
    "Probe",
    "Worker",
    "read_in_flight",
    "run_worker",
    "tune_gc",
]
