"""The commitfleet coordinator (leader election, shard assignment, admin API) and the CLI."""

from ._coordinator import Coordinator, run_coordinator
from ._status import fleet_status

__all__ = ["Coordinator", "fleet_status", "run_coordinator"]
