"""Redis Streams access: shard routing, key names, publishing, consumer groups,
dead letters, the admin stream and the fleet's meta record.

See docs/queue.md for the key layout, entry fields and consumer-group semantics.
"""

from ._admin_stream import DEFAULT_ADMIN_MAXLEN, AdminPublisher, Outcome, follow_admin, read_admin_range
from ._cluster import is_cluster
from ._connect import connect, connect_sync, redis_errors
from ._consumer import DEFAULT_GROUP, ConsumerInfo, ShardConsumer, ShardLag, Trimmed, trim_acknowledged
from ._dead_letters import DeadLetter, cap_dead_letters, count_dead_letters, read_dead_letters
from ._durability import (
    PROBE_TIMEOUT_S,
    check_durability,
    check_durability_sync,
    check_durable,
    make_durable,
    probe_keys,
    queue_durable,
)
from ._entry import Entry, as_text, entries_from_raw, entries_from_reply, fields_of, id_key
from ._fleet_meta import (
    DEFAULT_SHARDS,
    FleetMeta,
    ensure_fleet,
    ensure_fleet_sync,
    existing_fleet,
    join_fleet,
    read_fleet_meta,
)
from ._job_outcome import (
    RESULT_RETENTION_S,
    DatasetResult,
    JobOutcome,
    beat_sync,
    describe_failures,
    encode_result,
    heartbeat_interval,
    heartbeat_ttl,
    job_shards,
    outcome_of,
    read_outcome,
    read_outcome_sync,
)
from ._keys import Keys
from ._operator_requests import (
    OperatorRequest,
    check_request_names,
    drop_operator_request,
    quarantine_reason,
    queue_operator_request,
    read_operator_requests,
)
from ._publisher import AsyncPublisher, SyncPublisher, plan_entries, retry_sync
from ._routing import group_by_shard, shard_of, split_by_shard
from ._stream_replies import keep_repeated_fields
from ._stream_runs import (
    RunState,
    StreamRun,
    delete_stream_run,
    read_stream_run,
    read_stream_run_sync,
    stream_run_key,
    write_stream_run_sync,
)

__all__ = [
    "Outcome",
    "retry_sync",
    "PROBE_TIMEOUT_S",
    "check_durability",
    "check_durability_sync",
    "check_durable",
    "is_cluster",
    "queue_durable",
    "make_durable",
    "probe_keys",
    "RESULT_RETENTION_S",
    "DatasetResult",
    "JobOutcome",
    "beat_sync",
    "describe_failures",
    "encode_result",
    "heartbeat_interval",
    "heartbeat_ttl",
    "job_shards",
    "outcome_of",
    "read_outcome",
    "read_outcome_sync",
    "DEFAULT_ADMIN_MAXLEN",
    "DEFAULT_GROUP",
    "DEFAULT_SHARDS",
    "AdminPublisher",
    "AsyncPublisher",
    "ConsumerInfo",
    "DeadLetter",
    "Trimmed",
    "cap_dead_letters",
    "trim_acknowledged",
    "Entry",
    "entries_from_raw",
    "entries_from_reply",
    "fields_of",
    "keep_repeated_fields",
    "FleetMeta",
    "Keys",
    "OperatorRequest",
    "drop_operator_request",
    "check_request_names",
    "quarantine_reason",
    "queue_operator_request",
    "read_operator_requests",
    "ShardConsumer",
    "ShardLag",
    "SyncPublisher",
    "connect",
    "connect_sync",
    "count_dead_letters",
    "as_text",
    "ensure_fleet",
    "ensure_fleet_sync",
    "existing_fleet",
    "follow_admin",
    "group_by_shard",
    "id_key",
    "join_fleet",
    "plan_entries",
    "read_admin_range",
    "read_dead_letters",
    "read_fleet_meta",
    "redis_errors",
    "RunState",
    "StreamRun",
    "delete_stream_run",
    "read_stream_run",
    "read_stream_run_sync",
    "stream_run_key",
    "write_stream_run_sync",
    "shard_of",
    "split_by_shard",
]
