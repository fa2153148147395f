"""The Delta step: a bound dataset's commit lands as exactly one version of the Delta table in its own folder.

:class:`CommitToDelta` runs in the ``apply`` phase, like the Iceberg step
(:mod:`._catalog`): after every file is published, before the manifest. The
table is ``<store root>/<dataset>``, its log ``<dataset>/_delta_log/``; the
fleet's ``_commits/`` folder sits beside the log and Delta readers never look
at it.

The step writes the log entry itself, through the store port, with a
create-if-absent of ``_delta_log/<version:020>.json``: the same conditional
write the fleet uses everywhere, so it works alike on every store and every
store call can fail or crash the way the fault tests make them.

The commit's ``txn`` (application id :func:`._delta_log.app_id`) carries the
job's sequence for the dataset (:attr:`CommitToDelta.seq`: the ``fin`` of the
shard's ``job_finished`` decision, which a dataset's commits run in), raised to
one above the table's latest fleet ``txn`` when it is not above it (a sequence
that restarted lower: see docs/tables.md), so that the versions a Delta
reader or writer sees under the application id rise in job order. A step
planned before the field existed has ``seq`` 0: its ``txn`` is one above the
latest (the table version on a table only the fleet writes, as it was).

Done means: the latest ``txn`` of the dataset's application id was written by
this job's commit (the commit that set it names the job in its
``commitInfo``: :func:`txn_owner` finds it). That "latest" is enough because
the dataset's sequences run one at a time under its lock, oldest first (a
later job's sequence cannot start before this one finished), and a holder
checks its lease just before the create: a commit of this job, if there is
one, is the newest fleet commit of the dataset. Of two holders racing (a
stale one and the next), both aim at the same next version; the create lets
one land, the other re-reads and finds the job there.

Every ``delta.checkpointInterval`` versions (default 10) the holder that
landed a version also writes its classic Parquet checkpoint and
``_last_checkpoint``, so readers and a fresh worker replay at most that many
JSON commits.

Only this module does I/O; the log's format is in :mod:`._delta_log`.
"""

from __future__ import annotations

import asyncio
import io
from typing import Any, ClassVar, Final

import msgspec

from .._errors import NotFound, PreconditionFailed, TransientError
from .._recent import Recent
from ..events import StreamBatch, TableBinding, TableMode, check_dataset_segment
from ..storage import ObjectStore
from ._bounded import for_each_bounded
from ._delta_log import (
    DELTA_LOG,
    AddFile,
    DeltaState,
    NewTable,
    add_stats_from_stats,
    app_id,
    checkpoint_body,
    checkpoint_interval,
    checkpoint_name,
    commit_body,
    commit_name,
    delta_schema,
    file_stats,
    partition_values,
    read_listing,
    schema_from_stats,
    schema_mismatch,
)
from ._errors import CommitStepFailed
from ._model import CommitRequest
from ._steps import CommitStep, Phase, StepContext
from ._table_files import DescribedFile, winner_parquet_files

LAST_CHECKPOINT = "_last_checkpoint"
_READS = 8
TXN_READS: Final = 8
"""How many commits :func:`txn_owner` reads at once, back from a checkpoint, for the one that set its txn."""

DELTA_STATES: Final = 64
"""How many tables' replayed states a process keeps (each holds its snapshot's add actions)."""

_states: Recent[tuple[DeltaState, str]] = Recent(DELTA_STATES)
"""The last state replayed per (store root, dataset), with the store version of its newest commit file:
the next read starts there when the listing shows that very file, and replays only the newer commits."""


def log_prefix(dataset: str) -> str:
    """Return ``<dataset>/_delta_log/``."""
    return f"{check_dataset_segment(dataset)}/{DELTA_LOG}/"


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise CommitStepFailed(f"pyarrow is not installed (pip install 'commitfleet[delta]'): {exc}") from exc
    return pq


