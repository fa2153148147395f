"""The commitfleet coordinator (leader election, shard assignment, admin API) and the CLI.

The names are imported when first used (PEP 562), so that ``commitfleet status`` and
``--help``, which import ``coordinator._cli``, do not load the coordinator's HTTP server
(aiohttp, prometheus_client) and the commit core they never use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._coordinator import Coordinator, run_coordinator
    from ._status import fleet_status

_WHERE = {"Coordinator": "._coordinator", "run_coordinator": "._coordinator", "fleet_status": "._status"}


def __getattr__(name: str) -> Any:
    """Return the public name ``name``, importing its module on first use.

    Raises:
        AttributeError: no such public name.
    """
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)


__all__ = ["Coordinator", "fleet_status", "run_coordinator"]
