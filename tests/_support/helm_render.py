"""The Helm chart rendered by real Helm, offline, and its manifests validated against Kubernetes' schemas.

``helm`` is not installed here; ``helm-python-sdk`` (the test extra) ships Helm's own Go engine as a
shared library (``helm_python.Chart.render``: what ``helm template`` runs, the same template functions,
no cluster). ``kubernetes-validate`` ships the Kubernetes JSON schemas of each minor version.

``python -m tests._support.helm_render [DIR]`` (``make k8s-manifests``) writes the manifests of the
default values and of each preset to DIR (a new temporary folder when not given) and prints its path.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "docker" / "helm" / "commitfleet"
# Each preset file beside the chart's values.yaml (values-<name>.yaml).
PRESETS = tuple(sorted(p.name for p in CHART.glob("values-*.yaml")))
# The Kubernetes versions every manifest is validated against: the chart's oldest (Chart.yaml kubeVersion)
# and the newest kubernetes-validate ships.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
# Kinds that are not Kubernetes' own (no schema in kubernetes-validate): checked by the tests' own assertions.
CRD_KINDS = frozenset({"ServiceMonitor", "ScaledObject"})
RELEASE = "cf"
NAMESPACE = "data"

RenderError = helm_python.HelmRenderError


def merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``top`` merged in as Helm merges values files (maps deeply, else replaced)."""
    out = copy.deepcopy(dict(base))
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def preset(name: str) -> dict[str, Any]:
    """Return the values of the preset file ``name`` (``values-s3.yaml``...)."""
    loaded: dict[str, Any] = yaml.safe_load((CHART / name).read_text())
    return loaded


def default_value(*path: str) -> Any:
    """Return the chart's default value at ``path`` in values.yaml (``"worker", "drainGrace"``)."""
    value: Any = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in path:
        value = value[key]
    return value


def render_files(*presets: str, values: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Return {template path: rendered text} for the chart with these preset files then ``values`` on top.

    Raises:
        RenderError: a template failed (a ``fail`` or ``required`` of the chart: the message says which).
    """
    merged: dict[str, Any] = {}
    for name in presets:
        merged = merge(merged, preset(name))
    merged = merge(merged, values or {})
    chart = helm_python.Chart.load(CHART)
    rendered: dict[str, str] = chart.render(merged, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return rendered


def render(*presets: str, values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Return every Kubernetes object the chart renders (NOTES.txt left out), parsed.

    Raises:
        RenderError: a template failed.
    """
    docs: list[dict[str, Any]] = []
    for path, text in sorted(render_files(*presets, values=values).items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def validate(docs: Iterable[Mapping[str, Any]], versions: Iterable[str] = KUBE_VERSIONS) -> int:
    """Validate each object of Kubernetes' own kinds against each version's schema (strict: no unknown field).

    Returns:
        How many (object, version) validations ran.

    Raises:
        kubernetes_validate.ValidationError: an object does not fit its schema.
    """
    count = 0
    for version in versions:
        for doc in docs:
            if doc["kind"] in CRD_KINDS:
                continue
            kubernetes_validate.validate(dict(doc), version, strict=True)
            count += 1
    return count


def by_kind(docs: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    """Return the objects of ``kind``."""
    return [d for d in docs if d["kind"] == kind]


def one(docs: Iterable[Mapping[str, Any]], kind: str, component: str) -> Mapping[str, Any]:
    """Return the one object of ``kind`` whose component label is ``component``."""
    label = "app.kubernetes.io/component"
    found = [d for d in by_kind(docs, kind) if d["metadata"]["labels"][label] == component]
    assert len(found) == 1, (kind, component, len(found))
    return found[0]


def write_manifests(out: Path) -> list[Path]:
    """Write the manifests of the default values and of each preset (validated) to ``out``; return them."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("values.yaml", *PRESETS):
        presets = () if name == "values.yaml" else (name,)
        docs = render(*presets)
        validate(docs)
        target = out / (name.removeprefix("values-") if presets else "default.yaml")
        target.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        written.append(target)
    return written


def main(argv: list[str]) -> int:
    """Write the manifests (``make k8s-manifests``) and print the folder's path; 2 on a bad argument."""
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(
            "usage: python -m tests._support.helm_render [FOLDER]  (default: a new temporary folder)",
            file=sys.stderr,
        )
        return 0 if argv[0] in ("-h", "--help") else 2
    out = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="commitfleet-k8s-"))
    write_manifests(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