async def read_state(store: ObjectStore, dataset: str, *, cached: bool = True) -> DeltaState | None:
    """Return the Delta table's state at its newest version, or None when ``<dataset>/_delta_log/`` is empty.

    Replays the newest complete checkpoint and the JSON commits after it.
    With ``cached``, the state this process replayed or landed last is the
    answer, without a listing, when its commit file is still there at the
    store version seen then and the next version's is not (two heads at once:
    see :func:`_still_newest`); else it is the start when the listing shows
    that file unchanged (a table deleted and made again is replayed afresh)
    and every commit after it, and only those newer commits are read.

    Raises:
        CommitStepFailed: a commit or checkpoint is unreadable, or a version is
            missing between the checkpoint and the newest commit.
        TransientError / OutcomeUnknown: the store failed.
    """
    prefix = log_prefix(dataset)
    last = _states.get(store.url, dataset) if cached else None
    if last is not None and last[0].version >= 0 and await _still_newest(store, prefix, *last):
        return last[0].copy()
    tags = {info.key[len(prefix) :]: info.version async for info in store.list(prefix)}
    listing = read_listing(tags)
    if not listing.commits and listing.checkpoint is None:
        return None
    newest = max([*listing.commits, listing.checkpoint or -1])
    if (
        last is not None
        and last[0].version >= 0
        and tags.get(commit_name(last[0].version)) == last[1]
        and all(commit_name(v) in tags for v in range(last[0].version + 1, newest + 1))
    ):
        state = last[0].copy()
    elif listing.checkpoint is not None:
        state = DeltaState()
        cp = listing.checkpoint
        parts = [(await store.read(prefix + n)).data for n in listing.checkpoint_parts]
        await asyncio.to_thread(state.apply_checkpoint, cp, parts, f"{prefix}{cp:020d}.checkpoint")
    else:
        state = DeltaState()
    todo = [v for v in listing.commits if v > state.version]
    if todo and todo != list(range(state.version + 1, newest + 1)):
        raise CommitStepFailed(f"{prefix}: versions missing after {state.version} (found {todo[:5]}...)")
    bodies: dict[int, bytes] = {}

    async def one(v: int) -> None:
        bodies[v] = (await store.read(prefix + commit_name(v))).data

    await for_each_bounded(todo, one, _READS)
    for v in todo:
        state.apply(v, bodies[v], prefix + commit_name(v))
    if state.version >= 0 and commit_name(state.version) in tags:
        _states.put(store.url, dataset, (state.copy(), tags[commit_name(state.version)]))
    return state


async def _still_newest(store: ObjectStore, prefix: str, state: DeltaState, tag: str) -> bool:
    """Return True when ``state``'s version is still the table's newest, as ``state`` knew it.

    Its commit file is there at the store version ``tag`` (not a table made
    again since) and the next version's file is not. The next is enough: a
    Delta writer creates version v + 1 only after v exists and the log is
    never cleaned up past its newest version, so no later version exists
    without v + 1. One round of two heads at once, whatever the log's length
    (a listing grows with it).

    Raises:
        TransientError / OutcomeUnknown: the store failed.
    """
    found: dict[int, str | None] = {}

    async def head(version: int) -> None:
        try:
            found[version] = (await store.head(prefix + commit_name(version))).version
        except NotFound:
            found[version] = None

    await for_each_bounded([state.version, state.version + 1], head, 2)
    return found[state.version] == tag and found[state.version + 1] is None


async def fleet_commit_at(
    store: ObjectStore, dataset: str, state: DeltaState, version: int
) -> tuple[str, str] | None:
    """Return (dataset, job) of the fleet commit at ``version`` (from the state, else its file), or None.

    Raises:
        CommitStepFailed: the commit file is gone (cleaned up behind a checkpoint).
    """
    if version in state.fleet_commits:
        return state.fleet_commits[version]
    key = log_prefix(dataset) + commit_name(version)
    try:
        body = (await store.read(key)).data
    except NotFound as exc:
        raise CommitStepFailed(f"{key} is gone: cannot tell which job wrote version {version}") from exc
    one = DeltaState()
    one.apply(version, body, key)
    return one.fleet_commits.get(version)


