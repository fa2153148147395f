"""Fleet processes for the tests: workers and coordinators as real OS processes.

The processes themselves are the product's launcher (``coordinator.demo``: what
the demo and the benchmarks start them with); this adds what a test needs around
them: :func:`fleet_processes`, which stops every one at the end and prints their
logs when the test failed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from coordinator.demo import FleetProcess, ThrowawayRedis, free_port, write_config


@contextmanager
def fleet_processes(log_dir: Path) -> Iterator[list[FleetProcess]]:
    """Collect processes started by the test; kill them all at the end (printing logs on failure)."""
    procs: list[FleetProcess] = []
    try:
        yield procs
    except BaseException:
        for p in procs:
            sys.stderr.write(f"\n===== {p.name} ({p.kind}) log =====\n{p.output()[-6000:]}\n")
        raise
    finally:
        for p in procs:
            p.close()


__all__ = ["FleetProcess", "ThrowawayRedis", "fleet_processes", "free_port", "write_config"]
