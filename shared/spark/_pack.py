"""``commitfleet pack``: the zip a Spark cluster imports commitfleet from (``spark-submit --py-files``).

The driver and the executors import only the ``shared`` package (``shared.spark``
for the job, ``shared.load_settings`` for the settings), so the archive holds
``shared/`` and nothing else: its sources, ``py.typed`` and the generated JSON
Schema files, without caches. Entries are sorted and dated 1980-01-01, so the
same sources always give the same bytes (a cluster can cache it by hash).

Next to it goes ``requirements-spark.txt``: the third-party packages the
executors' Python needs, commitfleet's ``spark`` extra (pyarrow, redis,
msgspec, the store SDKs) without pyspark (the cluster provides it), read from
``pyproject.toml`` in a source checkout or from the installed distribution's
metadata.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError

_EPOCH = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc", ".pyo")
_DIST = "commitfleet"


@dataclass(frozen=True)
class Pack:
    """What :func:`build_pack` wrote."""

    archive: Path
    requirements: Path
    files: int
    sha256: str


def package_root() -> Path:
    """Return the folder of the ``shared`` package this process imports."""
    return Path(__file__).resolve().parent.parent


def pack_members(root: Path) -> list[tuple[str, Path]]:
    """Return ``(name in the archive, file)`` for every file of package folder ``root``, sorted.

    Names are ``<package>/<relative path>`` with ``/`` separators; caches and
    compiled files are left out.
    """
    out: list[tuple[str, Path]] = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if not path.is_file() or _SKIP_DIRS.intersection(rel.parts) or path.suffix in _SKIP_SUFFIXES:
            continue
        out.append((f"{root.name}/{rel.as_posix()}", path))
    return sorted(out)


def _executor_side(requirements: list[str]) -> list[str]:
    # An executor runs inside the cluster's Spark: it has pyspark (the cluster's own
    # version, which a pip install must not replace).
    return [r for r in requirements if re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() != "pyspark"]


def spark_requirements(src: Path | None = None) -> list[str]:
    """Return what an executor needs: commitfleet's ``spark`` extra without pyspark.

    Read from ``pyproject.toml`` next to the package folder ``src`` when it is
    a source checkout, else from the installed distribution's metadata.

    Raises:
        ConfigError: neither has a ``spark`` extra.
    """
    pyproject = (src or package_root()).parent / "pyproject.toml"
    if pyproject.is_file():
        doc = tomllib.loads(pyproject.read_text())
        extra = doc.get("project", {}).get("optional-dependencies", {}).get("spark")
        if extra:
            return _executor_side([str(r) for r in extra])
    try:
        requires = importlib.metadata.requires(_DIST) or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    out = []
    for req in requires:
        spec, _, marker = req.partition(";")
        if re.search(r"""extra\s*==\s*["']spark["']""", marker):
            out.append(spec.strip())
    if not out:
        raise ConfigError(f"no 'spark' extra found in {pyproject} or in the installed {_DIST}")
    return _executor_side(out)


def build_pack(out_dir: Path, *, root: Path | None = None) -> Pack:
    """Write ``commitfleet-<version>-shared.zip`` and ``requirements-spark.txt`` into ``out_dir``.

    Returns:
        The paths written, the number of files archived and the archive's SHA-256.

    Raises:
        ConfigError: no ``spark`` extra found, or the package folder holds no
            ``__init__.py``.
        OSError: ``out_dir`` cannot be written.
    """
    src = root or package_root()
    if not (src / "__init__.py").is_file():
        raise ConfigError(f"{src} is not a package folder")
    requirements = spark_requirements(src)
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / f"{_DIST}-{_version()}-{src.name}.zip"
    members = pack_members(src)
    tmp = archive.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, path in members:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    tmp.replace(archive)
    req_path = out_dir / "requirements-spark.txt"
    req_path.write_text("\n".join(requirements) + "\n")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    return Pack(archive=archive, requirements=req_path, files=len(members), sha256=digest)


def _version() -> str:
    try:
        return importlib.metadata.version(_DIST)
    except importlib.metadata.PackageNotFoundError:
        return "0"


__all__ = ["Pack", "build_pack", "pack_members", "package_root", "spark_requirements"]
