"""deploy/kubernetes: `kubectl kustomize` renders it, the Kubernetes schemas accept it (offline), and it gives
boundwatch what it needs on a GPU node (host PIDs, /proc, cgroups, NVML, the agent socket shared with engines)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.promql import ROOT, gen_alerts

K8S = ROOT / "deploy" / "kubernetes"
KUBECTL = shutil.which("kubectl")
PROMTOOL = shutil.which("promtool")
CRD_DIR = os.environ.get("BOUNDWATCH_CRD_DIR")  # prometheus-operator's CRD YAMLs, for the monitoring kinds


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """Render the kustomization with kubectl (skipped without kubectl)."""
    if KUBECTL is None:
        pytest.skip("kubectl not installed")
    result = subprocess.run(
        [KUBECTL, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def _kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def test_generated_manifests_are_current() -> None:
    """Keep prometheusrule.yaml and dashboards.yaml what tools/gen_kubernetes.py writes from alerts/ and dashboards/."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_kubernetes.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_kustomize_renders_every_kind(rendered: list[dict[str, Any]]) -> None:
    """Render the DaemonSet, Service, ServiceAccount, ServiceMonitor, PrometheusRule and one ConfigMap per dashboard."""
    kinds = sorted(d["kind"] for d in rendered)
    dashboards = sorted((ROOT / "dashboards").glob("*.json"))
    assert kinds == sorted(
        ["DaemonSet", "Service", "ServiceAccount", "ServiceMonitor", "PrometheusRule"]
        + ["ConfigMap"] * len(dashboards)
    )
    assert {d["metadata"]["namespace"] for d in rendered} == {"monitoring"}
    maps = [d for d in rendered if d["kind"] == "ConfigMap"]
    assert sorted(name for m in maps for name in m["data"]) == [p.name for p in dashboards]
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)


def test_daemonset_gets_what_boundwatch_needs_on_a_gpu_node(rendered: list[dict[str, Any]]) -> None:
    """hostPID, the host's /proc and cgroups read-only, /run/boundwatch shared, NVML without taking a GPU, no CPU limit."""
    spec = _kind(rendered, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}

    def host_path(mount: str) -> str:
        return str(volumes[mounts[mount]["name"]]["hostPath"]["path"])

    assert (
        host_path(env["BOUNDWATCH_HOST__PROC_ROOT"]) == "/proc"
        and mounts[env["BOUNDWATCH_HOST__PROC_ROOT"]]["readOnly"]
    )
    cgroup = env["BOUNDWATCH_HOST__CGROUP_ROOT"]
    assert host_path(cgroup) == "/sys/fs/cgroup" and mounts[cgroup]["readOnly"]
    # The agents in engine pods find the socket with no setting: it is the default path (exporter.wire).
    assert env["BOUNDWATCH_AGENT__SOCKET"] == "/run/boundwatch/agent.sock"
    assert host_path("/run/boundwatch") == "/run/boundwatch" and not mounts["/run/boundwatch"].get("readOnly")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
    resources = container["resources"]
    assert "nvidia.com/gpu" not in {**resources.get("requests", {}), **resources.get("limits", {})}
    assert "cpu" not in resources.get("limits", {})  # a quota would throttle the sidecar's ticks
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"]


def test_service_monitor_scrapes_the_job_the_rules_select(rendered: list[dict[str, Any]]) -> None:
    """Give the scraped series job="boundwatch" (the rules' default selector) and the node name as instance."""
    monitor = _kind(rendered, "ServiceMonitor")["spec"]
    service = _kind(rendered, "Service")
    job = service["metadata"]["labels"][monitor["jobLabel"]]
    assert f'job="{job}"' == gen_alerts().PARAMS["selector"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "instance",
        "action": "replace",
    } in endpoint["relabelings"]


@pytest.mark.prometheus
@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
def test_prometheus_rule_groups_pass_promtool(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """Load the PrometheusRule's groups with `promtool check rules`: the operator hands them to Prometheus as is."""
    groups = _kind(rendered, "PrometheusRule")["spec"]["groups"]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert groups == yaml.safe_load((ROOT / "alerts" / "boundwatch.rules.yml").read_text())["groups"]


def test_core_kinds_validate_against_the_kubernetes_schemas(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Validate every built-in kind strictly with kubernetes-validate's bundled schemas (offline)."""
    kv = pytest.importorskip("kubernetes_validate")
    version = kv.latest_version() if hasattr(kv, "latest_version") else "1.30.0"
    checked = 0
    for doc in rendered:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        kv.validate(doc, version, strict=True)
        checked += 1
    assert checked == len(rendered) - 2


@pytest.mark.skipif(not CRD_DIR, reason="BOUNDWATCH_CRD_DIR (prometheus-operator CRD YAMLs) not set")
def test_monitoring_kinds_validate_against_the_prometheus_operator_crds(
    rendered: list[dict[str, Any]],
) -> None:
    """Validate the ServiceMonitor and PrometheusRule against the CRDs' openAPIV3Schema (offline, jsonschema)."""
    jsonschema = pytest.importorskip("jsonschema")
    schemas = {}
    for path in Path(str(CRD_DIR)).glob("*.yaml"):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd and crd.get("kind") == "CustomResourceDefinition":
                for version in crd["spec"]["versions"]:
                    key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                    schemas[key] = version["schema"]["openAPIV3Schema"]
    for kind in ("ServiceMonitor", "PrometheusRule"):
        doc = _kind(rendered, kind)
        schema = schemas[(doc["apiVersion"], kind)]
        # Not the metaschema check: the CRDs use Go regex syntax ((?i) mid-pattern) Python's re rejects.
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=str)
        assert not errors, [f"{kind}: {e.json_path}: {e.message}" for e in errors]
