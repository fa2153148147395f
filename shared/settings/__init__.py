"""The settings of a commitfleet process: the frozen sections, how they are loaded, credentials, Redis URLs.

Settings enter once (defaults, a TOML file, environment variables, overrides:
:func:`load_settings`) into a frozen :class:`Settings` passed down explicitly.
Credentials are :class:`Secret` values, masked wherever they are shown; a
password written in a Redis URL is moved out of it (:func:`split_redis_url`).
"""

from ._durability import LEVELS, MEMORY, Durability, DurabilityLevel, resolve_durability
from ._load import load_settings
from ._redis_url import (
    ClusterUrl,
    SentinelUrl,
    is_cluster_url,
    is_sentinel_url,
    masked_url,
    parse_cluster_url,
    parse_sentinel_url,
    split_redis_url,
)
from ._secret import MASK, Secret, coerce_secret, secret_dec_hook, secret_enc_hook
from ._sections import (
    AdminSettings,
    CommitSettings,
    CoordinatorSettings,
    FleetSettings,
    LockSettings,
    LogSettings,
    QueueSettings,
    RedisSettings,
    RetrySettings,
    SecuritySettings,
    Settings,
    StoreSettings,
    TableBindingSettings,
    TableMode,
    TablesSettings,
    TracingSettings,
    WorkerSettings,
    is_loopback_host,
)

__all__ = [
    "LEVELS",
    "MASK",
    "MEMORY",
    "Durability",
    "DurabilityLevel",
    "AdminSettings",
    "ClusterUrl",
    "CommitSettings",
    "CoordinatorSettings",
    "FleetSettings",
    "LockSettings",
    "LogSettings",
    "QueueSettings",
    "RedisSettings",
    "RetrySettings",
    "Secret",
    "SecuritySettings",
    "SentinelUrl",
    "Settings",
    "StoreSettings",
    "TableBindingSettings",
    "TableMode",
    "TablesSettings",
    "TracingSettings",
    "WorkerSettings",
    "coerce_secret",
    "is_cluster_url",
    "is_sentinel_url",
    "is_loopback_host",
    "load_settings",
    "masked_url",
    "parse_cluster_url",
    "parse_sentinel_url",
    "resolve_durability",
    "secret_dec_hook",
    "secret_enc_hook",
    "split_redis_url",
]
