"""The coordinator's admin surface: the HTTP API, its metrics, the fleet's status document, the job and
dataset pages, the console.

The names are imported when first used (PEP 562): ``commitfleet status`` and
``commitfleet events`` read the status document and the event filter without
loading the HTTP server (aiohttp, prometheus_client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared import lazy_exports

if TYPE_CHECKING:
    from ._dataset_page import check_dataset_name, dataset_page
    from ._filter import event_matches, event_types, filter_names
    from ._http import AdminServer
    from ._job_page import check_job_name, job_page
    from ._open_work import OpenWorkFilter, OpenWorkPage, open_jobs_page, open_work_page
    from ._status import OpenJobs, fleet_summary, get_status

_WHERE = {
    "AdminServer": "._http",
    "check_dataset_name": "._dataset_page",
    "check_job_name": "._job_page",
    "dataset_page": "._dataset_page",
    "job_page": "._job_page",
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
    "check_dataset_name",
    "check_job_name",
    "dataset_page",
    "fleet_summary",
    "get_status",
    "job_page",
    "open_jobs_page",
    "open_work_page",
]
