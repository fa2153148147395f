"""The pyiceberg catalog property names the table step sets (the catalog set-up and the file IO read them)."""

from __future__ import annotations

PY_IO_IMPL = "py-io-impl"
"""pyiceberg's property naming a catalog's file IO class."""
INNER_IO_IMPL = "commitfleet.io-impl"
"""The catalog property naming the file IO that the table step's IO wraps (``py-io-impl`` form)."""

__all__ = ["INNER_IO_IMPL", "PY_IO_IMPL"]
