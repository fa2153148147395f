"""The exactly-once commit core: commit steps, the write-ahead log, recovery, abort, audit.

The worker's calls, each under the dataset's lock (it passes the lease):
:func:`commit_dataset`, :func:`abort_dataset`, :func:`recover_dataset`;
operators': :func:`retry_quarantined`, :func:`skip_quarantined`, :func:`audit`;
readers of a bound table's catalog (:func:`open_catalog`, :func:`load_table`, the snapshot properties);
of a Delta-bound dataset's log (:func:`read_state`).
See docs/commit.md; the commit pipeline reads top to bottom in ``_commit.py``.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ._abort import abort_dataset, cleanup_staged_attempt
from ._audit import AuditReport, AuditViolation, ViolationKind, audit
from ._bounded import for_each_bounded
from ._catalog import CommitToTable, resolve_binding, table_step
from ._catalog_ops import (
    DATASET_PROPERTY,
    JOB_PROPERTY,
    STREAM_APP_PROPERTY,
    STREAM_BATCH_PROPERTY,
    STREAM_QUERY_PROPERTY,
    catalog_properties,
    load_table,
    open_catalog,
)
from ._commit import commit_dataset, execute_sequence, recover_dataset
from ._delta import CommitToDelta, read_state
from ._errors import CommitStepFailed
from ._head_start import HeadStarts
from ._model import (
    CommitRequest,
    Manifest,
    ManifestFile,
    StagedFile,
    StreamRecord,
    WatermarksDoc,
    WinningAttempt,
)
from ._operator import retry_quarantined, skip_quarantined
from ._plan import plan_commit
from ._progress import describe_step
from ._publish import PublishFile
from ._registry import DEFAULT_REGISTRY, StepRegistry, register_step_kind
from ._results import AbortResult, CommitResult, RecoveryResult, SkipResult
from ._steps import (
    Cleanup,
    CommitProbe,
    CommitStep,
    Phase,
    StepContext,
    WriteManifest,
    read_manifest,
)
from ._stream_gate import REFUSED_PREFIX, stream_verdict
from ._stream_records import list_stream_datasets, read_stream_records, reset_stream
from ._survey import UnfinishedSequence, list_unfinished
from ._table_files import DescribedFile, data_file_from_stats
from ._wal import CommitSequence, decode_sequence, encode_sequence, read_sequence
from ._watermarks import AdvanceWatermarks, StreamMark, merge_watermarks, read_watermarks, read_watermarks_doc

if TYPE_CHECKING:
    from ._sql_catalog import SqlTableCatalog
    from ._table_io import TableFileIO

# Imports pyiceberg (the optional ``tables`` extra): loaded when pyiceberg asks for it by name.
__getattr__ = lazy_exports(__name__, {"TableFileIO": "._table_io", "SqlTableCatalog": "._sql_catalog"})

__all__ = [
    "SqlTableCatalog",
    "TableFileIO",
    "DescribedFile",
    "data_file_from_stats",
    "for_each_bounded",
    "DATASET_PROPERTY",
    "DEFAULT_REGISTRY",
    "REFUSED_PREFIX",
    "JOB_PROPERTY",
    "STREAM_APP_PROPERTY",
    "STREAM_BATCH_PROPERTY",
    "STREAM_QUERY_PROPERTY",
    "AbortResult",
    "AdvanceWatermarks",
    "AuditReport",
    "AuditViolation",
    "Cleanup",
    "CommitProbe",
    "CommitRequest",
    "CommitResult",
    "CommitSequence",
    "CommitStep",
    "CommitStepFailed",
    "CommitToDelta",
    "CommitToTable",
    "HeadStarts",
    "Manifest",
    "ManifestFile",
    "Phase",
    "PublishFile",
    "RecoveryResult",
    "SkipResult",
    "StagedFile",
    "StepContext",
    "StepRegistry",
    "StreamMark",
    "StreamRecord",
    "UnfinishedSequence",
    "ViolationKind",
    "WatermarksDoc",
    "WinningAttempt",
    "WriteManifest",
    "abort_dataset",
    "audit",
    "catalog_properties",
    "cleanup_staged_attempt",
    "commit_dataset",
    "decode_sequence",
    "describe_step",
    "encode_sequence",
    "execute_sequence",
    "list_stream_datasets",
    "list_unfinished",
    "load_table",
    "merge_watermarks",
    "open_catalog",
    "plan_commit",
    "read_manifest",
    "read_sequence",
    "read_state",
    "read_stream_records",
    "read_watermarks",
    "read_watermarks_doc",
    "recover_dataset",
    "register_step_kind",
    "reset_stream",
    "resolve_binding",
    "retry_quarantined",
    "skip_quarantined",
    "stream_verdict",
    "table_step",
]
