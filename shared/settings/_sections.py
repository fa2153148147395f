"""Configuration: enters once, from a TOML file and environment variables, into a
frozen :class:`Settings` object that is then passed down explicitly.

The sections and their checks live here; :func:`shared.settings.load_settings` builds
them (defaults, TOML file, environment, overrides: its doc gives the precedence).

Credentials (``redis.password``, ``security.hmac_secret``, ``coordinator.admin_token``,
``store.azure_connection_string``, ``store.azure_account_url``) are :class:`~shared.settings.Secret` values:
masked wherever settings are shown. A password written in ``redis.url`` is
moved into ``redis.password`` when the settings are built, so ``redis.url``
can always be printed.

A bad setting raises :class:`~shared._errors.ConfigError` whose message is one
line naming the setting and what is wrong with it.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

import msgspec

from ._durability import Durability, resolve_durability
from ._redis_url import check_redis_url, split_redis_url
from ._secret import Secret, coerce_secret

TableMode = Literal["append", "create", "overwrite"]


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A frozen section: an unknown key is an error (a typo must not pass for a default)."""


class FleetSettings(_Section, frozen=True):
    """Fleet identity and shard count (fixed when the fleet is created).

    ``shards`` 0 (the default) means "the fleet's own count", read from its
    record in Redis when a process starts (a new fleet is created with 64);
    a count set here must agree with the record.
    """

    name: str = "default"
    shards: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.shards <= 16384:
            raise ValueError("fleet.shards must be between 1 and 16384 (or 0: the fleet's own count)")
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError("fleet.name must be letters, digits, '-' or '_'")


class RedisSettings(_Section, frozen=True):
    """Redis connection (redis://, rediss:// with TLS, an ACL user name in the URL; a Redis Cluster or
    a Sentinel-managed master: see :mod:`shared.settings._redis_url`).

    The password goes in ``password`` (any characters, no escaping) or in the
    URL (``redis://user:password@host``, percent-encoded as URLs require); a
    URL's password is moved into ``password`` at construction, so ``url``
    never holds one. Giving both is an error.
    """

    url: str = "redis://127.0.0.1:6379/0"
    password: Secret = Secret()
    socket_timeout: float = 10.0

    # -- Durability (docs/queue.md "Durability") and Redis Cluster ("Redis Cluster") ---------
    # redis+cluster://host:port[,host:port...] (rediss+cluster:// with TLS) selects a cluster,
    # redis+sentinel://host:port[,host:port...]/SERVICE[/db] a master found through Sentinel.
    # durability: "memory", "replicas" (WAIT), "aof" (WAITAOF 1 0, Redis 7.2+) or "aof+replicas"
    # (WAITAOF 1 n): what the fleet's durable writes wait for after Redis acknowledged them.
    # "" (not set): "memory", or "replicas" when wait_replicas > 0 (the older setting, an alias).
    # wait_replicas: the n of "replicas" / "aof+replicas" (0 there means 1); wait_timeout: seconds
    # per WAIT / WAITAOF; fewer acknowledgements is a transient error (the write is retried).
    durability: str = ""
    wait_replicas: int = 0
    wait_timeout: float = 1.0

    def __post_init__(self) -> None:
        # A struct built in code may hold a plain str; a struct built by load_settings, a Secret.
        msgspec.structs.force_setattr(self, "password", coerce_secret(self.password))
        clean, in_url = split_redis_url(self.url)
        if in_url is not None:
            if self.password:
                raise ValueError("redis.url holds a password and redis.password is set too: give one")
            msgspec.structs.force_setattr(self, "password", Secret(in_url))
        msgspec.structs.force_setattr(self, "url", clean)
        check_redis_url(self.url)  # raises ValueError with a one-line reason
        resolve_durability(self.durability, self.wait_replicas, self.wait_timeout)  # one-line ValueError

    @property
    def durable(self) -> Durability:
        """The durability level these settings ask for, resolved (``durability`` with ``wait_replicas``)."""
        return resolve_durability(self.durability, self.wait_replicas, self.wait_timeout)


