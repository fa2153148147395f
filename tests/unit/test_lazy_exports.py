"""``shared._lazy.lazy_exports``: a package's public names, imported on first use (PEP 562)."""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import coordinator
import workers


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A throwaway package whose ``VALUE`` lives in ``._heavy`` and is exported lazily; yields its name."""
    name = f"lazy_pkg_{uuid.uuid4().hex}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text(
        "from shared._lazy import lazy_exports\n__getattr__ = lazy_exports(__name__, {'VALUE': '._heavy'})\n"
    )
    (root / "_heavy.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield name
    finally:
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]


def test_a_known_name_imports_its_module_on_first_use(package: str) -> None:
    pkg = importlib.import_module(package)
    assert f"{package}._heavy" not in sys.modules
    assert pkg.VALUE == 42
    assert f"{package}._heavy" in sys.modules
    assert importlib.import_module(f"{package}._heavy").VALUE is pkg.VALUE


def test_an_unknown_name_is_an_attribute_error_naming_the_package(package: str) -> None:
    pkg = importlib.import_module(package)
    with pytest.raises(AttributeError, match=rf"module '{package}' has no attribute 'nope'"):
        _ = pkg.nope
    assert not hasattr(pkg, "nope")
    assert f"{package}._heavy" not in sys.modules  # a miss imports nothing


def test_the_packages_use_it() -> None:
    with pytest.raises(AttributeError, match="module 'workers' has no attribute 'Nope'"):
        _ = workers.Nope
    with pytest.raises(AttributeError, match="module 'coordinator' has no attribute 'Nope'"):
        _ = coordinator.Nope
    assert workers.STATE_VERSION is importlib.import_module("workers._core").STATE_VERSION
    assert coordinator.fleet_summary is importlib.import_module("coordinator.admin._status").fleet_summary
