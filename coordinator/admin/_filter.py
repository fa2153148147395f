"""The admin event filter of ``GET /events``, ``GET /events/recent`` and ``commitfleet events``.

Kept free of aiohttp: the CLI imports it.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared import BadInput
from shared.events import ADMIN_EVENT_TYPES, AdminEvent, InvalidMessage, check_dataset_segment, check_job


def event_types(values: Iterable[str]) -> set[str]:
    """Return the admin event types named by ``values``: each a type or a comma-separated list of them.

    ``--type committed,aborted``, ``-t committed -t aborted`` and ``?type=committed,aborted``
    all name the same two types; an empty result means no filter.

    Raises:
        BadInput: a name that is no admin event type (it would filter out every event),
            with the known types in the message.
    """
    names = {t.strip() for v in values for t in v.split(",") if t.strip()}
    unknown = sorted(names - ADMIN_EVENT_TYPES.keys())
    if unknown:
        shown = ", ".join(repr(u[:40]) for u in unknown[:5])
        known = ", ".join(sorted(ADMIN_EVENT_TYPES))
        raise BadInput(f"unknown admin event type(s) {shown}; known: {known}")
    return names


def filter_names(dataset: str | None, job: str | None) -> None:
    """Check the dataset and job a filter names (None = no filter). Returns None.

    A name no event can carry would match nothing: it is refused instead.

    Raises:
        BadInput: not a dataset name segment (1..128 characters, letter or digit first)
            or not a job id.
    """
    try:
        if dataset is not None:
            check_dataset_segment(dataset)
        if job is not None:
            check_job(job)
    except InvalidMessage as exc:
        raise BadInput(exc.detail) from None


def event_matches(ev: AdminEvent, *, types: set[str], dataset: str | None, job: str | None) -> bool:
    """Return True when ``ev`` passes the filters (empty/None = no filter).

    An event names a dataset by its ``dataset`` field, or in its ``datasets``
    (``job_timed_out``: the datasets it aborted; ``stream_reset``: those reset).
    """
    if types and str(type(ev).__struct_config__.tag) not in types:
        return False
    if (
        dataset is not None
        and getattr(ev, "dataset", None) != dataset
        and dataset not in getattr(ev, "datasets", ())
    ):
        return False
    return job is None or getattr(ev, "job", None) == job


__all__ = ["event_matches", "event_types", "filter_names"]
