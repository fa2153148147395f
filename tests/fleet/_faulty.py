"""``CF_TEST_FAULT=... python -m tests.fleet._faulty worker|coordinator ...``: the real CLI, a bug planted.

A test's way to make a real fleet process hit an unexpected error, without
any hook in the product: this launcher patches one method and then runs the
``commitfleet`` CLI as usual. ``CF_TEST_FAULT`` (read by this launcher only;
the product has no fault hook):

- ``raise``: the runner of the lowest shard this worker owns raises
  ``RuntimeError("planted fault")`` in its first tick.
- ``raise-and-hang``: the same, and the runner of every other shard hangs in
  its tick, swallowing every cancellation (a task that will not die).
- ``coordinator-step``: the leading coordinator's rebalance step raises
  ``RuntimeError("planted fault in the leader")``.

(``ShardRunner._tick`` runs at the start of every shard session, then every second.)
"""

from __future__ import annotations

import asyncio
import os

from coordinator._coordinator import Coordinator
from workers._shard import ShardRunner

FAULT = os.environ.get("CF_TEST_FAULT", "")
_started: set[int] = set()


async def _planted_tick(self: ShardRunner) -> None:
    _started.add(self.shard)
    # Give every owned shard's runner a moment to start, so "other shards" exist.
    await asyncio.sleep(0.5)
    if self.shard == min(_started):
        raise RuntimeError(f"planted fault in shard {self.shard}")
    if FAULT == "raise-and-hang":
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # the bug under test: a task that ignores cancellation


async def _planted_step(self: Coordinator, *args: object) -> None:
    raise RuntimeError("planted fault in the leader")


if FAULT in ("raise", "raise-and-hang"):
    ShardRunner._tick = _planted_tick  # type: ignore[method-assign]
elif FAULT == "coordinator-step":
    Coordinator._step = _planted_step  # type: ignore[method-assign]
else:
    raise SystemExit(f"unknown fault {FAULT!r}")

from coordinator._cli import main  # noqa: E402 - after the patch, as the CLI imports the worker lazily

main()
