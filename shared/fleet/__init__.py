"""Fleet records shared by workers and coordinators: membership, shard assignment, handoffs;
and the life of a fleet process: waiting for Redis at start, dying loudly on a fatal error."""

from ._assignment import Assignment, Slot, balanced_targets, moved_count, rebalance
from ._process import (
    EXIT_CRASHED,
    HARD_EXIT_AFTER_S,
    ProcessCrashed,
    ProcessTasks,
    ReportingTaskGroup,
    current_process,
    dump_tasks,
    startup_delay,
    unexpected,
    wait_until_up,
)
from ._registry import FleetRegistry, WorkerInfo, new_worker_id, worker_info

__all__ = [
    "EXIT_CRASHED",
    "HARD_EXIT_AFTER_S",
    "Assignment",
    "FleetRegistry",
    "ProcessCrashed",
    "ProcessTasks",
    "ReportingTaskGroup",
    "Slot",
    "WorkerInfo",
    "balanced_targets",
    "current_process",
    "dump_tasks",
    "moved_count",
    "new_worker_id",
    "rebalance",
    "startup_delay",
    "unexpected",
    "wait_until_up",
    "worker_info",
]
