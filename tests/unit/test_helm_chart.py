"""The Helm chart (docker/helm/commitfleet), rendered by real Helm offline and validated without a cluster.

What the manifests must say, checked against the code they run: the probes hit the worker's health port
and paths as the worker's settings read them, the grace period covers the drain, the autoscaler stays
within the shard count, no credential is ever written into a manifest, the pods run as non-root on a
read-only root file system, the admin API stays inside the cluster. Every rendered object of Kubernetes'
own kinds is validated (strictly: no unknown field) against the schemas of two Kubernetes versions.
"""

from __future__ import annotations

import base64
import json
import math
import re
import tomllib
from collections.abc import Mapping
from typing import Any

import helm_python
import pytest
import yaml

from coordinator.admin._http import OPEN_PATHS
from coordinator.admin._metrics import FleetMetrics
from shared.settings import Settings, WorkerSettings, load_settings
from tests._support import helm_render as h

# worker.http_port / worker.http_host come with issue 30 items 1-2 (another branch). Until they are in
# the settings, the checks that read them from a worker's environment are skipped; everything else runs.
HEALTH_SETTINGS = "http_port" in WorkerSettings.__struct_fields__
HEALTH_VARS = ("COMMITFLEET_WORKER_HTTP_PORT", "COMMITFLEET_WORKER_HTTP_HOST")
# What a secretKeyRef stands for when the settings are read back (16+ printable characters).
SECRET_STAND_IN = "stand-in-secret-0123456789"

EVERYTHING_ON: dict[str, Any] = {
    "autoscaling": {"keda": {"enabled": True}},
    "serviceMonitor": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
}


def container(docs: list[dict[str, Any]], component: str) -> Mapping[str, Any]:
    deploy = h.one(docs, "Deployment", component)
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def settings_of(c: Mapping[str, Any]) -> Settings:
    """Read the container's environment back through the settings loader (secrets as stand-ins)."""
    env: dict[str, str] = {}
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e["valueFrom"]:
            env[e["name"]] = SECRET_STAND_IN
    if not HEALTH_SETTINGS:
        for var in HEALTH_VARS:
            env.pop(var, None)
    return load_settings(env=env)


def test_chart_passes_helm_lint() -> None:
    result = helm_python.lint(h.CHART)
    assert result["errors"] == [], result
    assert [m for m in result["messages"] if m["severity"] > 1] == [], result


@pytest.mark.parametrize("preset", [None, *h.PRESETS])
def test_every_preset_renders_valid_manifests_for_two_kubernetes_versions(preset: str | None) -> None:
    docs = h.render(*([preset] if preset else []), values=EVERYTHING_ON)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["Deployment"] * 2
        + ["PodDisruptionBudget"] * 2
        + ["Service"] * 2
        + ["ServiceMonitor"] * 2
        + ["ConfigMap", "ScaledObject", "ServiceAccount"]
    )
    assert h.validate(docs) == 8 * len(h.KUBE_VERSIONS)  # all but the 3 CRD objects
    # Every process of every preset reads its environment into valid settings (each variable is a setting).
    for component in ("coordinator", "worker"):
        s = settings_of(container(docs, component))
        assert s.fleet.shards == 64 and s.store.url.startswith(("s3://", "gs://", "az://"))


