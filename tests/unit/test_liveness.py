"""When a shard's owner aborts a job for time (workers._core._liveness, pure)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from shared.events import JobStarted
from shared.queue import DatasetResult, encode_result, heartbeat_interval, heartbeat_ttl
from workers._core import Abort, ShardJobs, TimedOut, assume_alive, decide, live_jobs, observe, timed_out


def _open(s: ShardJobs, job: str, datasets: tuple[str, ...], *, now: float, timeout: float) -> None:
    ev = JobStarted(job=job, datasets=list(datasets), timeout_s=timeout, started_at=1.0)
    s.apply(decide(s, ev, now=now, default_timeout=999.0))


def _set(s: ShardJobs, job: str, dataset: str, status: str) -> None:
    meta = s.set_status(job, dataset, status)  # type: ignore[arg-type]
    assert meta is not None
    s.jobs[job] = meta


def test_a_silent_job_times_out_once_with_its_timeout_and_only_its_open_datasets() -> None:
    s = ShardJobs()
    _open(s, "j1", ("d1", "d2", "d3"), now=100.0, timeout=30.0)
    _set(s, "j1", "d2", "committing")
    assert timed_out(s, {}, 129.9) == []
    (out,) = timed_out(s, {}, 130.0)
    assert out == TimedOut(
        job="j1",
        datasets=("d1", "d3"),
        timeout_s=30.0,
        reason="timed out: no sign of life from its driver for 30s",
    )
    assert out.aborts() == [
        Abort(job="j1", dataset="d1", reason=out.reason),
        Abort(job="j1", dataset="d3", reason=out.reason),
    ]


def test_a_job_whose_driver_keeps_beating_never_times_out() -> None:
    s = ShardJobs()
    _open(s, "j1", ("d1",), now=0.0, timeout=10.0)
    seen: dict[str, float] = {}
    for t in range(0, 10_000, 5):  # a key seen every 5 s for hours, timeout 10 s
        seen = observe(seen, live_jobs(s), {"j1"}, float(t))
        assert timed_out(s, seen, float(t) + 4.9) == []
    # then the driver dies: aborted one timeout after the last sighting, not before
    last = seen["j1"]
    seen = observe(seen, live_jobs(s), set(), last + 9.0)
    assert timed_out(s, seen, last + 9.99) == []
    assert [o.job for o in timed_out(s, seen, last + 10.0)] == ["j1"]


def test_max_duration_aborts_a_live_job() -> None:
    s = ShardJobs()
    _open(s, "j1", ("d1",), now=0.0, timeout=10.0)
    seen = observe({}, live_jobs(s), {"j1"}, 59.0)
    assert timed_out(s, seen, 59.5, max_duration=60.0) == []
    (out,) = timed_out(s, seen, 60.0, max_duration=60.0)
    assert out.timeout_s == 60.0 and "max_job_duration" in out.reason
    assert timed_out(s, seen, 60.0, max_duration=0.0) == []  # 0: no hard limit


def test_a_session_restart_gives_every_job_a_full_timeout() -> None:
    s = ShardJobs()
    _open(s, "j1", ("d1",), now=0.0, timeout=10.0)
    seen = observe({}, live_jobs(s), {"j1"}, 5.0)
    # Redis went away at 6 s and came back empty at 30 s: the key is gone.
    seen = assume_alive(s.jobs, 30.0)
    seen = observe(seen, live_jobs(s), set(), 30.5)
    assert timed_out(s, seen, 39.9) == []  # the driver has until 40 s to beat again
    seen = observe(seen, live_jobs(s), {"j1"}, 31.0)
    assert timed_out(s, seen, 40.5) == []
    assert [o.job for o in timed_out(s, seen, 41.0)] == ["j1"]


def test_observe_follows_open_work() -> None:
    s = ShardJobs()
    _open(s, "j1", ("d1",), now=0.0, timeout=10.0)
    _open(s, "j2", ("d2",), now=0.0, timeout=10.0)
    seen = observe({}, live_jobs(s), {"j1", "j2"}, 1.0)
    _set(s, "j2", "d2", "committing")
    assert live_jobs(s) == ["j1"]
    assert observe(seen, live_jobs(s), set(), 2.0) == {"j1": 1.0}


@given(
    timeout=st.floats(min_value=0.5, max_value=3600.0),
    beats=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=50),
    gap=st.floats(min_value=0.0, max_value=10_000.0),
)
def test_never_aborted_while_seen_within_its_timeout(timeout: float, beats: list[float], gap: float) -> None:
    """Whatever the pattern of sightings, a job is timed out exactly when the last sign of life
    is a full timeout old."""
    s = ShardJobs()
    _open(s, "j", ("d",), now=0.0, timeout=timeout)
    seen: dict[str, float] = {}
    now = 0.0
    last = 0.0
    for b in beats:  # sightings spaced by less than the timeout
        now += b * timeout * 0.99
        seen = observe(seen, live_jobs(s), {"j"}, now)
        last = now
        assert timed_out(s, seen, now) == []
    now = last + gap
    seen = observe(seen, live_jobs(s), set(), now)
    assert bool(timed_out(s, seen, now)) == (now - last >= timeout)


def test_heartbeat_cadence_fits_the_timeout() -> None:
    assert heartbeat_interval(300.0) == 30.0 and heartbeat_ttl(300.0) == 90.0
    assert heartbeat_interval(3600.0) == 30.0  # never slower than every 30 s
    assert heartbeat_interval(1.0) == 0.2  # never faster than 5 per second
    for timeout in (1.0, 2.0, 10.0, 60.0, 300.0, 86400.0):
        # two refreshes may fail before the key lapses
        assert heartbeat_ttl(timeout) >= 3 * heartbeat_interval(timeout)


def test_the_contracts_result_example_is_what_the_fleet_writes() -> None:
    text = (Path(__file__).parents[2] / "docs" / "contract.md").read_text()
    (body,) = re.findall(r"```json result\n(.*?)\n```", text, flags=re.S)
    result = msgspec.json.decode(body, type=DatasetResult)
    assert result.status == "committed" and result.manifest.endswith(".json")
    assert msgspec.json.decode(encode_result(result)) == msgspec.json.decode(body)
