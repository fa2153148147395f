"""The PySpark producer side: a local session builder, the driver's job context and
the executors' task writer.

Importing this package does not import pyspark; functions that need it import it
when they run, so workers and tools can import ``shared`` without a JVM.
"""

from ..queue import DatasetResult
from ._config import ProducerConfig
from ._job import JobCancelledError, JobContext, commit_job, new_job_id
from ._outcome import JobNotCommitted, OutcomeForgotten, OutcomeTimeout, wait_for_outcome
from ._pack import Pack, build_pack
from ._parquet_stats import parquet_file_stats
from ._session import local_spark_session
from ._stream import BatchCommitter, BatchJob, BatchOutcome, BatchProbe, commit_batches
from ._stream_plan import StreamConflict
from ._winners import TaskResult
from ._writer import InjectedTaskFailure, WatermarkFn, Watermarks, max_watermark

__all__ = [
    "BatchCommitter",
    "BatchJob",
    "BatchOutcome",
    "BatchProbe",
    "StreamConflict",
    "commit_batches",
    "Pack",
    "build_pack",
    "DatasetResult",
    "JobNotCommitted",
    "OutcomeForgotten",
    "OutcomeTimeout",
    "wait_for_outcome",
    "InjectedTaskFailure",
    "JobCancelledError",
    "JobContext",
    "ProducerConfig",
    "TaskResult",
    "WatermarkFn",
    "Watermarks",
    "commit_job",
    "local_spark_session",
    "max_watermark",
    "new_job_id",
    "parquet_file_stats",
]
