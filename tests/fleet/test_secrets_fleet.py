"""A planted Redis password and signing key never show: not in logs, errors, status, events or dead letters.

The fleet runs as real processes against a ``redis-server`` whose password
holds the characters that used to break URL parsing (``#``, ``/``, ``@``,
``:``), signing on with v1 turned off. Operator requests that are unsigned,
forged or stale are refused by the worker that would act on them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest

from shared.events import (
    OperatorAction,
    encode_admin,
    entry_fields,
    sign_operator_request,
    sign_v2,
)
from shared.queue import read_admin_range, read_dead_letters, shard_of
from tests._support.cli import cli, cli_env
from tests._support.fleet_checks import admin_events, committed
from tests._support.fleet_jobs import good_job
from tests._support.process_fleet import Fleet
from tests._support.redis_server import RedisServer
from tests._support.wait import wait_for

PASSWORD = "s3cr#t/p@ss:w0rd?x%41 y"
WRONG = "wr0ng#pl@nted/pw"
HMAC_KEY = "hmac-planted-91c2e"
PLANTED = (PASSWORD, quote(PASSWORD, safe=""), "s3cr#t", "p@ss", WRONG, quote(WRONG, safe=""), HMAC_KEY)


@pytest.fixture
def redis_url(redis_factory: Callable[..., RedisServer]) -> str:
    """A password-protected server (the URL carries the password, percent-encoded)."""
    server = redis_factory(extra_args=["--requirepass", PASSWORD])
    return f"redis://:{quote(PASSWORD, safe='')}@127.0.0.1:{server.port}/0"


@pytest.fixture
def fleet_overrides() -> dict[str, Any]:
    return {
        "security": {"hmac_secret": HMAC_KEY, "accept_v1": False, "signature_max_age": 60.0},
        "log": {"level": "DEBUG", "format": "json"},
    }


def _leaks(text: str) -> list[str]:
    return [p for p in PLANTED if p in text]


async def test_a_planted_secret_shows_nowhere(fleet: Fleet, redis_url: str) -> None:
    assert fleet.settings.redis.password.reveal() == PASSWORD  # the URL's password reached the setting
    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns all")
    shards = fleet.settings.fleet.shards
    ds = "sales"
    shard = shard_of(ds, shards)
    stream = fleet.keys.events(shard)
    key = fleet.settings.security.hmac_secret.reveal_bytes()
    assert key is not None

    # A v2-signed job commits; a v1 entry (v1 is off here) and a stale v2 replay are dead-lettered.
    await fleet.publisher.publish_many(await good_job(fleet.store, "j-good", [ds], tasks=2))
    await wait_for(lambda: committed(fleet.store, [ds], "j-good"), timeout=60, what="the signed job commits")
    v1 = entry_fields((await good_job(fleet.store, "j-v1", [ds], tasks=1))[0], secret=key)
    data = v1["data"]
    old = int(time.time() * 1000) - 120_000
    stale = {
        "data": data,
        "sig": sign_v2(data, key, fleet=fleet.settings.fleet.name, stream=stream, ts_ms=old),
    }
    await fleet.redis.xadd(stream, v1)  # type: ignore[arg-type]
    await fleet.redis.xadd(stream, stale)  # type: ignore[arg-type]

    async def dead_reasons() -> list[str] | None:
        dead = await read_dead_letters(fleet.redis, fleet.keys, shard)
        return sorted(d.reason for d in dead) if len(dead) >= 2 else None

    assert await wait_for(dead_reasons, timeout=30, what="2 dead letters") == ["bad_signature", "stale"]

    # Operator requests: unsigned, forged and stale ones are refused by the worker; a signed one is
    # verified and then refused only because there is nothing to retry.
    op_key = fleet.keys.shard_state(shard_of("ghost", shards), "operator")
    fleet_name = fleet.settings.fleet.name
    requests = {
        "g-unsigned": "retry",
        "g-forged": sign_operator_request(
            "retry", b"not-the-key", fleet=fleet_name, dataset="ghost", job="g-forged"
        ),
        "g-stale": sign_operator_request(
            "skip", key, fleet=fleet_name, dataset="ghost", job="g-stale", ts_ms=old
        ),
        "g-signed": sign_operator_request("retry", key, fleet=fleet_name, dataset="ghost", job="g-signed"),
    }
    for job, value in requests.items():
        await fleet.redis.hset(op_key, f"ghost/{job}", value)

    async def refusals() -> dict[str, str] | None:
        evs = [e for e in await admin_events(fleet.redis, fleet_name) if isinstance(e, OperatorAction)]
        got = {e.job: e.detail for e in evs if e.dataset == "ghost" and e.outcome == "refused"}
        return got if len(got) == len(requests) else None

    refused = await wait_for(refusals, timeout=30, what="4 refused operator requests")
    assert refused["g-unsigned"].startswith("unsigned:"), refused
    assert refused["g-forged"].startswith("bad_signature:"), refused
    assert refused["g-stale"].startswith("stale:"), refused
    assert not refused["g-signed"].startswith(("unsigned", "bad_signature", "stale")), refused

    # What an operator sees: status (table and JSON), events, and a bad password's error.
    env = cli_env(REDIS_URL=redis_url, COMMITFLEET_CONFIG=str(fleet.config))
    outputs: list[str] = []
    for args in (("status",), ("status", "--json"), ("events", "--json", "--last", "500")):
        res = await cli(*args, env=env)
        assert res.rc == 0, (args, res.err)
        outputs += [res.out, res.err]
    wrong = redis_url.replace(quote(PASSWORD, safe=""), quote(WRONG, safe=""))
    res = await cli("status", env=cli_env(REDIS_URL=wrong, COMMITFLEET_STORE=fleet.settings.store.url))
    assert res.rc == 2 and "credentials" in res.err, (res.rc, res.err)
    outputs += [res.out, res.err]
    # A password with '#' written in the URL as it is: it works (no "Port could not be cast").
    as_is = PASSWORD.replace("%", "%25").replace("?", "%3F")  # only these two need escaping
    raw = f"redis://:{as_is}@127.0.0.1:{redis_url.rsplit(':', 1)[1]}"
    res = await cli("status", env=cli_env(REDIS_URL=raw, COMMITFLEET_CONFIG=str(fleet.config)))
    assert res.rc == 0, res.err
    outputs += [res.out, res.err]

    # Everything the fleet wrote or showed: process logs, admin events, dead letters, settings.
    for p in fleet.procs:
        outputs.append(p.output())
    outputs += [encode_admin(ev).decode() for _id, ev in await read_admin_range(fleet.redis, fleet.keys)]
    dead = await read_dead_letters(fleet.redis, fleet.keys, shard)
    outputs += [json.dumps([d.reason, d.detail]) for d in dead]
    outputs += [repr(fleet.settings), str(fleet.settings)]
    assert '"level": "debug"' in "".join(p.output() for p in fleet.procs)  # as chatty as they get
    leaks = {i: _leaks(text) for i, text in enumerate(outputs) if _leaks(text)}
    assert not leaks, {i: (found, outputs[i][:2000]) for i, found in leaks.items()}