async def txn_owner(store: ObjectStore, dataset: str, state: DeltaState) -> tuple[str, str] | None:
    """Return (dataset, job) of the fleet commit that set the dataset's latest ``txn``, or None (none yet).

    The commit is known when a replayed JSON commit set it; when the
    checkpoint the replay started from holds it, it is the newest commit at
    or before the checkpoint that carries a ``txn`` of the application id,
    read newest first, :data:`TXN_READS` at a time (the checkpoint's own
    version first: the fleet checkpoints the version it just landed, so one
    read as a rule; another writer's commits since then are read through).

    Raises:
        CommitStepFailed: a commit file on the way is gone (cleaned up behind
            a checkpoint), the commit carries another ``txn`` version, or no
            commit carries one.
        TransientError / OutcomeUnknown: the store failed.
    """
    app = app_id(dataset)
    latest = state.txns.get(app)
    if latest is None:
        return None
    at = state.txn_at.get(app)
    if at is not None:
        return await fleet_commit_at(store, dataset, state, at)
    prefix = log_prefix(dataset)
    bodies: dict[int, bytes | None] = {}

    async def one(version: int) -> None:
        try:
            bodies[version] = (await store.read(prefix + commit_name(version))).data
        except NotFound:
            bodies[version] = None  # an error only if the search gets to it

    top = state.checkpoint
    while top >= 0:
        versions = list(range(top, max(-1, top - TXN_READS), -1))
        bodies.clear()
        await for_each_bounded(versions, one, TXN_READS)
        for version in versions:  # newest first
            key = prefix + commit_name(version)
            body = bodies[version]
            if body is None:
                raise CommitStepFailed(f"{key} is gone: cannot tell which job set txn {latest} of {app}")
            found = DeltaState()
            found.apply(version, body, key)
            if app in found.txns:
                if found.txns[app] != latest:
                    raise CommitStepFailed(
                        f"{key} sets txn {found.txns[app]} of {app}, its checkpoint {latest}"
                    )
                return found.fleet_commits.get(version)
        top -= TXN_READS
    raise CommitStepFailed(
        f"{prefix}: no commit up to checkpoint {state.checkpoint} sets txn {latest} of {app}"
    )


async def job_done(
    store: ObjectStore, dataset: str, job: str, state: DeltaState | None, seq: int = 0
) -> bool:
    """Return True when the newest fleet ``txn`` of the dataset is this job's commit (see the module doc).

    ``seq``: the job's sequence. A commit of it would have set a ``txn`` of at
    least ``seq``, and no later one can exist while its sequence is open: a
    latest ``txn`` below ``seq`` answers False without looking for its commit.

    Raises:
        As :func:`txn_owner`.
    """
    if state is None:
        return False
    latest = state.txns.get(app_id(dataset))
    if latest is None or latest < seq:
        return False
    return await txn_owner(store, dataset, state) == (dataset, job)


def txn_version(seq: int, state: DeltaState | None, dataset: str) -> int:
    """Return the ``txn`` version of a commit of job sequence ``seq`` on ``state``: ``seq``, or one above
    the table's latest fleet ``txn`` when ``seq`` is not above it (see the module doc)."""
    latest = None if state is None else state.txns.get(app_id(dataset))
    return seq if latest is None or seq > latest else latest + 1


