"""Loading the settings: built-in defaults, then a TOML file, then environment variables, then overrides.

Precedence (lowest to highest): built-in defaults, the TOML file
(``--config`` or ``COMMITFLEET_CONFIG``), environment variables
``COMMITFLEET_<SECTION>_<KEY>`` (for example ``COMMITFLEET_LOCK_VALIDITY=20``),
the conventional shortcuts ``REDIS_URL``, ``REDIS_PASSWORD`` and
``COMMITFLEET_STORE`` (the store root URL), and the caller's overrides.
The sections and their checks live in :mod:`._sections`.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from .._errors import ConfigError
from ._redis_url import split_redis_url
from ._secret import secret_dec_hook
from ._sections import Settings

ENV_PREFIX = "COMMITFLEET_"

_SHORTCUTS = {
    "REDIS_URL": ("redis", "url"),
    "REDIS_PASSWORD": ("redis", "password"),
    "COMMITFLEET_STORE": ("store", "url"),
}


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sections = set(Settings.__struct_fields__)
    for var, (section, key) in _SHORTCUTS.items():
        if env.get(var):
            out.setdefault(section, {})[key] = env[var]
    for var, value in env.items():
        if not var.startswith(ENV_PREFIX) or var in _SHORTCUTS or var == ENV_PREFIX + "CONFIG":
            continue
        rest = var[len(ENV_PREFIX) :].lower()
        section, _, key = rest.partition("_")
        if section not in sections or not key:
            raise ConfigError(f"unknown setting in environment: {var}")
        if section == "commit" and key.startswith("retry_"):
            out.setdefault("commit", {}).setdefault("retry", {})[key[len("retry_") :]] = value
        else:
            out.setdefault(section, {})[key] = value
    return out


def _check_text(env: Mapping[str, str]) -> None:
    """Raise ConfigError naming the first of our variables whose value is not UTF-8 text.

    Bytes that are not UTF-8 reach ``os.environ`` as surrogates, which no
    setting can hold.
    """
    for var, value in env.items():
        if var.startswith(ENV_PREFIX) or var in _SHORTCUTS:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(f"{var} is not valid UTF-8 text") from None


def _check_finite(section: msgspec.Struct, where: str) -> None:
    """Raise ConfigError naming the first number in ``section`` (recursively) that is NaN or infinite.

    ``nan`` and ``inf`` parse as floats, but no setting means anything by
    them: every comparison with NaN is false, so it would pass each range
    check and then break a lease, a timeout or a count far from the setting.
    """
    for name in section.__struct_fields__:
        value = getattr(section, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"bad setting: {where}{name} must be a finite number, got {value}")
        if isinstance(value, msgspec.Struct):
            _check_finite(value, f"{where}{name}.")


def _lift_password(layer: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """Return ``layer`` with a password in its ``redis.url`` moved to its ``redis.password``.

    Done per layer, before the layers are merged, so precedence holds for the
    password too (``REDIS_URL`` with a password beats a config file's
    ``redis.password``).

    Raises:
        ConfigError: the layer gives both (never echoing either).
    """
    redis = layer.get("redis")
    if not isinstance(redis, Mapping) or not isinstance(redis.get("url"), str):
        return layer
    clean, password = split_redis_url(redis["url"])
    if password is None:
        return layer
    if redis.get("password"):
        raise ConfigError(f"{source} gives redis.url with a password and redis.password too: give one")
    return {**layer, "redis": {**redis, "url": clean, "password": password}}


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build the frozen settings from defaults, a TOML file, env vars and overrides.

    ``overrides`` (nested dicts, e.g. from CLI flags) win over everything.

    Returns:
        The validated :class:`Settings`.

    Raises:
        ConfigError: one line saying which setting is wrong and why.
    """
    env = os.environ if env is None else env
    _check_text(env)
    raw: dict[str, Any] = {}
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8 text: {exc}") from None
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    raw = dict(_lift_password(raw, f"config file {path}"))
    raw = _merge(raw, _lift_password(_env_overrides(env), "the environment"))
    if overrides:
        raw = _merge(raw, _lift_password(overrides, "the command line"))
    try:
        settings = msgspec.convert(raw, Settings, strict=False, dec_hook=secret_dec_hook)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"bad setting: {exc}") from None
    except UnicodeError as exc:  # text given by a caller's overrides that no setting can hold
        raise ConfigError(f"bad setting: {exc}") from None
    _check_finite(settings, "")
    return settings


__all__ = ["load_settings"]
