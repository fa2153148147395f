"""The shard's quarantine record (what ``status`` reads) follows quarantines as they happen.

The owner rewrites ``state:quarantined`` from the WAL at each session start;
a quarantine that starts or ends later in the session must reach it at once,
not at the next session start (which may be weeks away).
"""

from __future__ import annotations

from typing import Any

from coordinator.admin import fleet_summary
from shared.queue import as_text, shard_of
from tests._support.cli import cli
from tests._support.fleet_jobs import corrupted_job
from tests._support.process_fleet import Fleet
from tests._support.wait import wait_for


async def test_quarantine_reaches_the_status_record_during_the_session(fleet: Fleet) -> None:
    fleet.start("coordinator", "c1")
    worker = fleet.start("worker", "w1")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns all shards")
    key = fleet.keys.shard_state(shard_of("qa", fleet.settings.fleet.shards), "quarantined")

    async def recorded() -> dict[str, str]:
        return {as_text(k): as_text(v) for k, v in (await fleet.redis.hgetall(key)).items()}

    # The shard's session started before the job existed: only the live update can record it.
    evs, _key, _right = await corrupted_job(fleet.store, "j-q", "qa")
    await fleet.publisher.publish_many(evs)
    found = await wait_for(recorded, timeout=60, interval=0.1, what="qa/j-q in the shard's quarantine record")
    assert list(found) == ["qa/j-q"], found
    assert "publish" in found["qa/j-q"], found
    # Status without a walk of the store shows it.
    doc = await status_doc_from_redis(fleet)
    assert [(q["dataset"], q["job"]) for q in doc["quarantined"]] == [("qa", "j-q")], doc["quarantined"]

    # The operator's skip ends the quarantine: the record drops it at once.
    res = await cli("skip", "qa", "j-q", "--config", fleet.config)
    assert res.rc == 0, (res.out, res.err)

    async def cleared() -> bool:
        return not await recorded()

    await wait_for(cleared, timeout=30, interval=0.1, what="the record cleared by the skip")
    doc = await status_doc_from_redis(fleet)
    assert doc["quarantined"] == [], doc["quarantined"]
    assert worker.proc.poll() is None  # one session all along: no restart rewrote the record


async def status_doc_from_redis(fleet: Fleet) -> dict[str, Any]:
    """Return the status document as ``commitfleet status`` computes it: from Redis only."""
    return await fleet_summary(fleet.redis, fleet.keys, fleet.settings)
