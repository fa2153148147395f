"""The ``[tables]`` settings: the Iceberg catalog the commits of bound datasets land in (docs/tables.md)."""

from __future__ import annotations

from typing import Literal

import msgspec

from ._settings_section import _Section

TableMode = Literal["append", "create", "overwrite"]


class TableBindingSettings(_Section, frozen=True):
    """A fleet-level binding of one dataset to an Iceberg table (``namespace.name``)."""

    table: str
    mode: TableMode = "append"


class TablesSettings(_Section, frozen=True):
    """The Iceberg catalog the commits of bound datasets land in.

    ``catalog`` is a pyiceberg catalog type (``sql``: SQLAlchemy, SQLite as the
    embedded default; ``rest``, ``glue``, ``hive``); ``uri`` its address
    (empty with ``sql``: ``<store root>/_tables/catalog.db``, local stores
    only); ``warehouse`` where new tables' metadata goes (empty: the store's
    ``_tables/warehouse`` folder, so data and metadata share a store and its
    credentials); ``properties`` more pyiceberg catalog properties (REST
    token, Glue region...). ``bindings`` binds datasets fleet-wide (a job's
    own binding in ``job_started`` wins). ``call_timeout`` bounds how long a
    cancelled catalog step waits for its call in flight to end.
    """

    catalog: Literal["sql", "rest", "glue", "hive"] = "sql"
    name: str = "commitfleet"
    uri: str = ""
    warehouse: str = ""
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    bindings: dict[str, TableBindingSettings] = msgspec.field(default_factory=dict)
    call_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.catalog != "sql" and not self.uri and self.catalog != "glue":
            raise ValueError(f"tables.uri must be set for a {self.catalog} catalog")
        if self.call_timeout <= 0:
            raise ValueError("tables.call_timeout must be > 0")
        for dataset, b in self.bindings.items():
            if len(b.table.split(".")) < 2 or not all(b.table.split(".")):
                raise ValueError(f"tables.bindings.{dataset}.table must be namespace.name, got {b.table!r}")


__all__ = ["TableBindingSettings", "TableMode", "TablesSettings"]
