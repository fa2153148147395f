"""``commitfleet demo``: a local fleet, real PySpark jobs and the audit (``_demo``), and the
launcher of the local processes a demo or benchmark run starts (``_launcher``).

The names are imported when first used (PEP 562): a benchmark that only starts
processes does not load the demo (the commit core, the Spark producer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared import lazy_exports

if TYPE_CHECKING:
    from ._demo import run_demo
    from ._launcher import (
        FleetProcess,
        Interrupted,
        ThrowawayRedis,
        children_stopped,
        free_port,
        write_config,
    )

_WHERE = {
    "run_demo": "._demo",
    **dict.fromkeys(
        ("FleetProcess", "Interrupted", "ThrowawayRedis", "children_stopped", "free_port", "write_config"),
        "._launcher",
    ),
}

__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = [
    "FleetProcess",
    "Interrupted",
    "ThrowawayRedis",
    "children_stopped",
    "free_port",
    "run_demo",
    "write_config",
]
