"""Pure planning: from a commit request to the ordered steps of its sequence. No I/O."""

from __future__ import annotations

import time
from collections.abc import Sequence

from .._errors import BadInput
from ..events import published_key, staged_key, staging_prefix
from ._model import CommitRequest, ManifestFile
from ._publish import PublishFile
from ._steps import PHASES, Cleanup, CommitStep, WriteManifest
from ._wal import CommitSequence, wal_version
from ._watermarks import AdvanceWatermarks, StreamMark, merge_watermarks


def _check_winners(req: CommitRequest) -> None:
    if req.expected_tasks < 0:
        raise BadInput(f"{req.dataset}/{req.job}: expected_tasks must be >= 0, got {req.expected_tasks}")
    seen: set[int] = set()
    for w in req.winners:
        if w.task in seen:
            raise BadInput(f"{req.dataset}/{req.job}: task {w.task} has more than one winning attempt")
        if not 0 <= w.task < req.expected_tasks:
            raise BadInput(f"{req.dataset}/{req.job}: task {w.task} is outside 0..{req.expected_tasks - 1}")
        if w.attempt < 0:
            raise BadInput(f"{req.dataset}/{req.job}: task {w.task} has a negative attempt {w.attempt}")
        seen.add(w.task)
    missing = sorted(set(range(req.expected_tasks)) - seen)
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise BadInput(f"{req.dataset}/{req.job}: no winning attempt for task(s) {shown}")


def plan_commit(
    req: CommitRequest,
    epoch: int,
    *,
    now: float | None = None,
    extra_steps: Sequence[CommitStep] = (),
) -> CommitSequence:
    """Return the commit sequence for ``req``, to be run under a lock of ``epoch``.

    Steps, in execution order: one :class:`PublishFile` per winning file
    (``_staging/<job>/<dataset>/<task>-<attempt>/<path>`` ->
    ``<dataset>/<dir>/<job>~<task:05d>-<name>``), :class:`AdvanceWatermarks`
    with the per-key maximum over the winners and the request's stream mark
    (omitted when there are neither),
    ``extra_steps`` placed by their phase (custom kinds, usually ``apply``),
    :class:`WriteManifest`, and one :class:`Cleanup` of the job's staging
    folder for the dataset (which also removes every losing attempt).

    Pure: the only input besides the arguments is the clock when ``now`` is
    None (it stamps ``created_at``).

    Raises:
        BadInput: tasks missing, duplicated or out of range; a file listed
            twice; an unsafe name or path (``InvalidMessage``); an extra step
            in the manifest phase.
    """
    _check_winners(req)
    publishes: list[CommitStep] = []
    files: list[ManifestFile] = []
    watermarks: dict[str, int] = {}
    dsts: set[str] = set()
    for w in sorted(req.winners, key=lambda w: w.task):
        for f in w.files:
            src = staged_key(req.job, req.dataset, w.task, w.attempt, f.path)
            dst = published_key(req.dataset, req.job, w.task, f.path)
            if dst in dsts:
                raise BadInput(f"{req.dataset}/{req.job}: task {w.task} lists {f.path!r} twice")
            dsts.add(dst)
            publishes.append(PublishFile(src=src, dst=dst, size=f.size, md5=f.md5))
            files.append(ManifestFile(key=dst, size=f.size, md5=f.md5))
        watermarks = merge_watermarks(watermarks, w.watermarks)

    by_phase: dict[str, list[CommitStep]] = {p: [] for p in PHASES}
    by_phase["publish"] = publishes
    created = time.time() if now is None else now
    mark = None
    if req.stream is not None:
        s = req.stream
        mark = StreamMark(app_id=s.app_id, batch=s.batch, query=s.query, job=req.job, at=created)
    if watermarks or mark is not None:
        by_phase["apply"].append(AdvanceWatermarks(dataset=req.dataset, values=watermarks, stream=mark))
    by_phase["manifest"].append(
        WriteManifest(dataset=req.dataset, job=req.job, files=files, watermarks=watermarks, epoch=epoch)
    )
    by_phase["cleanup"].append(Cleanup(prefixes=[staging_prefix(req.job, req.dataset)]))
    for step in extra_steps:
        if step.phase == "manifest":
            raise BadInput(f"extra step {type(step).__name__} cannot run in the manifest phase")
        by_phase[step.phase].append(step)

    steps = [s for p in PHASES for s in by_phase[p]]
    return CommitSequence(
        v=wal_version(steps),
        dataset=req.dataset,
        job=req.job,
        epoch=epoch,
        steps=steps,
        created_at=created,
        updated_at=created,
    )


__all__ = ["plan_commit"]
