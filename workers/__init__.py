"""The commitfleet worker process: owned shards -> event intake -> commit / abort / recovery."""

from ._jobstate import JobMeta
from ._worker import Worker, run_worker

__all__ = ["JobMeta", "Worker", "run_worker"]
