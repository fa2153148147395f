"""The producer's table bindings: ``write_dataset(df, "orders", table="ns.orders")`` or ``delta=True``."""

from __future__ import annotations

import re
import typing

from .._errors import BadInput
from ..events import TableBinding, TableMode

_TABLE = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)+$")
_MODES: tuple[str, ...] = typing.get_args(TableMode)


def check_binding(dataset: str, table: str, mode: str) -> TableBinding:
    """Return the binding of ``dataset`` to ``table`` in ``mode``.

    Raises:
        BadInput: ``table`` is not ``namespace.name`` (letters, digits, '_'), or
            ``mode`` is not append, create or overwrite.
    """
    if not _TABLE.match(table):
        raise BadInput(f"dataset {dataset!r}: table {table!r} must be namespace.name (letters, digits, '_')")
    if mode not in _MODES:
        raise BadInput(f"dataset {dataset!r}: mode {mode!r} must be one of {', '.join(_MODES)}")
    return TableBinding(table=table, mode=mode)  # type: ignore[arg-type]


def check_delta_binding(dataset: str, mode: str) -> TableBinding:
    """Return the binding of ``dataset`` to the Delta table in its own folder, in ``mode``.

    Raises:
        BadInput: ``mode`` is not append, create or overwrite.
    """
    if mode not in _MODES:
        raise BadInput(f"dataset {dataset!r}: mode {mode!r} must be one of {', '.join(_MODES)}")
    return TableBinding(delta=True, mode=mode)  # type: ignore[arg-type]


__all__ = ["check_binding", "check_delta_binding"]