class StoreSettings(_Section, frozen=True):
    """Object store root and explicit emulator/endpoint settings.

    Credentials otherwise come from each SDK's standard places (AWS env vars and
    profiles, GOOGLE_APPLICATION_CREDENTIALS, Azure connection string).
    """

    url: str = ""
    s3_endpoint_url: str = ""
    s3_region: str = "us-east-1"
    s3_max_pool_connections: int = 64
    gcs_endpoint: str = ""
    azure_connection_string: Secret = Secret()
    # A Secret: it may carry a SAS token (?sv=...&sig=...).
    azure_account_url: Secret = Secret()
    request_timeout: float = 30.0
    # Attempts the S3 and Azure SDKs make per request before an error reaches the caller
    # (1 = no SDK-level retries; callers retry with their own RetryPolicy either way).
    sdk_attempts: int = 3
    # Threads of a local-files store (file://) per process: its blocking file calls run there.
    # More threads than the disk can use add GIL handoffs, not throughput (docs/storage.md).
    local_threads: int = 4
    # Chaos testing only: this fraction of store requests fails on purpose
    # (throttling, 5xx, lost replies). 0 = off. Never in production.
    chaos_fault_rate: float = 0.0
    # Benchmarks only: delay each store request like a cloud store (lognormal with this
    # median and 99th percentile, in ms; 0 = off). Never in production.
    model_latency_ms: float = 0.0
    model_latency_p99_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("azure_connection_string", "azure_account_url"):
            msgspec.structs.force_setattr(self, name, coerce_secret(getattr(self, name)))
        if not 0.0 <= self.chaos_fault_rate < 1.0:
            raise ValueError("store.chaos_fault_rate must be in [0, 1)")
        if self.model_latency_ms < 0 or (
            self.model_latency_ms > 0 and self.model_latency_p99_ms < self.model_latency_ms
        ):
            raise ValueError("store.model_latency_ms must be >= 0 and model_latency_p99_ms at least as large")
        if self.url and not self.url.startswith(("file://", "s3://", "gs://", "az://")):
            raise ValueError("store.url must start with file://, s3://, gs:// or az://")
        if self.request_timeout <= 0:
            raise ValueError("store.request_timeout must be > 0")
        if not 1 <= self.sdk_attempts <= 10:
            raise ValueError("store.sdk_attempts must be between 1 and 10")
        if not 1 <= self.local_threads <= 256:
            raise ValueError("store.local_threads must be between 1 and 256")


class LockSettings(_Section, frozen=True):
    """The storage lock's timing, in seconds.

    ``validity`` is how long a lease lasts without renewal; ``renew_interval``
    must be well inside it (at most a third) so two renewals can fail before the
    lease runs out; ``max_drift`` is the clock drift allowed between hosts.
    """

    validity: float = 30.0
    renew_interval: float = 10.0
    max_drift: float = 0.5
    acquire_timeout: float = 60.0
    poll_min: float = 0.05
    poll_max: float = 2.0

    def __post_init__(self) -> None:
        if self.validity <= 0 or self.renew_interval <= 0 or self.max_drift < 0:
            raise ValueError("lock.validity and lock.renew_interval must be > 0, lock.max_drift >= 0")
        if self.renew_interval * 3 > self.validity:
            raise ValueError("lock.renew_interval must be at most a third of lock.validity")
        if self.poll_min <= 0 or self.poll_max < self.poll_min:
            raise ValueError("lock.poll_min must be > 0 and <= lock.poll_max")


class RetrySettings(_Section, frozen=True):
    """Capped, jittered exponential backoff with a total time budget."""

    attempts: int = 8
    initial: float = 0.05
    maximum: float = 2.0
    budget: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.initial < 0 or self.maximum < self.initial or self.budget <= 0:
            raise ValueError("retry: attempts >= 1, 0 <= initial <= maximum, budget > 0")


