"""The commitfleet worker process: owned shards -> event intake -> commit / abort / recovery."""

from ._inflight import read_in_flight
from ._jobstate import STATE_VERSION, JobMeta
from ._worker import Worker, run_worker

__all__ = ["STATE_VERSION", "JobMeta", "Worker", "read_in_flight", "run_worker"]
