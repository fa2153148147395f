"""A custom step kind (adding a partition to a catalog object): registered, logged, crashed, replayed."""

from __future__ import annotations

import secrets

import msgspec
import pytest

from shared import NotFound, PreconditionFailed, TransientError
from shared.commit import (
    DEFAULT_REGISTRY,
    CommitStep,
    StepContext,
    StepRegistry,
    audit,
    commit_dataset,
    list_unfinished,
    register_step_kind,
    skip_quarantined,
)
from shared.events import manifest_key
from shared.storage import ObjectStore
from tests._support.commit import ManualLease, assert_exactly_once, fast_settings, keys, stage_job
from tests._support.emulators import StoreTarget
from tests._support.fault_store import FaultStore, expect_crash

SETTINGS = fast_settings()


class Catalog(msgspec.Struct, frozen=True):
    partitions: list[str]
    nonce: str


class RegisterPartition(CommitStep, frozen=True, kw_only=True, tag="test-register-partition"):
    """Add ``partition`` to the catalog object ``catalog`` (compare-and-swap, idempotent)."""

    catalog: str
    partition: str

    async def _read(self, store: ObjectStore) -> tuple[list[str], str | None]:
        try:
            obj = await store.read(self.catalog)
        except NotFound:
            return [], None
        return msgspec.json.decode(obj.data, type=Catalog).partitions, obj.info.version

    async def _update(self, ctx: StepContext, change: bool) -> None:
        for _ in range(16):
            parts, version = await self._read(ctx.store)
            want = sorted({*parts, self.partition}) if change else [p for p in parts if p != self.partition]
            if want == parts and version is not None:
                return
            body = msgspec.json.encode(Catalog(partitions=want, nonce=secrets.token_hex(4)))
            ctx.lease.check()
            try:
                if version is None:
                    await ctx.store.write_if_absent(self.catalog, body)
                else:
                    await ctx.store.write_if_match(self.catalog, body, version)
            except PreconditionFailed:
                continue
            return
        raise TransientError("catalog kept changing")

    async def is_done(self, ctx: StepContext) -> bool:
        return self.partition in (await self._read(ctx.store))[0]

    async def execute(self, ctx: StepContext) -> None:
        await self._update(ctx, True)

    async def undo(self, ctx: StepContext) -> None:
        """Called by ``skip`` when the sequence is rolled back."""
        await self._update(ctx, False)


REGISTRY = StepRegistry([RegisterPartition])


async def _partitions(store: ObjectStore) -> list[str]:
    return (await RegisterPartition(catalog="_catalog/ds.json", partition="")._read(store))[0]


def _step(partition: str = "date=2024-01-01") -> RegisterPartition:
    return RegisterPartition(catalog="_catalog/ds.json", partition=partition)


async def test_a_custom_step_is_logged_replayed_after_every_crash_and_runs_once(
    any_store: ObjectStore, store_target: StoreTarget
) -> None:
    probe = await stage_job(any_store, "probe", "job-0")
    counting = FaultStore(any_store)
    res = await commit_dataset(
        counting, probe.req, ManualLease("probe", 1), SETTINGS, registry=REGISTRY, extra_steps=[_step("p")]
    )
    assert res.ok and res.steps == 8
    n = len(counting.calls)
    points = range(1, n + 1) if store_target.backend == "local" else sorted({1, n // 2, n - 3, n})
    jobs = [probe]
    for k in points:
        job = await stage_job(any_store, "ds", f"job-{k}", seed=k)
        jobs.append(job)
        crashing = FaultStore(any_store, crash_at=k, crash_when="after")
        await expect_crash(
            commit_dataset(
                crashing,
                job.req,
                ManualLease("ds", 2 * k),
                SETTINGS,
                registry=REGISTRY,
                extra_steps=[_step(f"k{k}")],
            )
        )
        res = await commit_dataset(
            any_store, job.req, ManualLease("ds", 2 * k + 1), SETTINGS, registry=REGISTRY
        )
        assert res.ok, res
    assert await _partitions(any_store) == sorted(["p", *(f"k{k}" for k in points)])
    await assert_exactly_once(any_store, *jobs)


async def test_a_worker_without_the_plugin_refuses_the_log_and_blocks_the_dataset(
    any_store: ObjectStore,
) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    crashing = FaultStore(any_store, crash_at=1, crash_when="after")
    await expect_crash(
        commit_dataset(
            crashing, job.req, ManualLease("ds", 1), SETTINGS, registry=REGISTRY, extra_steps=[_step()]
        )
    )
    res = await commit_dataset(any_store, job.req, ManualLease("ds", 2), SETTINGS)  # default registry
    assert res.status == "blocked" and res.blocked_by == "job-1"
    assert res.quarantined is not None and "test-register-partition" in res.quarantined
    [unfinished] = await list_unfinished(any_store)
    assert unfinished.sequence is None and unfinished.error is not None
    assert [v.kind for v in (await audit(any_store)).violations] == ["unreadable_sequence"]
    # Nothing was run on a guess: every staged file is still there.
    assert sorted(await keys(any_store, "_staging/")) == sorted([*job.winners, *job.losers])

    res = await commit_dataset(any_store, job.req, ManualLease("ds", 3), SETTINGS, registry=REGISTRY)
    assert res.ok and res.recovered
    assert await _partitions(any_store) == ["date=2024-01-01"]
    await assert_exactly_once(any_store, job)


async def test_skip_undoes_a_custom_step_that_offers_undo(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    req = msgspec.structs.replace(
        job.req, winners=[msgspec.structs.replace(w, watermarks={}) for w in job.req.winners]
    )
    crashing = FaultStore(any_store, crash_at=1, crash_when="after")
    await expect_crash(
        commit_dataset(
            crashing, req, ManualLease("ds", 1), SETTINGS, registry=REGISTRY, extra_steps=[_step()]
        )
    )
    # Someone wrote another manifest for this job meanwhile: the manifest step conflicts.
    bogus = {"dataset": "ds", "job": "job-1", "files": [], "watermarks": {}, "epoch": 0, "committed_at": 0}
    await any_store.write(manifest_key("ds", "job-1"), msgspec.json.encode(bogus))
    res = await commit_dataset(any_store, req, ManualLease("ds", 2), SETTINGS, registry=REGISTRY)
    assert res.status == "quarantined"
    assert await _partitions(any_store) == ["date=2024-01-01"]  # the custom step had run
    skipped = await skip_quarantined(
        any_store, "ds", "job-1", ManualLease("ds", 3), SETTINGS, registry=REGISTRY
    )
    assert skipped.outcome == "rolled_back" and skipped.published_deleted == len(job.winners)
    assert await _partitions(any_store) == []
    assert await keys(any_store, "_staging/") == []
    assert (await audit(any_store)).ok


class _GlobalKind(CommitStep, frozen=True, kw_only=True, tag="test-global-kind"):
    async def is_done(self, ctx: StepContext) -> bool:
        return True

    async def execute(self, ctx: StepContext) -> None:
        return None


def test_register_step_kind_adds_to_the_process_wide_registry() -> None:
    assert register_step_kind(_GlobalKind) is _GlobalKind
    assert DEFAULT_REGISTRY.kinds["test-global-kind"] is _GlobalKind
    with pytest.raises(TypeError):
        register_step_kind(type("X", (), {}))  # type: ignore[type-var]
