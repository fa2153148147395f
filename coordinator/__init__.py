"""The commitfleet coordinator: leader election and shard assignment (``_coordinator``).

Its rooms: ``admin`` (the HTTP API, metrics, status document and web console the
coordinator serves), ``cli`` (the ``commitfleet`` command line), ``demo`` and ``bench``.

The names are imported when first used (PEP 562), so that ``commitfleet status`` and
``--help``, which import ``coordinator.cli``, do not load the coordinator's HTTP server
(aiohttp, prometheus_client) and the commit core they never use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared import lazy_exports

if TYPE_CHECKING:
    from ._coordinator import Coordinator, run_coordinator
    from .admin import fleet_summary

_WHERE = {
    "Coordinator": "._coordinator",
    "run_coordinator": "._coordinator",
    "fleet_summary": ".admin._status",
}

__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = ["Coordinator", "fleet_summary", "run_coordinator"]
