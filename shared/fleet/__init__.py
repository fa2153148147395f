"""Fleet records shared by workers and coordinators: membership, shard assignment, handoffs."""

from ._assignment import Assignment, Slot, balanced_targets, moved_count, rebalance
from ._registry import FleetRegistry, WorkerInfo, new_worker_id, worker_info

__all__ = [
    "Assignment",
    "FleetRegistry",
    "Slot",
    "WorkerInfo",
    "balanced_targets",
    "moved_count",
    "new_worker_id",
    "rebalance",
    "worker_info",
]
