"""The commitfleet worker process: owned shards -> event intake -> commit / abort / recovery."""

from ._worker import Worker, run_worker

__all__ = ["Worker", "run_worker"]
