"""The ``commitfleet`` command line: one module per command group.

``_processes`` (worker, coordinator), ``_ops`` (events, status, retry, skip,
wait, audit, schema; their async bodies in ``_ops_run``, ``_wait`` and
``_status_text``) and ``_tools`` (demo, bench, pack), put together in ``_app``.
"""

from ._app import app, main

__all__ = ["app", "main"]
