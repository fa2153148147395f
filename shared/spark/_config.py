"""What a PySpark job needs to publish to a commitfleet fleet."""

from __future__ import annotations

import msgspec

from .._errors import ConfigError
from .._retry import RetryPolicy
from ..settings import RedisSettings, Secret, Settings, StoreSettings, coerce_secret, split_redis_url

PRODUCER_RETRY_INITIAL_DELAY = 0.05
"""Seconds: the first retry's delay is drawn from [0, this]; each later cap doubles up to the maximum."""
PRODUCER_RETRY_MAX_DELAY = 2.0
"""Seconds: the longest delay between two of the producer's tries (full jitter: drawn from [0, this])."""
_UNCOUNTED = 1_000_000  # attempts: the producer's retries end on their time budget


class ProducerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Connection and job settings of a producer (driver and executors).

    The value is pickled into every task, so it holds only plain settings.
    Credentials are :class:`~shared.Secret` values (a plain ``str`` given for
    one is wrapped): its repr, and any log or error that shows it, is masked.

    - ``redis_url``: the fleet's Redis (``redis://``, ``rediss://``, ``unix://``,
      or a cluster: ``redis+cluster://host:port[,host:port...]``, ``rediss+cluster://``);
      a password in it is moved into ``redis_password`` at construction.
    - ``redis_password``: the Redis password (any characters, no escaping).
    - ``store_url``: the fleet's store root (``file:///``, ``s3://``, ``gs://``,
      ``az://``); ``store`` carries endpoint and timeout settings for it.
    - ``fleet`` / ``shards``: the fleet name and its shard count; with
      ``shards=None`` the count recorded in Redis is used (the fleet must
      exist), otherwise it is checked against (or recorded into) Redis.
    - ``hmac_secret``: sign every message (empty: unsigned); ``sign_version``
      2 (fleet, stream, time and data) or 1 (data only, for older workers).
    - ``job_timeout``: seconds the driver may stay silent before the fleet
      aborts the job (the job context's heartbeat keeps a running job alive,
      however long it runs).
    - ``wait`` / ``wait_timeout``: on a clean exit, wait up to ``wait_timeout``
      seconds for the fleet's outcome of every dataset (``commit_job(wait=...)``
      overrides ``wait``).
    - ``app``: a free-text application name carried in ``JobStarted``.
    - ``upload_concurrency``: staged files written at once by one task.
    - ``redis_socket_timeout``: seconds per Redis command.
    - ``redis_durability``: what every publish waits for once Redis took it,
      as the fleet's ``redis.durability``: ``"memory"``, ``"replicas"``
      (``WAIT``), ``"aof"`` / ``"aof+replicas"`` (``WAITAOF``, Redis 7.2+); ``""``
      (default): ``"memory"``, or ``"replicas"`` when ``redis_wait_replicas`` > 0.
      Checked against the server at the first publish (a ConfigError, one line,
      when it cannot give it).
    - ``redis_wait_replicas`` / ``redis_wait_timeout``: the replica count of
      ``"replicas"`` / ``"aof+replicas"`` (0 there: 1), and the seconds per
      ``WAIT`` / ``WAITAOF`` (per batch).
    - ``redis_retry_budget``: seconds the producer keeps retrying a Redis call
      that failed transiently (a publish, the driver's heartbeat-free reads of
      the outcome and of a streaming app's run record) before the error reaches
      the task or the driver: capped, jittered backoff (delays up to
      :data:`PRODUCER_RETRY_MAX_DELAY` s). The default, 60 s, outlasts a
      Sentinel failover with Sentinel's default ``down-after-milliseconds``
      (30 s) plus its election, and a Redis Cluster failover with the default
      ``cluster-node-timeout`` (15 s); a command that hangs adds up to
      ``redis_socket_timeout`` to it.
    - ``preflight``: before the job starts, run one probe task on the executors
      (package, store write and delete, Redis); off only to save its ~1 s.
    """

    redis_url: str
    store_url: str
    fleet: str = "default"
    shards: int | None = None
    store: StoreSettings = msgspec.field(default_factory=StoreSettings)
    redis_password: Secret = Secret()
    hmac_secret: Secret = Secret()
    sign_version: int = 2
    job_timeout: float = 300.0
    wait: bool = True
    wait_timeout: float = 900.0
    app: str = ""
    upload_concurrency: int = 8
    redis_socket_timeout: float = 10.0
    preflight: bool = True
    redis_wait_replicas: int = 0
    redis_wait_timeout: float = 1.0
    redis_durability: str = ""
    redis_retry_budget: float = 60.0

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "hmac_secret", coerce_secret(self.hmac_secret))
        password = coerce_secret(self.redis_password)
        clean, in_url = split_redis_url(self.redis_url)
        if in_url is not None:
            if password:
                raise ConfigError("redis_url holds a password and redis_password is set too: give one")
            password = Secret(in_url)
        msgspec.structs.force_setattr(self, "redis_url", clean)
        msgspec.structs.force_setattr(self, "redis_password", password)
        if self.sign_version not in (1, 2):
            raise ConfigError(f"sign_version must be 1 or 2, got {self.sign_version}")
        if not self.store_url.startswith(("file://", "s3://", "gs://", "az://")):
            raise ConfigError(f"store_url must start with file://, s3://, gs:// or az://: {self.store_url!r}")
        try:
            self.redis_settings  # noqa: B018 - validates the URL and the durability settings
        except ValueError as exc:
            raise ConfigError(f"redis_url: {exc}") from None
        if self.shards is not None and not 1 <= self.shards <= 16384:
            raise ConfigError(f"shards must be between 1 and 16384, got {self.shards}")
        if self.job_timeout <= 0:
            raise ConfigError(f"job_timeout must be > 0, got {self.job_timeout}")
        if self.wait_timeout <= 0:
            raise ConfigError(f"wait_timeout must be > 0, got {self.wait_timeout}")
        if self.upload_concurrency < 1:
            raise ConfigError(f"upload_concurrency must be >= 1, got {self.upload_concurrency}")
        if not self.redis_retry_budget > 0:
            raise ConfigError(f"redis_retry_budget must be > 0 seconds, got {self.redis_retry_budget}")

    @classmethod
    def from_settings(
        cls, settings: Settings, *, job_timeout: float | None = None, app: str = ""
    ) -> ProducerConfig:
        """Return the producer config that a fleet's :class:`~shared.Settings` describe.

        ``job_timeout`` defaults to ``worker.job_timeout``.

        Raises:
            ConfigError: ``store.url`` is empty or a value is out of range.
        """
        return cls(
            redis_url=settings.redis.url,
            redis_password=settings.redis.password,
            store_url=settings.store.url,
            fleet=settings.fleet.name,
            shards=settings.fleet.shards or None,  # 0: the count recorded in Redis
            store=settings.store,
            hmac_secret=settings.security.hmac_secret,
            sign_version=settings.security.sign_version,
            job_timeout=settings.worker.job_timeout if job_timeout is None else job_timeout,
            app=app,
            redis_socket_timeout=settings.redis.socket_timeout,
            redis_wait_replicas=settings.redis.wait_replicas,
            redis_wait_timeout=settings.redis.wait_timeout,
            redis_durability=settings.redis.durability,
        )

    @property
    def redis_settings(self) -> RedisSettings:
        """The Redis connection settings this config implies."""
        return RedisSettings(
            url=self.redis_url,
            password=self.redis_password,
            socket_timeout=self.redis_socket_timeout,
            wait_replicas=self.redis_wait_replicas,
            wait_timeout=self.redis_wait_timeout,
            durability=self.redis_durability,
        )

    @property
    def retry_policy(self) -> RetryPolicy:
        """The retry policy of the producer's Redis calls: ``redis_retry_budget`` seconds, capped jittered
        backoff (the budget, not a count of attempts, ends it)."""
        return RetryPolicy(
            attempts=_UNCOUNTED,
            initial=PRODUCER_RETRY_INITIAL_DELAY,
            maximum=PRODUCER_RETRY_MAX_DELAY,
            budget=self.redis_retry_budget,
        )

    def with_shards(self, shards: int) -> ProducerConfig:
        """Return a copy whose shard count is fixed to ``shards``."""
        return msgspec.structs.replace(self, shards=shards)


__all__ = ["PRODUCER_RETRY_INITIAL_DELAY", "PRODUCER_RETRY_MAX_DELAY", "ProducerConfig"]