class CommitSettings(_Section, frozen=True):
    """Commit execution: publish parallelism and the retry budget before quarantine."""

    publish_concurrency: int = 16
    retry: RetrySettings = msgspec.field(default_factory=RetrySettings)

    def __post_init__(self) -> None:
        if self.publish_concurrency < 1:
            raise ValueError("commit.publish_concurrency must be >= 1")


class WorkerSettings(_Section, frozen=True):
    """A worker process: identity, lease, intake batching, concurrency, drain, health endpoint."""

    id: str = ""
    lease: float = 15.0
    heartbeat: float = 3.0
    read_batch: int = 500
    read_block_ms: int = 500
    max_inflight_datasets: int = 32
    # Work (commits, aborts, recoveries, clean-ups) a shard keeps queued before
    # its intake pauses: the queue's memory bound (workers._scheduler).
    max_queued_work: int = 20_000
    drain_grace: float = 30.0
    # Seconds a job's driver may stay silent (no liveness key seen) before the
    # fleet aborts the job; for jobs that never announced their own timeout.
    job_timeout: float = 300.0
    # A hard limit on a job's life, counted from when its shard first heard of
    # it, heartbeat or not (0 = none).
    max_job_duration: float = 0.0
    # Seconds between two glibc malloc_trim(0) calls, which hand freed heap back to the OS (0 = never).
    malloc_trim_interval: float = 10.0
    # The health endpoint (/livez, /readyz, /startupz, /metrics; workers/_health_http.py): its port (0 = off)
    # and address. It carries no secret, so any address may be bound without a token.
    http_port: int = 0
    http_host: str = "127.0.0.1"
    # /livez fails when the event loop fell this many seconds behind (a blocked or starved loop).
    max_loop_lag: float = 5.0

    def __post_init__(self) -> None:
        if self.malloc_trim_interval < 0:
            raise ValueError("worker.malloc_trim_interval must be >= 0")
        if not 0 <= self.http_port <= 65535:
            raise ValueError("worker.http_port must be 0..65535 (0 = no health endpoint)")
        if not self.http_host:
            raise ValueError("worker.http_host must not be empty")
        if self.max_loop_lag <= 0:
            raise ValueError("worker.max_loop_lag must be > 0")
        if self.heartbeat * 3 > self.lease:
            raise ValueError("worker.heartbeat must be at most a third of worker.lease")
        if self.job_timeout <= 0 or self.max_job_duration < 0:
            raise ValueError("worker.job_timeout must be > 0 and worker.max_job_duration >= 0")
        if not 1 <= self.read_batch <= 10_000 or self.max_inflight_datasets < 1 or self.max_queued_work < 1:
            # Each batch is judged and saved whole (one script): its size bounds a save's memory and time.
            raise ValueError(
                "worker.read_batch must be 1..10000,"
                " worker.max_inflight_datasets and worker.max_queued_work >= 1"
            )


class CoordinatorSettings(_Section, frozen=True):
    """The coordinator: rebalance cadence and the admin HTTP API.

    ``admin_token``: the bearer token of the admin API and web console (empty
    = none; then the API may only be bound to a loopback address: the
    coordinator refuses to start otherwise). ``allowed_hosts``: comma-separated
    host names the API answers to besides the loopback names (the Host header
    check that stops DNS rebinding). ``request_timeout``: seconds a request
    (other than an event stream) may take. ``sse_max_clients``: event-stream
    clients served at once; ``sse_keepalive``: seconds between keep-alive
    comments of an idle event stream.
    """

    http_host: str = "127.0.0.1"
    http_port: int = 8787
    tick: float = 1.0
    admin_token: Secret = Secret()
    allowed_hosts: str = ""
    request_timeout: float = 30.0
    sse_max_clients: int = 32
    sse_keepalive: float = 15.0

    def __post_init__(self) -> None:
        if not 0 <= self.http_port <= 65535:
            raise ValueError("coordinator.http_port must be 0..65535")
        if self.request_timeout <= 0 or self.sse_keepalive <= 0:
            raise ValueError("coordinator.request_timeout and coordinator.sse_keepalive must be > 0")
        if self.sse_max_clients < 1:
            raise ValueError("coordinator.sse_max_clients must be >= 1")
        msgspec.structs.force_setattr(self, "admin_token", coerce_secret(self.admin_token))
        token = self.admin_token.reveal()
        if token and (len(token) < 16 or not token.isprintable()):
            raise ValueError("coordinator.admin_token must be at least 16 printable characters")
        if not self.admin_token and not is_loopback_host(self.http_host):
            raise ValueError(
                f"coordinator.admin_token is required to serve the admin API on {self.http_host!r} "
                "(not a loopback address); set COMMITFLEET_COORDINATOR_ADMIN_TOKEN"
            )


