"""The coordinator's admin surface: the HTTP API, its metrics, the fleet's status document, the console.

The names are imported when first used (PEP 562): ``commitfleet status`` and
``commitfleet events`` read the status document and the event filter without
loading the HTTP server (aiohttp, prometheus_client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared import lazy_exports

if TYPE_CHECKING:
    from ._filter import event_matches, event_types, filter_names
    from ._http import AdminServer
    from ._open_work import OpenWorkFilter, OpenWorkPage, open_jobs_page, open_work_page
    from ._status import OpenJobs, fleet_summary, get_status

_WHERE = {
    "AdminServer": "._http",
    "event_matches": "._filter",
    "event_types": "._filter",
    "filter_names": "._filter",
    "OpenWorkFilter": "._open_work",
    "OpenWorkPage": "._open_work",
    "open_work_page": "._open_work",
    "open_jobs_page": "._open_work",
    "fleet_summary": "._status",
    "OpenJobs": "._status",
    "get_status": "._status",
}

__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = [
    "AdminServer",
    "OpenJobs",
    "OpenWorkFilter",
    "OpenWorkPage",
    "event_matches",
    "event_types",
    "filter_names",
    "fleet_summary",
    "get_status",
    "open_jobs_page",
    "open_work_page",
]
