"""The commitfleet coordinator (leader election, shard assignment, admin API) and the CLI.

The names are imported when first used (PEP 562), so that ``commitfleet status`` and
``--help``, which import ``coordinator._cli``, do not load the coordinator's HTTP server
(aiohttp, prometheus_client) and the commit core they never use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared._lazy import lazy_exports

if TYPE_CHECKING:
    from ._coordinator import Coordinator, run_coordinator
    from ._status import fleet_status

_WHERE = {"Coordinator": "._coordinator", "run_coordinator": "._coordinator", "fleet_status": "._status"}

__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = ["Coordinator", "fleet_status", "run_coordinator"]
