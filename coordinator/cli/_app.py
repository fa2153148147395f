"""The ``commitfleet`` command line (Typer + Rich): the application, made of its command groups.

Every command reads its settings once (``--config FILE`` or
``COMMITFLEET_CONFIG``, then ``COMMITFLEET_*`` variables, ``REDIS_URL`` and
``COMMITFLEET_STORE``) into one frozen :class:`~shared.Settings`. The shard
count comes from the fleet's record in Redis; ``fleet.shards``, when set, must
agree with it.

Exit codes: 0 done (or a worker or coordinator stopped by SIGTERM/SIGINT); 1 the command failed (an
audit violation, an operator request that did not apply); 2 a bad setting
(one line on stderr); 3 a service could not be reached (operator commands; a
worker or coordinator waits for Redis instead); 4 ``job`` / ``dataset``: no such job or dataset;
70 a worker or coordinator crashed on an unexpected error (the traceback is in its log);
130 / 143 ``demo`` or ``bench`` stopped by SIGINT / SIGTERM (after stopping every process it started).
"""

from __future__ import annotations

import sys

import typer

from shared import CommitfleetError

from . import _lookup, _ops, _processes, _stream, _tools
from ._common import err

app = typer.Typer(
    name="commitfleet",
    help="Exactly-once commits for Spark pipelines over Redis Streams and object storage.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# The order of --help: the processes, the operator commands, the tools.
for group in (_processes, _ops, _lookup, _stream, _tools):
    group.register(app)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except CommitfleetError as exc:  # anything our code raises that a command did not handle
        err.print(f"commitfleet: {type(exc).__name__}: {exc}", markup=False, highlight=False)
        sys.exit(1)


__all__ = ["app", "main"]
