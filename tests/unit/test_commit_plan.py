"""Pure parts of the commit core: planning, the log codec, the step registry, watermark merging."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared._errors import BadInput
from shared.commit import (
    AdvanceWatermarks,
    Cleanup,
    CommitRequest,
    CommitStep,
    CommitStepFailed,
    PublishFile,
    StagedFile,
    StepContext,
    StepRegistry,
    WinningAttempt,
    WriteManifest,
    decode_sequence,
    encode_sequence,
    merge_watermarks,
    plan_commit,
)


def _req(tasks: int = 2, *, dataset: str = "sales", job: str = "job-7") -> CommitRequest:
    return CommitRequest(
        dataset=dataset,
        job=job,
        expected_tasks=tasks,
        winners=[
            WinningAttempt(
                task=t,
                attempt=t + 1,
                files=[
                    StagedFile(path="date=2024-01-01/a.parquet", size=10 + t, md5="0" * 32),
                    StagedFile(path="b.parquet", size=5),
                ],
                watermarks={"p0": 10 * t, f"own{t}": t},
            )
            for t in reversed(range(tasks))
        ],
    )


def test_plan_orders_steps_by_phase_and_derives_every_key() -> None:
    seq = plan_commit(_req(), epoch=4, now=1000.0)
    kinds = [type(s) for s in seq.steps]
    assert kinds == [PublishFile] * 4 + [AdvanceWatermarks, WriteManifest, Cleanup]
    first = seq.steps[0]
    assert isinstance(first, PublishFile)
    assert first.src == "_staging/job-7/sales/0-1/date=2024-01-01/a.parquet"
    assert first.dst == "sales/date=2024-01-01/job-7~00000-a.parquet"
    assert first.size == 10 and first.md5 == "0" * 32
    marks = seq.steps[4]
    assert isinstance(marks, AdvanceWatermarks)
    assert marks.values == {"p0": 10, "own0": 0, "own1": 1}
    manifest = seq.steps[5]
    assert isinstance(manifest, WriteManifest)
    assert manifest.epoch == 4 and manifest.watermarks == marks.values
    assert [f.key for f in manifest.files] == [s.dst for s in seq.steps[:4] if isinstance(s, PublishFile)]
    assert seq.steps[6] == Cleanup(prefixes=["_staging/job-7/sales/"])
    assert (seq.epoch, seq.created_at, seq.files, seq.bytes) == (4, 1000.0, 4, 10 + 11 + 5 + 5)


def test_plan_is_pure_same_input_same_sequence() -> None:
    assert plan_commit(_req(), 1, now=5.0) == plan_commit(_req(), 1, now=5.0)


def test_plan_without_watermarks_has_no_watermark_step() -> None:
    req = CommitRequest(
        dataset="d",
        job="j",
        expected_tasks=1,
        winners=[WinningAttempt(task=0, attempt=0, files=[StagedFile(path="x", size=1)])],
    )
    assert [type(s) for s in plan_commit(req, 1, now=0.0).steps] == [PublishFile, WriteManifest, Cleanup]


def test_plan_with_no_tasks_commits_an_empty_manifest() -> None:
    seq = plan_commit(CommitRequest(dataset="d", job="j", expected_tasks=0, winners=[]), 1, now=0.0)
    assert [type(s) for s in seq.steps] == [WriteManifest, Cleanup]


@pytest.mark.parametrize(
    ("winners", "tasks", "message"),
    [
        ([0], 2, "no winning attempt for task"),
        ([0, 0], 1, "more than one winning attempt"),
        ([0, 5], 2, "outside 0..1"),
    ],
)
def test_plan_rejects_inconsistent_winners(winners: list[int], tasks: int, message: str) -> None:
    req = CommitRequest(
        dataset="d",
        job="j",
        expected_tasks=tasks,
        winners=[WinningAttempt(task=t, attempt=0, files=[]) for t in winners],
    )
    with pytest.raises(BadInput, match=message):
        plan_commit(req, 1)


def test_plan_rejects_a_file_listed_twice_and_unsafe_paths() -> None:
    twice = CommitRequest(
        dataset="d",
        job="j",
        expected_tasks=1,
        winners=[
            WinningAttempt(
                task=0, attempt=0, files=[StagedFile(path="a", size=1), StagedFile(path="a", size=2)]
            )
        ],
    )
    with pytest.raises(BadInput, match="twice"):
        plan_commit(twice, 1)
    for path in ("../x", "/abs", "a/../b", "_commits/x"):
        bad = msgspec.structs.replace(
            twice, winners=[WinningAttempt(task=0, attempt=0, files=[StagedFile(path=path, size=1)])]
        )
        with pytest.raises(BadInput):
            plan_commit(bad, 1)
    with pytest.raises(BadInput):
        plan_commit(msgspec.structs.replace(twice, dataset="_wal"), 1)


def test_sequence_round_trips_through_the_log_codec() -> None:
    seq = plan_commit(_req(3), 9, now=12.5)
    data = encode_sequence(seq)
    assert b'"kind":"publish"' in data and b'"kind":"watermarks"' in data
    assert decode_sequence(data) == seq


def test_a_log_with_a_delta_step_is_written_at_v2_and_others_at_v1() -> None:
    """v2 (a Delta step carrying the job's sequence) makes a worker older than it refuse the log."""
    from shared.commit import table_step
    from shared.events import TableBinding

    req = msgspec.structs.replace(_req(2), seq=7)
    plain = plan_commit(req, 1, now=0.0)
    bound = plan_commit(req, 1, now=0.0, extra_steps=[table_step(req, TableBinding(delta=True))])
    assert (plain.v, bound.v) == (1, 2)
    back = decode_sequence(encode_sequence(bound))
    assert back == bound and [getattr(s, "seq", None) for s in back.steps if s.phase == "apply"][-1] == 7
    assert b'"v":2' in encode_sequence(bound)


def test_decoding_refuses_unknown_kinds_versions_and_garbage() -> None:
    seq = plan_commit(_req(1), 1, now=0.0)
    data = encode_sequence(seq).replace(b'"kind":"cleanup"', b'"kind":"mystery"')
    with pytest.raises(CommitStepFailed, match=r"mystery|kinds known"):
        decode_sequence(data)
    with pytest.raises(CommitStepFailed, match="format version"):
        decode_sequence(encode_sequence(msgspec.structs.replace(seq, v=99)))
    with pytest.raises(CommitStepFailed):
        decode_sequence(b"{not json")


class _Tagged(CommitStep, frozen=True, kw_only=True, tag="unit-custom"):
    name: str

    async def is_done(self, ctx: StepContext) -> bool:
        return True

    async def execute(self, ctx: StepContext) -> None:
        return None


def test_registry_accepts_a_custom_kind_and_the_codec_then_reads_it() -> None:
    registry = StepRegistry()
    assert registry.register(_Tagged) is _Tagged
    registry.register(_Tagged)  # same class twice: fine
    seq = plan_commit(_req(1), 1, now=0.0, extra_steps=[_Tagged(name="p=1")])
    assert isinstance(seq.steps[-3], _Tagged)  # apply phase: before the manifest and clean-up
    data = encode_sequence(seq)
    assert decode_sequence(data, registry) == seq
    with pytest.raises(CommitStepFailed):
        decode_sequence(data, StepRegistry())  # a reader without the plugin refuses the log
    assert "unit-custom" in registry.copy().kinds


def test_registry_rejects_invalid_kinds() -> None:
    registry = StepRegistry()

    class NoTag(CommitStep, frozen=True):
        async def is_done(self, ctx: StepContext) -> bool:
            return True

        async def execute(self, ctx: StepContext) -> None:
            return None

    class NotAsync(CommitStep, frozen=True, tag="not-async"):
        def is_done(self, ctx: StepContext) -> bool:  # type: ignore[override]
            return True

        async def execute(self, ctx: StepContext) -> None:
            return None

    class Clash(CommitStep, frozen=True, tag="publish"):
        async def is_done(self, ctx: StepContext) -> bool:
            return True

        async def execute(self, ctx: StepContext) -> None:
            return None

    class InManifest(CommitStep, frozen=True, tag="in-manifest"):
        phase = "manifest"

        async def is_done(self, ctx: StepContext) -> bool:
            return True

        async def execute(self, ctx: StepContext) -> None:
            return None

    class Plain(msgspec.Struct, tag_field="kind", tag="plain"):
        pass

    for cls in (NoTag, NotAsync, Clash, InManifest, Plain):
        with pytest.raises(TypeError):
            registry.register(cls)  # type: ignore[type-var]
    assert set(registry.kinds) == {"publish", "watermarks", "manifest", "cleanup", "table", "delta"}


marks = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(-(2**63), 2**63 - 1), max_size=4)


@given(marks, marks)
def test_merge_never_moves_a_watermark_back(current: dict[str, int], new: dict[str, int]) -> None:
    merged = merge_watermarks(current, new)
    assert set(merged) == set(current) | set(new)
    for k, v in merged.items():
        assert v >= current.get(k, v) and v >= new.get(k, v)
        assert v in (current.get(k), new.get(k))
    assert merge_watermarks(merged, new) == merged  # idempotent
