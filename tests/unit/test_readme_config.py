"""The README's configuration sample is complete and loads: it cannot drift from the settings object."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from shared import Settings, load_settings
from shared.settings import secret_enc_hook

README = Path(__file__).resolve().parents[2] / "README.md"
# The sample shows these with a value of its own; every other setting has its default.
NOT_DEFAULT = {"redis.url", "store.url"}


def sample() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Configuration") :]
    m = re.search(r"```toml\n(.*?)```", section, re.S)
    assert m is not None, "no ```toml block under ### Configuration"
    return m.group(1)


def flat(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_readme_sample_loads_names_every_setting_and_shows_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "readme.toml"
    path.write_text(sample())
    loaded = load_settings(path, env={})  # raises ConfigError if the sample is not accepted
    shown = flat(tomllib.loads(sample()))
    every = flat(msgspec.to_builtins(Settings(), enc_hook=secret_enc_hook))
    assert sorted(every.keys() - shown.keys()) == [], "settings missing from the README sample"
    assert sorted(shown.keys() - every.keys()) == [], "README sample names settings that do not exist"
    got = flat(msgspec.to_builtins(loaded, enc_hook=secret_enc_hook))
    differ = {k for k in every if got[k] != every[k]}
    assert differ == NOT_DEFAULT, sorted(differ)
