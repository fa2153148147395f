"""A test fleet of real processes: the handle the ``fleet`` fixture (tests/fleet/conftest.py) yields."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio

from coordinator._procs import FleetProcess
from shared import Settings
from shared.fleet import FleetRegistry
from shared.queue import AsyncPublisher, Keys
from shared.storage import ObjectStore


@dataclass
class Fleet:
    """Handles on a test fleet: its settings, store, Redis, and process starter."""

    settings: Settings
    config: Path
    log_dir: Path
    store: ObjectStore
    redis: redis.asyncio.Redis
    procs: list[FleetProcess]
    publisher: AsyncPublisher
    names: dict[str, FleetProcess] = field(default_factory=dict)

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.fleet.name)

    @property
    def registry(self) -> FleetRegistry:
        return FleetRegistry(self.redis, self.keys)

    def start(self, kind: str, name: str) -> FleetProcess:
        """Start a ``worker`` or ``coordinator`` process called ``name``."""
        p = FleetProcess(kind, name, self.config, self.log_dir)
        self.procs.append(p)
        self.names[name] = p
        return p

    async def owners_settled(self, workers: set[str]) -> bool:
        """Return True when exactly ``workers`` own every shard, none moving, tokens in place."""
        a = await self.registry.assignment(self.settings.fleet.shards)
        if any(s.owner not in workers or s.moving_to for s in a.slots):
            return False
        if set(a.owners()) != workers:
            return False
        tokens = await self.registry.owner_tokens(self.settings.fleet.shards)
        return all(
            t is not None and t.decode().split("@")[0] == s.owner
            for s, t in zip(a.slots, tokens, strict=True)
        )
