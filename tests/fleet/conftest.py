"""A fleet of real processes (coordinators and workers) for the fleet tests."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio

from shared.queue import AsyncPublisher, ensure_fleet
from shared.settings import secret_enc_hook
from shared.storage import open_store
from tests._support.emulators import MakeTarget
from tests._support.fleet import fleet_settings
from tests._support.process_fleet import Fleet
from tests._support.processes import fleet_processes, write_config


@pytest.fixture
def fleet_overrides() -> dict[str, Any]:
    """Per-test settings overrides (a test module may override this fixture)."""
    return {}


@pytest.fixture
def fleet_backend() -> str:
    """The store backend of the test fleet (parametrize it to run a test on an emulator)."""
    return "local"


@pytest.fixture
def process_log_dir(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    return d


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember each phase's report on the item, so fixtures can see a failed test."""
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


@pytest.fixture
async def fleet(
    request: pytest.FixtureRequest,
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
    process_log_dir: Path,
    fleet_overrides: dict[str, Any],
    fleet_backend: str,
    make_target: MakeTarget,
) -> AsyncIterator[Fleet]:
    """A fleet with nothing started yet; every process it starts is killed at the end."""
    overrides = dict(fleet_overrides)
    if fleet_backend != "local":
        target = make_target(fleet_backend)
        overrides["store"] = {
            **msgspec.to_builtins(target.settings, enc_hook=secret_enc_hook),
            "url": target.url,
        }
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, **overrides)
    config = write_config(settings, tmp_path / "fleet.toml")
    await ensure_fleet(redis_client, fleet_name, settings.fleet.shards)
    secret = settings.security.hmac_secret or None
    publisher = AsyncPublisher(redis_client, fleet_name, settings.fleet.shards, secret=secret)
    with fleet_processes(process_log_dir) as procs:
        # The test's own view of the store is never faulty, whatever the fleet's is.
        own = msgspec.structs.replace(settings.store, chaos_fault_rate=0.0)
        async with open_store(settings.store.url, own) as store:
            yield Fleet(settings, config, process_log_dir, store, redis_client, procs, publisher)
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            for p in procs:
                sys.stderr.write(f"\n===== {p.name} ({p.kind}) log =====\n{p.output()[-8000:]}\n")