def test_validation_catches_an_unknown_field_and_a_wrong_type() -> None:
    import kubernetes_validate

    docs = h.render()
    worker = h.one(docs, "Deployment", "worker")
    bad = json.loads(json.dumps(worker))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        h.validate([bad])
    bad = json.loads(json.dumps(worker))
    bad["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45s"
    with pytest.raises(kubernetes_validate.ValidationError):
        h.validate([bad])


@pytest.mark.skipif(not HEALTH_SETTINGS, reason="worker.http_port arrives with issue 30 items 1-2")
def test_worker_probes_use_the_port_and_paths_the_worker_serves() -> None:
    docs = h.render(values={"worker": {"httpPort": 9123}})
    c = container(docs, "worker")
    s = settings_of(c)
    assert s.worker.http_port == 9123
    assert s.worker.http_host == "0.0.0.0"  # the kubelet probes the pod's IP, not its loopback
    (port,) = c["ports"]
    assert port["containerPort"] == s.worker.http_port
    paths = {kind: c[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert {k: v["path"] for k, v in paths.items()} == {
        "startupProbe": "/startupz",
        "livenessProbe": "/livez",
        "readinessProbe": "/readyz",
    }
    assert {v["port"] for v in paths.values()} == {port["name"]}


def test_worker_probe_paths_and_port_without_the_health_settings() -> None:
    """The part of the check above that needs no new setting: the env, the port and the probes agree."""
    docs = h.render(values={"worker": {"httpPort": 9123}})
    c = container(docs, "worker")
    env = env_of(c)
    assert env["COMMITFLEET_WORKER_HTTP_PORT"] == "9123" and env["COMMITFLEET_WORKER_HTTP_HOST"] == "0.0.0.0"
    (port,) = c["ports"]
    assert port["containerPort"] == 9123
    probes = (("startupProbe", "/startupz"), ("livenessProbe", "/livez"), ("readinessProbe", "/readyz"))
    for kind, path in probes:
        assert c[kind]["httpGet"] == {"path": path, "port": port["name"]}
        # Each probe answers within its timeout; liveness restarts only after several misses.
        assert 1 <= c[kind]["timeoutSeconds"] < c[kind]["periodSeconds"]
    assert c["livenessProbe"]["failureThreshold"] >= 3
    # Startup covers a worker waiting for Redis: minutes, not seconds, before the kubelet restarts it.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


@pytest.mark.parametrize(("drain", "margin"), [(None, None), (47.5, 20), (1, 1)])
def test_grace_period_covers_the_workers_drain(drain: float | None, margin: int | None) -> None:
    values: dict[str, Any] = {"worker": {}}
    if drain is not None:
        values["worker"] = {"drainGrace": drain, "terminationMargin": margin}
    docs = h.render(values=values)
    s = settings_of(container(docs, "worker"))
    grace = h.one(docs, "Deployment", "worker")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    expected_margin = margin if margin is not None else h.default_value("worker", "terminationMargin")
    assert s.worker.drain_grace == (drain if drain is not None else WorkerSettings().drain_grace)
    assert grace == math.ceil(s.worker.drain_grace) + expected_margin
    assert grace > s.worker.drain_grace


def test_coordinators_two_with_probes_on_the_open_health_path() -> None:
    docs = h.render()
    deploy = h.one(docs, "Deployment", "coordinator")
    assert deploy["spec"]["replicas"] == 2
    c = container(docs, "coordinator")
    s = settings_of(c)
    (port,) = c["ports"]
    assert port["containerPort"] == s.coordinator.http_port
    assert s.coordinator.http_host == "0.0.0.0" and s.coordinator.admin_token.reveal() == SECRET_STAND_IN
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        # A probe sends neither the token nor an allowed Host: only an open path answers it.
        assert c[kind]["httpGet"]["path"] in OPEN_PATHS
    token = env_of(c)["COMMITFLEET_COORDINATOR_ADMIN_TOKEN"]["secretKeyRef"]
    assert token["key"] == "admin-token" and token["optional"] is False
    # Prometheus scrapes the pod's IP; the API answers it and the Service's names, nothing else.
    hosts = s.coordinator.allowed_hosts.split(",")
    assert hosts[0] == "$(POD_IP)" and "cf-commitfleet-coordinator.data.svc" in hosts
    names = [e["name"] for e in c["env"]]
    assert names.index("POD_IP") < names.index("COMMITFLEET_COORDINATOR_ALLOWED_HOSTS")  # $(VAR) needs order


def test_admin_service_is_cluster_ip_only() -> None:
    for preset in (None, *h.PRESETS):
        docs = h.render(*([preset] if preset else []), values=EVERYTHING_ON)
        for svc in h.by_kind(docs, "Service"):
            assert svc["spec"]["type"] == "ClusterIP", svc["metadata"]["name"]
            assert "externalIPs" not in svc["spec"]
    admin = h.one(h.render(), "Service", "coordinator")
    assert [p["port"] for p in admin["spec"]["ports"]] == [8787]


def test_pods_run_non_root_on_a_read_only_root_file_system() -> None:
    docs = h.render("values-gcs.yaml", values={"store": {"gcs": {"credentialsFromSecret": True}}})
    for component in ("coordinator", "worker"):
        spec = h.one(docs, "Deployment", component)["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        (c,) = spec["containers"]
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]
        creds = env_of(c)["GOOGLE_APPLICATION_CREDENTIALS"]
        assert creds.startswith(next(p for p, n in mounts.items() if n == "gcs-credentials"))


def test_no_secret_value_appears_outside_the_secret() -> None:
    secrets = {
        "adminToken": "ADMIN-tok3n-distinctive-1a2b3c",
        "hmacSecret": "HMAC-s3cret-distinctive-4d5e6f",
        "redisPassword": "REDIS-p4ss-distinctive-7a8b9c",
        "awsAccessKeyId": "AKIADISTINCTIVE0001",
        "awsSecretAccessKey": "AWS-s3cret-distinctive-0d1e2f",
        "azureConnectionString": "DefaultEndpointsProtocol=https;AccountKey=AZ-distinctive-3a4b",
        "azureAccountUrl": "https://acct.blob.core.windows.net/?sv=2024&sig=AZ-sas-distinctive",
        "azureStorageKey": "AZ-key-distinctive-5c6d7e",
        "gcsCredentialsJson": '{"private_key": "GCS-key-distinctive-8f9a"}',
    }
    forms = {v: base64.b64encode(v.encode()).decode() for v in secrets.values()}
    for preset in (None, *h.PRESETS):
        files = h.render_files(
            *([preset] if preset else []),
            values={**EVERYTHING_ON, "secrets": {"create": True, "values": secrets}},
        )
        in_secret = 0
        for path, text in files.items():
            for doc in yaml.safe_load_all(text) if not path.endswith("NOTES.txt") else [None]:
                shown = yaml.safe_dump(doc) if doc else text
                for value, encoded in forms.items():
                    if doc and doc["kind"] == "Secret":
                        assert value not in shown  # data is base64: never the plain value either
                        in_secret += encoded in shown
                    else:
                        assert value not in shown and encoded not in shown, (preset, path, value)
        assert in_secret == len(secrets)  # the check above looked at the real values
    # With a Secret of your own (the default), no value of it is anywhere.
    files = h.render_files(values=EVERYTHING_ON)
    assert not any(k == "Secret" for d in h.render(values=EVERYTHING_ON) for k in [d["kind"]])
    assert all(SECRET_STAND_IN not in t for t in files.values())


def test_every_credential_is_read_from_the_secret() -> None:
    """A credential setting is never given a plain value: each comes through a secretKeyRef."""
    credentials = {
        "COMMITFLEET_COORDINATOR_ADMIN_TOKEN",
        "COMMITFLEET_SECURITY_HMAC_SECRET",
        "COMMITFLEET_REDIS_PASSWORD",
        "REDIS_PASSWORD",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "COMMITFLEET_STORE_AZURE_CONNECTION_STRING",
        "AZURE_STORAGE_KEY",
    }
    seen = set()
    key_auth = {"store": {"azure": {"accountUrl": "https://acct.blob.core.windows.net"}}}
    for preset, values in [(None, {}), *((p, {}) for p in h.PRESETS), ("values-azure.yaml", key_auth)]:
        docs = h.render(*([preset] if preset else []), values=values)
        for component in ("coordinator", "worker"):
            for e in container(docs, component)["env"]:
                if e["name"] in credentials:
                    assert set(e) == {"name", "valueFrom"} and "secretKeyRef" in e["valueFrom"], e
                    seen.add(e["name"])
    assert seen == credentials - {"REDIS_PASSWORD"}
    azure = container(h.render("values-azure.yaml"), "worker")
    url = env_of(azure)["COMMITFLEET_STORE_AZURE_ACCOUNT_URL"]  # it may carry a SAS token
    assert url["secretKeyRef"]["key"] == "azure-account-url"


def test_redis_url_with_a_password_is_refused() -> None:
    with pytest.raises(h.RenderError, match=r"redis\.url holds a password"):
        h.render(values={"redis": {"url": "redis://app:hunter2hunter2@redis:6379/0"}})
    # A user name alone (ACL user, password in the Secret) is fine.
    docs = h.render(values={"redis": {"url": "redis://app@redis:6379/0"}})
    assert settings_of(container(docs, "worker")).redis.url == "redis://app@redis:6379/0"


def test_presets_give_each_redis_topology_and_store() -> None:
    urls = {}
    for preset in h.PRESETS:
        s = settings_of(container(h.render(preset), "worker"))
        urls[preset] = (s.redis.url, s.store.url, s.redis.durable.level)
    assert urls["values-sentinel.yaml"][0].startswith("redis+sentinel://")
    assert urls["values-sentinel.yaml"][2] == "replicas"
    assert urls["values-cluster.yaml"][0].startswith("redis+cluster://")
    assert urls["values-cluster.yaml"][2] == "replicas"
    assert urls["values-s3.yaml"][1].startswith("s3://")
    assert urls["values-gcs.yaml"][1].startswith("gs://")
    assert urls["values-azure.yaml"][1].startswith("az://")
    assert settings_of(container(h.render(), "worker")).redis.url.startswith("redis://")


def test_settings_map_becomes_real_settings_and_refuses_what_the_chart_sets() -> None:
    docs = h.render(values={"settings": {"lock": {"validity": 36}, "worker": {"read_batch": 250}}})
    s = settings_of(container(docs, "worker"))
    assert s.lock.validity == 36 and s.worker.read_batch == 250
    for section, key in (("worker", "drain_grace"), ("redis", "url"), ("security", "hmac_secret")):
        with pytest.raises(h.RenderError, match=f"settings.{section}.{key} is set by the chart"):
            h.render(values={"settings": {section: {key: "1"}}})


def test_scaler_stays_within_the_shard_count() -> None:
    docs = h.render(values={"autoscaling": {"keda": {"enabled": True, "maxReplicaCount": 64}}})
    so = h.one(docs, "ScaledObject", "worker")
    spec = so["spec"]
    assert spec["maxReplicaCount"] == 64 == settings_of(container(docs, "worker")).fleet.shards
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert spec["scaleTargetRef"]["name"] == h.one(docs, "Deployment", "worker")["metadata"]["name"]
    assert "replicas" not in h.one(docs, "Deployment", "worker")["spec"]  # KEDA's HPA owns it
    with pytest.raises(h.RenderError, match=r"maxReplicaCount \(65\) is above fleet.shards \(64\)"):
        h.render(values={"autoscaling": {"keda": {"enabled": True, "maxReplicaCount": 65}}})
    keda = {"enabled": True, "maxReplicaCount": 9}
    with pytest.raises(h.RenderError, match=r"maxReplicaCount \(9\) is above fleet.shards \(8\)"):
        h.render(values={"fleet": {"shards": 8}, "autoscaling": {"keda": keda}})
    with pytest.raises(h.RenderError, match="minReplicaCount must be at least 1"):
        h.render(values={"autoscaling": {"keda": {"enabled": True, "minReplicaCount": 0}}})
    with pytest.raises(h.RenderError, match=r"worker.replicas \(9\) is above fleet.shards \(8\)"):
        h.render(values={"fleet": {"shards": 8}, "worker": {"replicas": 9}})


def test_scale_down_waits_out_a_drain_and_removes_one_worker_at_a_time() -> None:
    docs = h.render(values={"autoscaling": {"keda": {"enabled": True}}})
    grace = h.one(docs, "Deployment", "worker")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    advanced = h.one(docs, "ScaledObject", "worker")["spec"]["advanced"]
    behavior = advanced["horizontalPodAutoscalerConfig"]["behavior"]
    down = behavior["scaleDown"]
    assert 2 * grace <= down["stabilizationWindowSeconds"] <= 3600  # the HPA refuses more than an hour
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 120}]
    assert down["policies"][0]["periodSeconds"] >= grace
    with pytest.raises(h.RenderError, match="scaleDownStabilizationSeconds must be at least twice"):
        h.render(values={"autoscaling": {"keda": {"enabled": True, "scaleDownStabilizationSeconds": 60}}})


def test_scaler_queries_the_backlog_metrics_the_coordinator_exposes() -> None:
    docs = h.render(values={"fleet": {"name": "orders"}, "autoscaling": {"keda": {"enabled": True}}})
    (trigger,) = h.one(docs, "ScaledObject", "worker")["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    status = {
        "fleet": "orders",
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
    exposed = FleetMetrics().render(status).decode()
    used = re.findall(r"(commitfleet_[a-z_]+)\{fleet=\"orders\"\}", query)
    assert used == ["commitfleet_lag_entries", "commitfleet_pending_entries"]
    for name in used:
        assert re.search(rf"^{name}\{{fleet=\"orders\"\}} ", exposed, re.M), name
    # Both coordinators report the same fleet-wide value: max, never sum.
    assert query.count("max(") == 2 and "sum(" not in query


def test_workers_roll_and_are_evicted_one_at_a_time() -> None:
    docs = h.render()
    strategy = h.one(docs, "Deployment", "worker")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    for component in ("worker", "coordinator"):
        pdb = h.one(docs, "PodDisruptionBudget", component)
        assert pdb["spec"]["maxUnavailable"] == 1
        selected = pdb["spec"]["selector"]["matchLabels"]
        pod_labels = h.one(docs, "Deployment", component)["spec"]["template"]["metadata"]["labels"]
        assert selected.items() <= pod_labels.items()


def test_dashboard_configmap_is_the_dashboard_file() -> None:
    docs = h.render(values={"grafanaDashboard": {"enabled": True}})
    cm = h.one(docs, "ConfigMap", "dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    source = (h.CHART / "files" / "grafana" / "commitfleet.json").read_text()
    assert cm["data"]["commitfleet.json"] == source.rstrip("\n")
    assert json.loads(cm["data"]["commitfleet.json"])["uid"] == "commitfleet"


def test_service_monitor_reads_the_token_from_the_secret() -> None:
    docs = h.render(values={"serviceMonitor": {"enabled": True}, "secrets": {"existingSecret": "mine"}})
    (endpoint,) = h.one(docs, "ServiceMonitor", "coordinator")["spec"]["endpoints"]
    credentials = {"name": "mine", "key": "admin-token"}
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": credentials}
    svc = h.one(docs, "Service", "coordinator")
    assert endpoint["port"] in [p["name"] for p in svc["spec"]["ports"]]
    selector = h.one(docs, "ServiceMonitor", "coordinator")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= svc["metadata"]["labels"].items()
    worker_svc = h.one(docs, "Service", "worker")
    assert worker_svc["spec"]["clusterIP"] == "None"
    (wep,) = h.one(docs, "ServiceMonitor", "worker")["spec"]["endpoints"]
    assert wep["port"] in [p["name"] for p in worker_svc["spec"]["ports"]] and wep["path"] == "/metrics"


def test_secret_choice_is_required() -> None:
    with pytest.raises(h.RenderError, match="name a Secret"):
        h.render(values={"secrets": {"existingSecret": ""}})
    with pytest.raises(h.RenderError, match="adminToken is required"):
        h.render(values={"secrets": {"create": True}})
    with pytest.raises(h.RenderError, match="at least 16 characters"):
        h.render(values={"secrets": {"create": True, "values": {"adminToken": "short"}}})


def test_manifests_folder_holds_the_default_and_each_preset(tmp_path: Any) -> None:
    written = h.write_manifests(tmp_path)
    assert sorted(p.name for p in written) == sorted(
        ["default.yaml", *(p.removeprefix("values-") for p in h.PRESETS)]
    )
    for path in written:
        docs = list(yaml.safe_load_all(path.read_text()))
        assert {d["kind"] for d in docs} >= {"Deployment", "Service", "PodDisruptionBudget"}


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((h.CHART / "Chart.yaml").read_text())
    project = tomllib.loads((h.ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    for component in ("coordinator", "worker"):
        assert container(h.render(), component)["image"] == f"commitfleet:{project['version']}"
