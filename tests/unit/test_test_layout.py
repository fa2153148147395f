"""The test tree's layout: no test module imports another test module.

Shared test scaffolding lives in ``tests/_support`` (and pytest fixtures in
``conftest.py``); anything else under ``tests/`` (a test module, a benchmark
script, a helper beside the tests) is imported by nobody.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _module_name(root: Path, path: Path) -> list[str]:
    """Return the dotted name of ``path`` as parts, ``root`` (the ``tests`` folder) being the top package."""
    return [root.name, *path.relative_to(root).with_suffix("").parts]


def _imported(root: Path, path: Path) -> list[tuple[int, str]]:
    """Return ``(line, module)`` for every module ``path`` imports (relative imports resolved).

    ``from package import name`` counts as importing ``package.name`` when
    ``name`` is a module or a package of the tree.
    """
    here = _module_name(root, path)
    if path.name == "__init__.py":
        here = [*here[:-1], "__init__"]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((node.lineno, module))
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                rel = Path(*sub.split(".")[1:])
                if (root / rel).with_suffix(".py").is_file() or (root / rel).is_dir():
                    out.append((node.lineno, sub))
    return sorted(out)


def _allowed(root: Path, module: str) -> bool:
    """Return True when importing ``module`` is fine for a file of the test tree."""
    parts = module.split(".")
    if parts[0] != root.name:
        return True  # the product, the standard library, third parties
    if len(parts) >= 2 and parts[1] == "_support":
        return True
    if parts[-1] == "conftest":
        return True
    # a package's own __init__ (``tests``, ``tests.fleet``) holds nothing to import
    return (root / Path(*parts[1:]) / "__init__.py").is_file() or len(parts) == 1


def imports_of_test_modules(root: Path) -> list[str]:
    """Return one line per import, anywhere under ``root``, of a test module by another module."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        for line, module in _imported(root, path):
            if not _allowed(root, module):
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {module}")
    return bad


def test_no_test_module_imports_another() -> None:
    bad = imports_of_test_modules(TESTS)
    assert not bad, "move what is shared to tests/_support:\n" + "\n".join(bad)


def test_the_check_finds_a_test_module_imported_by_another(tmp_path: Path) -> None:
    root = tmp_path / "tests"
    (root / "_support").mkdir(parents=True)
    (root / "fleet").mkdir()
    (root / "bench").mkdir()
    for init in (root, root / "_support", root / "fleet", root / "bench"):
        (init / "__init__.py").write_text("")
    (root / "_support" / "fleet.py").write_text("X = 1\n")
    (root / "fleet" / "conftest.py").write_text("from tests._support.fleet import X\n")
    (root / "fleet" / "_helpers.py").write_text("Y = 2\n")
    (root / "fleet" / "test_a.py").write_text("A = 3\n")
    (root / "fleet" / "test_b.py").write_text(
        "import os\n"
        "from shared.queue import Keys\n"
        "from tests._support.fleet import X\n"
        "from .conftest import X as Z\n"
        "from .test_a import A\n"  # line 5
        "from ._helpers import Y\n"  # line 6
        "def f():\n"
        "    import tests.fleet.test_a\n"  # line 8
        "from tests.fleet import test_a\n"  # line 9
        "from tests import fleet\n"
    )
    (root / "bench" / "soak.py").write_text(
        "from tests.fleet.test_a import A\nfrom tests._support import fleet\n"
    )
    assert imports_of_test_modules(root) == [
        "tests/bench/soak.py:1 imports tests.fleet.test_a",
        "tests/fleet/test_b.py:5 imports tests.fleet.test_a",
        "tests/fleet/test_b.py:6 imports tests.fleet._helpers",
        "tests/fleet/test_b.py:8 imports tests.fleet.test_a",
        "tests/fleet/test_b.py:9 imports tests.fleet.test_a",
    ]
