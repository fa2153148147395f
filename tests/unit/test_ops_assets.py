"""The operator's files agree with the code: metric names (README, dashboard), compose, package data."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from coordinator.admin._metrics import FleetMetrics
from coordinator.admin._ui import ASSETS
from workers._core import Limits
from workers._health import HealthMonitor, WorkerStats
from workers._health_metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
# The dashboard's one copy: inside the Helm chart (its ConfigMap reads it), mounted by compose.
DASHBOARD = DOCKER / "helm/commitfleet/files/grafana/commitfleet.json"
STATUS: dict[str, Any] = {
    "fleet": "f",
    "counters": {},
    "shard_table": [{"shard": 0, "lag": 1, "pending": 0, "dead_letters": 0}],
    "workers": [],
    # The summary of GET /status (coordinator.admin.fleet_summary): counts, never lists of open work.
    "totals": dict.fromkeys(
        ("open_jobs", "datasets", "waiting", "queued", "running", "blocked", "quarantined"), 0
    ),
    "quarantined": [],
    "assignment_epoch": 1,
}


def exposed() -> dict[str, str]:
    """Return {metric name as queried: type} of what /metrics exposes."""
    out = {}
    for fam in text_string_to_metric_families(FleetMetrics().render(STATUS).decode()):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        out[name] = fam.type
    return out


def worker_exposed() -> dict[str, str]:
    """Return {metric name: type} of the commitfleet metrics a worker's /metrics exposes."""
    limits = Limits(lease=15.0, heartbeat=3.0, max_loop_lag=5.0, redis_timeout=10.0)
    text = WorkerMetrics("w1", HealthMonitor(limits), WorkerStats).render().decode()
    return {f.name: f.type for f in text_string_to_metric_families(text) if f.name.startswith("commitfleet_")}


def test_readme_documents_exactly_the_exposed_metrics() -> None:
    readme = (ROOT / "README.md").read_text()
    table = dict(re.findall(r"^\| `(commitfleet_[a-z_]+)` \| (counter|gauge|histogram) \|", readme, re.M))
    coordinator = {k: v for k, v in table.items() if not k.startswith("commitfleet_worker_")}
    assert coordinator == exposed()
    worker = {k: v for k, v in table.items() if k.startswith("commitfleet_worker_")}
    assert worker == worker_exposed()
    assert not any(k.startswith("commitfleet_worker_") for k in exposed())


def test_dashboard_queries_only_exposed_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    names = exposed()
    used: set[str] = set()
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            for name in re.findall(r"commitfleet_[a-z_]+", target["expr"]):
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                assert base in names, (panel["title"], name)
                used.add(base)
    # Every metric has a panel but these two (the rejections panel shows them per reason code).
    assert set(names) - used == {"commitfleet_pending_entries", "commitfleet_rejected_total"}


def test_grafana_provisioning_points_at_the_dashboard() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    grafana = compose["services"]["grafana"]
    mounts = dict(v.removesuffix(":ro").split(":", 1) for v in grafana["volumes"])
    dashboards = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/commitfleet.yaml").read_text())
    path = dashboards["providers"][0]["options"]["path"]
    assert mounts["./helm/commitfleet/files/grafana"] == path
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    ds = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    uid = ds["datasources"][0]["uid"]
    dash = json.loads(DASHBOARD.read_text())
    assert {p["datasource"]["uid"] for p in dash["panels"]} == {uid}
    prom = yaml.safe_load((DOCKER / "prometheus/prometheus.yml").read_text())
    assert prom["scrape_configs"][0]["static_configs"][0]["targets"] == ["coordinator:8787"]
    assert prom["scrape_configs"][0]["authorization"]["credentials_file"]


def test_compose_never_exposes_the_api_without_a_token() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    for name, svc in compose["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)  # loopback of the host only
    coord = compose["services"]["coordinator"]
    assert "0.0.0.0" in coord["command"]  # listens on the container network, so:
    env = coord["environment"]
    assert env["COMMITFLEET_COORDINATOR_ADMIN_TOKEN"].startswith("${COMMITFLEET_ADMIN_TOKEN:?")
    assert "coordinator" in env["COMMITFLEET_COORDINATOR_ALLOWED_HOSTS"].split(",")


def test_console_assets_ship_in_the_package() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"ui_static/*"' in pyproject
    static = resources.files("coordinator.admin") / "ui_static"
    for name in (*ASSETS, "index.html", "login.html"):
        assert (static / name).is_file(), name
    # No CDN: every script, style and icon the pages name is served by the console itself.
    for page in ("index.html", "login.html"):
        html = (static / page).read_text()
        for ref in re.findall(r'(?:src|href)="([^"]+)"', html):
            assert ref.startswith("/ui/"), (page, ref)