class CommitToDelta(CommitStep, frozen=True, kw_only=True, tag="delta"):
    """Land the job's published Parquet files (``files``: keys under ``<dataset>/``) as one Delta version."""

    phase: ClassVar[Phase] = "apply"
    # ``seq``: a worker older than it would take the txn version for a table version (see WAL_VERSIONS).
    wal_version: ClassVar[int] = 2

    dataset: str
    job: str
    mode: TableMode = "append"
    files: list[str]
    stream: StreamBatch | None = None
    # The files' verified sizes and their producers' statistics, by store key (those that sent them).
    described: dict[str, DescribedFile] = msgspec.field(default_factory=dict)
    # The job's sequence for the dataset (its ``fin``): the commit's ``txn`` version (see the module doc).
    # 0 in a log written before the field existed.
    seq: int = 0

    def info(self) -> dict[str, str]:
        """Return what the commit's ``commitInfo.commitfleet`` says besides the job (a streaming batch)."""
        if self.stream is None:
            return {}
        return {"app": self.stream.app_id, "batch": str(self.stream.batch), "query": self.stream.query}

    async def is_done(self, ctx: StepContext) -> bool:
        """Return True when the table's newest fleet commit of the dataset is this job's.

        Raises:
            CommitStepFailed: the log is unreadable.
            TransientError / OutcomeUnknown: the store failed.
        """
        state = await read_state(ctx.store, self.dataset)
        return await job_done(ctx.store, self.dataset, self.job, state, self.seq)

    async def execute(self, ctx: StepContext) -> None:
        """Land the version unless it is there. Raises as :meth:`ensure`."""
        await self.ensure(ctx)

    async def ensure(self, ctx: StepContext) -> bool:
        """Check, then create the next log entry based on that read.

        Returns:
            True when this call landed the version, False when it was there.

        Raises:
            CommitStepFailed: bad input (a file whose schema the table cannot
                take, other partition columns, a table needing Delta
                features the fleet does not write, nothing to create from).
            TransientError: another writer took the version we aimed at (the
                retry re-reads), or the store failed.
            OutcomeUnknown: the store could not say whether the entry landed;
                the retry re-checks.
            LockLost / Fenced: the lease, checked just before the create.

        Cancelled: nothing to undo; a create that landed is found by the next check.
        """
        store = ctx.store
        state = await read_state(store, self.dataset)
        if await job_done(store, self.dataset, self.job, state, self.seq):
            return False
        if state is not None:
            state.check_writable(self.mode)
        version = 0 if state is None else state.version + 1
        adds, new_table = await self._adds(store, state)
        removes = list(state.files.values()) if state is not None and self.mode == "overwrite" else []
        body = commit_body(
            dataset=self.dataset,
            job=self.job,
            version=version,
            txn_version=txn_version(self.seq, state, self.dataset),
            mode=self.mode,
            adds=adds,
            removes=removes,
            new_table=new_table,
            now_ms=int(ctx.clock() * 1000),
            extra_info=self.info(),
        )
        key = log_prefix(self.dataset) + commit_name(version)
        ctx.lease.check()
        ctx.probe("table.commit")
        try:
            landed = await store.write_if_absent(key, body)
        except PreconditionFailed as exc:
            if await job_done(store, self.dataset, self.job, await read_state(store, self.dataset), self.seq):
                return False  # another holder landed it between our read and our create
            raise TransientError(f"{key}: another commit took version {version}; re-checking") from exc
        ctx.probe("table.committed")
        after = DeltaState() if state is None else state.copy()
        after.apply(version, body, key)
        # The next read starts here (``after`` is not changed again: read_state hands out copies).
        _states.put(store.url, self.dataset, (after, landed.version))
        await self._checkpoint(store, after, version)
        return True

    async def _checkpoint(self, store: ObjectStore, after: DeltaState, version: int) -> None:
        """Write the checkpoint of ``version`` (just landed by this holder) when the table's interval says so.

        Not part of the commit: a holder that stops before it leaves no checkpoint (the next multiple
        of the interval writes one); a checkpoint is one whole object, created only if absent.

        Raises:
            TransientError / OutcomeUnknown: the store failed (the retry finds the version done).
        """
        prefix = log_prefix(self.dataset)
        if version == 0 or version % checkpoint_interval(after) != 0:
            return
        data, size = await asyncio.to_thread(checkpoint_body, after)
        try:
            await store.write_if_absent(prefix + checkpoint_name(version), data)
        except PreconditionFailed:
            return  # another holder of this job wrote it
        await store.write(prefix + LAST_CHECKPOINT, msgspec.json.encode({"version": version, "size": size}))

    async def _adds(
        self, store: ObjectStore, state: DeltaState | None
    ) -> tuple[list[AddFile], NewTable | None]:
        """Return the add actions of the job's files, and the new table if any.

        A file whose producer sent its statistics (:attr:`described`) is
        described from them, without a read; a file without, or whose
        statistics cannot tell its Delta schema exactly (an integer column
        against a byte or short one), is read whole for its Parquet footer.
        The first commit's schema comes from the first file's statistics when
        they tell it exactly, else from that file's footer.

        Raises:
            CommitStepFailed: as :meth:`ensure` (bad input).
        """
        if state is None and not self.files:
            raise CommitStepFailed(
                f"Delta table {self.dataset}: the first commit has no Parquet file to create it from"
            )
        root = f"{self.dataset}/"
        rels = [key[len(root) :] for key in self.files]
        parts = [partition_values(rel) for rel in rels]
        columns = state.partition_columns() if state is not None else list(parts[0]) if parts else []
        new_table = None
        table_schema: dict[str, Any] | None = None
        if state is not None:
            table_schema = state.schema()
        else:
            known = self.described.get(self.files[0])
            from_stats = None if known is None else schema_from_stats(known.stats, columns)
            if from_stats is not None:
                table_schema = from_stats[0]
                new_table = NewTable(schema=from_stats[0], partition_columns=columns, ntz=from_stats[1])
        found: dict[str, tuple[int, Any]] = {}
        if table_schema is None:  # the first commit, its schema from the first file's footer
            found = await self._footers(store, self.files[:1])
            schema, ntz = delta_schema(found[self.files[0]][1].schema.to_arrow_schema(), columns)
            new_table = NewTable(schema=schema, partition_columns=columns, ntz=ntz)
            table_schema = schema
        # Each file's Delta schema and stats from its statistics where they serve.
        described: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        for key in self.files:
            known = self.described.get(key)
            if known is None or key in found:
                continue
            told = schema_from_stats(known.stats, table=table_schema)
            if told is not None:
                described[key] = (told[0], add_stats_from_stats(known.stats))
        found.update(
            await self._footers(store, [k for k in self.files if k not in described and k not in found])
        )
        adds = []
        for key, rel, part in zip(self.files, rels, parts, strict=True):
            if sorted(part) != sorted(columns):
                raise CommitStepFailed(
                    f"{key}: partition folders {sorted(part)} do not match the table's columns {columns}"
                )
            if key in described:
                file_schema, stats = described[key]
                size = self.described[key].size
            else:
                size, meta = found[key]
                file_schema, _ = delta_schema(meta.schema.to_arrow_schema())
                stats = file_stats(meta)
            why = schema_mismatch(table_schema, file_schema, columns)
            if why is not None:
                raise CommitStepFailed(f"Delta table {self.dataset}: schema mismatch in {key}: {why}")
            adds.append(AddFile(rel=rel, size=size, partition=part, stats=stats))
        return adds, new_table

    @staticmethod
    async def _footers(store: ObjectStore, keys: list[str]) -> dict[str, tuple[int, Any]]:
        """Return the size and Parquet footer of each file of ``keys``, each read whole through the port.

        Raises:
            CommitStepFailed: a file is not Parquet.
            TransientError / OutcomeUnknown: the store failed.
        """
        if not keys:
            return {}
        pq = _pyarrow_parquet()
        found: dict[str, tuple[int, Any]] = {}

        async def one(key: str) -> None:
            data = (await store.read(key)).data

            def footer() -> Any:
                try:
                    return pq.read_metadata(io.BytesIO(data))
                except Exception as exc:  # pyarrow's own errors: the file is not Parquet
                    raise CommitStepFailed(f"{key} is not a readable Parquet file: {exc}") from exc

            found[key] = (len(data), await asyncio.to_thread(footer))

        await for_each_bounded(keys, one, _READS)
        return found


def delta_step(req: CommitRequest, binding: TableBinding) -> CommitToDelta:
    """Return the Delta step of ``req``: its winners' published Parquet files (named as by plan_commit).

    Files whose producer sent statistics carry them (with their verified size).
    """
    files, described = winner_parquet_files(req)
    return CommitToDelta(
        dataset=req.dataset,
        job=req.job,
        mode=binding.mode,
        files=files,
        stream=req.stream,
        described=described,
        seq=req.seq,
    )


__all__ = [
    "CommitToDelta",
    "delta_step",
    "fleet_commit_at",
    "job_done",
    "txn_owner",
    "txn_version",
    "log_prefix",
    "read_state",
]