def is_loopback_host(host: str) -> bool:
    """Return True when ``host`` (an address or name to bind) only listens on the machine itself."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SecuritySettings(_Section, frozen=True):
    """Message signing and size limits (signing: docs/contract.md section 5).

    ``hmac_secret`` empty: signing off. ``sign_version`` is what this process
    signs with (2: fleet, stream, timestamp and data; 1: data only, for a
    fleet whose workers are older). ``accept_v1`` keeps v1 signatures readable
    during the transition: turn it off once every producer signs v2.
    ``signature_max_age`` is the window, in seconds, between a v2 message's
    signing time and its arrival in the stream (also the clock skew allowed);
    older (or that far in the future) is rejected as ``stale``.
    """

    hmac_secret: Secret = Secret()
    sign_version: Literal[1, 2] = 2
    accept_v1: bool = True
    signature_max_age: float = 300.0
    max_message_bytes: int = 1_048_576
    # Dataset names are one path segment: they start with a letter or digit, so
    # they can never collide with the store's own `_staging`, `_wal`, ... areas.
    dataset_pattern: str = r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}$"

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "hmac_secret", coerce_secret(self.hmac_secret))
        if self.signature_max_age <= 0:
            raise ValueError("security.signature_max_age must be > 0")


class AdminSettings(_Section, frozen=True):
    """The capped admin event stream."""

    stream_maxlen: int = 100_000


class QueueSettings(_Section, frozen=True):
    """What the shard streams keep, and for how long (docs/queue.md, "What is kept").

    Acknowledged entries are trimmed from the shard streams by the shard's
    owner every ``trim_interval`` seconds (0 = never: the stream then grows
    with history). Dead letters are capped by count and by age. A shard
    remembers an ended job for ``ended_retention`` seconds, to drop (and clean
    up after) late events of it. The admin outcome markers (one per announced
    dataset and job) are capped at ``outcome_markers_max``, oldest forgotten
    first, and none is kept longer than ``ended_retention``. The job results
    (what a job's driver and ``commitfleet wait`` read) are capped at
    ``results_max`` per shard, oldest forgotten first, besides their one-day
    retention.
    """

    trim_interval: float = 10.0
    dead_letter_maxlen: int = 10_000
    dead_letter_max_age: float = 14 * 86400.0
    ended_retention: float = 7 * 86400.0
    outcome_markers_max: int = 100_000
    results_max: int = 10_000

    def __post_init__(self) -> None:
        if self.trim_interval < 0:
            raise ValueError("queue.trim_interval must be >= 0")
        if self.dead_letter_maxlen < 1 or self.dead_letter_max_age <= 0:
            raise ValueError("queue.dead_letter_maxlen must be >= 1 and queue.dead_letter_max_age > 0")
        if self.ended_retention <= 0:
            raise ValueError("queue.ended_retention must be > 0")
        if self.outcome_markers_max < 1:
            raise ValueError("queue.outcome_markers_max must be >= 1")
        if self.results_max < 1:
            raise ValueError("queue.results_max must be >= 1")


class LogSettings(_Section, frozen=True):
    """Logging: level and format (``auto`` = JSON unless stderr is a terminal)."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["auto", "json", "text"] = "auto"


class TableBindingSettings(_Section, frozen=True):
    """A fleet-level binding of one dataset to an Iceberg table (``namespace.name``), or ``delta = true``.

    With ``delta`` the dataset's own folder is a Delta Lake table and ``table`` stays empty.
    """

    table: str = ""
    mode: TableMode = "append"
    delta: bool = False


class TablesSettings(_Section, frozen=True):
    """The Iceberg catalog the commits of bound datasets land in.

    ``catalog`` is a pyiceberg catalog type (``sql``: SQLAlchemy, SQLite as the
    embedded default; ``rest``, ``glue``, ``hive``); ``uri`` its address
    (empty with ``sql``: ``<store root>/_tables/catalog.db``, local stores
    only); ``warehouse`` where new tables' metadata goes (empty: the store's
    ``_tables/warehouse`` folder, so data and metadata share a store and its
    credentials); ``properties`` more pyiceberg catalog properties (REST
    token, Glue region...). ``bindings`` binds datasets fleet-wide (a job's
    own binding in ``job_started`` wins). ``call_timeout`` bounds how long a
    cancelled catalog step waits for its call in flight to end.
    """

    catalog: Literal["sql", "rest", "glue", "hive"] = "sql"
    name: str = "commitfleet"
    uri: str = ""
    warehouse: str = ""
    properties: dict[str, str] = msgspec.field(default_factory=dict)
    bindings: dict[str, TableBindingSettings] = msgspec.field(default_factory=dict)
    call_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.catalog != "sql" and not self.uri and self.catalog != "glue":
            raise ValueError(f"tables.uri must be set for a {self.catalog} catalog")
        if self.call_timeout <= 0:
            raise ValueError("tables.call_timeout must be > 0")
        for dataset, b in self.bindings.items():
            if b.delta:
                if b.table:
                    raise ValueError(f"tables.bindings.{dataset}: give table or delta = true, not both")
                continue
            if len(b.table.split(".")) < 2 or not all(b.table.split(".")):
                raise ValueError(f"tables.bindings.{dataset}.table must be namespace.name, got {b.table!r}")


class TracingSettings(_Section, frozen=True):
    """Traces (OpenTelemetry, the ``otel`` extra; docs/tracing.md).

    ``enabled`` turns the process's spans on; where they go is the standard
    ``OTEL_*`` variables' (exporter, endpoint, sampler, service name). Off, no
    code of OpenTelemetry is imported.
    """

    enabled: bool = False


class Settings(_Section, frozen=True):
    """Every setting of a commitfleet process, frozen."""

    fleet: FleetSettings = msgspec.field(default_factory=FleetSettings)
    redis: RedisSettings = msgspec.field(default_factory=RedisSettings)
    store: StoreSettings = msgspec.field(default_factory=StoreSettings)
    lock: LockSettings = msgspec.field(default_factory=LockSettings)
    commit: CommitSettings = msgspec.field(default_factory=CommitSettings)
    worker: WorkerSettings = msgspec.field(default_factory=WorkerSettings)
    coordinator: CoordinatorSettings = msgspec.field(default_factory=CoordinatorSettings)
    security: SecuritySettings = msgspec.field(default_factory=SecuritySettings)
    admin: AdminSettings = msgspec.field(default_factory=AdminSettings)
    queue: QueueSettings = msgspec.field(default_factory=QueueSettings)
    log: LogSettings = msgspec.field(default_factory=LogSettings)
    tables: TablesSettings = msgspec.field(default_factory=TablesSettings)
    tracing: TracingSettings = msgspec.field(default_factory=TracingSettings)

    def with_shards(self, shards: int) -> Settings:
        """Return a copy with ``fleet.shards`` set to ``shards`` (the fleet's resolved count)."""
        return msgspec.structs.replace(self, fleet=msgspec.structs.replace(self.fleet, shards=shards))


__all__ = [
    "AdminSettings",
    "CommitSettings",
    "CoordinatorSettings",
    "FleetSettings",
    "LockSettings",
    "LogSettings",
    "QueueSettings",
    "RedisSettings",
    "RetrySettings",
    "SecuritySettings",
    "Settings",
    "StoreSettings",
    "TableBindingSettings",
    "TableMode",
    "TablesSettings",
    "TracingSettings",
    "WorkerSettings",
    "is_loopback_host",
]
