"""The monitoring role's workloads as rendered: every object validates against the Kubernetes 1.36 schemas
(kubernetes-validate, strict), and the policies hold over the rendered objects: images pinned by digest,
non-root (dcgm-exporter keeps upstream's root for the reasons checked here), resources set, probes on every
long-running container, Secret values never outside Secrets; Prometheus discovers pods with a ClusterRole
and reads the files the ConfigMaps carry where its configuration says; Grafana finds its provisioning;
dcgm-exporter runs only on GPU nodes with the role's counters; the network policy lets Prometheus reach the
serving namespace's vLLM and gateway pods, and the GPU health agents on the nodes' addresses. (The Secrets'
compare before apply: test_monitoring_secrets.py.)"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from monitoring_render import (
    LOADED,
    ROOT,
    SITE,
    all_objects,
    dcgm_exporter_objects,
    render,
    render_objects,
)

K8S_VERSION = "1.36.0"
DIGEST_RE = re.compile(r"^[^@\s]+:[^@:/\s]+@sha256:[0-9a-f]{64}$")


def by(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
    }


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return all_objects()


def test_every_object_validates_against_the_1_36_schemas(objects: list[dict[str, Any]]) -> None:
    kinds = sorted({o["kind"] for o in objects})
    assert kinds == [
        *("ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "NetworkPolicy"),
        *("Secret", "Service", "ServiceAccount"),
    ]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    for obj in render_objects("prometheus-workload.yml.j2", monitoring_prometheus_storage_class="fast-ssd"):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_a_misspelt_field_is_caught_by_strict_validation(objects: list[dict[str, Any]]) -> None:
    deployment = json.loads(json.dumps(by(objects, "Deployment", "prometheus")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_every_image_is_pinned_by_digest(objects: list[dict[str, Any]]) -> None:
    images = [c["image"] for spec in pod_specs(objects).values() for c in spec["containers"]]
    assert len(images) == 4
    for image in images:
        assert DIGEST_RE.match(image), image
    dcgm = pod_specs(objects)["dcgm-exporter"]["containers"][0]["image"]
    digest = SITE["monitoring_dcgm_exporter_image_digest"]
    assert dcgm == f"nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless@{digest}"


def test_prometheus_alertmanager_grafana_run_as_non_root(objects: list[dict[str, Any]]) -> None:
    specs = pod_specs(objects)
    for name in ("prometheus", "alertmanager", "grafana"):
        pod = specs[name]["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, name
        container = specs[name]["containers"][0]["securityContext"]
        assert container["allowPrivilegeEscalation"] is False and container["privileged"] is False, name
        assert container["capabilities"] == {"drop": ["ALL"]}, name
    assert specs["alertmanager"]["automountServiceAccountToken"] is False
    assert specs["grafana"]["automountServiceAccountToken"] is False


def test_dcgm_exporter_keeps_upstreams_root_only_for_what_needs_it(objects: list[dict[str, Any]]) -> None:
    """Upstream runs it as root with SYS_ADMIN: root for the kubelet's pod-resources socket (GPU -> pod
    labels), SYS_ADMIN for the profiling (DCGM_FI_PROF_*) counters, which the role's counters file keeps."""
    container = pod_specs(objects)["dcgm-exporter"]["containers"][0]
    assert container["securityContext"]["capabilities"] == {"add": ["SYS_ADMIN"], "drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    counters = by(objects, "ConfigMap", "dcgm-exporter-counters")["data"]["counters.csv"]
    assert any(line.startswith("DCGM_FI_PROF_") for line in counters.splitlines())
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/var/lib/kubelet/pod-resources"}


def test_every_container_has_resources_and_probes_where_it_serves(objects: list[dict[str, Any]]) -> None:
    for name, spec in pod_specs(objects).items():
        for container in spec["containers"]:
            resources = container["resources"]
            for side in ("requests", "limits"):
                assert set(resources[side]) == {"cpu", "memory"}, (name, side)
            if name != "dcgm-exporter":  # upstream's DaemonSet has no probes; Prometheus's `up` watches it
                assert {"readinessProbe", "livenessProbe"} <= set(container), name


def test_secret_values_never_outside_secrets(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        text = json.dumps(obj)
        if obj["kind"] == "Secret":
            continue
        assert "s3cr3t-t0ken" not in text and "alerts.example.org" not in text, obj["metadata"]["name"]
        assert SITE["monitoring_grafana_admin_password"] not in text, obj["metadata"]["name"]
    # the values are in the Secrets, where the pods read them
    alertmanager = by(objects, "Secret", "alertmanager-config")["data"]["alertmanager.yml"]
    config = yaml.safe_load(base64.b64decode(alertmanager))
    assert config["receivers"][0]["webhook_configs"][0]["url"] == SITE["monitoring_alert_webhook_url"]
    grafana = by(objects, "Secret", "grafana-admin")["data"]
    assert base64.b64decode(grafana["admin-password"]).decode() == SITE["monitoring_grafana_admin_password"]


def test_prometheus_discovers_pods_and_reads_the_configmaps_files(objects: list[dict[str, Any]]) -> None:
    role = by(objects, "ClusterRole", "llm-serving-prometheus")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods", "endpoints", "services", "nodes"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = by(objects, "ClusterRoleBinding", "llm-serving-prometheus")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
    ]
    spec = pod_specs(objects)["prometheus"]
    assert spec["serviceAccountName"] == "prometheus" and spec["automountServiceAccountToken"] is True
    container = spec["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    config_file = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--config.file="))
    assert config_file == mounts["config"] + "/" + volumes["config"]["configMap"]["items"][0]["path"]
    prometheus_yml = yaml.safe_load(by(objects, "ConfigMap", "prometheus-config")["data"]["prometheus.yml"])
    assert prometheus_yml["rule_files"] == [
        mounts["rules"] + "/" + volumes["rules"]["configMap"]["items"][0]["path"]
    ]
    assert "--storage.tsdb.retention.time=15d" in container["args"]
    assert "--storage.tsdb.retention.size=40GB" in container["args"]
    assert volumes["data"] == {"name": "data", "emptyDir": {"sizeLimit": "50Gi"}}


def test_prometheus_on_a_claim_when_a_storage_class_is_named() -> None:
    objs = render_objects("prometheus-workload.yml.j2", monitoring_prometheus_storage_class="fast-ssd")
    claim = by(objs, "PersistentVolumeClaim", "prometheus-data")
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    volumes = pod_specs(objs)["prometheus"]["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "prometheus-data"}} in volumes


def test_a_config_change_rolls_prometheus() -> None:
    def checksum(**overrides: Any) -> str:
        deployment = by(render_objects("prometheus-workload.yml.j2", **overrides), "Deployment", "prometheus")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum() == checksum()
    assert checksum() != checksum(monitoring_scrape_interval="15s")


def test_grafana_finds_its_datasource_dashboards_and_password(objects: list[dict[str, Any]]) -> None:
    spec = pod_specs(objects)["grafana"]
    container = spec["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    provisioning = {v["name"]: v for v in spec["volumes"]}["provisioning"]["configMap"]
    assert env["GF_PATHS_PROVISIONING"]["value"] == mounts["provisioning"]
    assert {i["path"] for i in provisioning["items"]} == {
        "datasources/datasource.yml",
        "dashboards/dashboards.yml",
    }
    data = by(objects, "ConfigMap", "grafana-provisioning")["data"]
    providers = yaml.safe_load(data["dashboards.yml"])["providers"]
    assert [p["options"]["path"] for p in providers] == [mounts["dashboards"]]
    assert yaml.safe_load(data["datasource.yml"])["datasources"][0]["uid"] == "prometheus"
    other = render_objects("configmaps.yml.j2", monitoring_grafana_datasource_uid="prom-main")
    assert (
        yaml.safe_load(by(other, "ConfigMap", "grafana-provisioning")["data"]["datasource.yml"])[
            "datasources"
        ][0]["uid"]
        == "prom-main"
    )
    keys = set(by(objects, "Secret", "grafana-admin")["data"])
    refs = [
        env[n]["valueFrom"]["secretKeyRef"] for n in ("GF_SECURITY_ADMIN_USER", "GF_SECURITY_ADMIN_PASSWORD")
    ]
    assert all(r["name"] == "grafana-admin" and r["key"] in keys for r in refs)


def test_alertmanager_reads_its_config_from_the_secret(objects: list[dict[str, Any]]) -> None:
    spec = pod_specs(objects)["alertmanager"]
    container = spec["containers"][0]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["config"] == {"name": "config", "secret": {"secretName": "alertmanager-config"}}
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "config")
    assert f"--config.file={mount}/alertmanager.yml" in container["args"]
    prometheus_yml = yaml.safe_load(by(objects, "ConfigMap", "prometheus-config")["data"]["prometheus.yml"])
    service = by(objects, "Service", "alertmanager")
    target = f"{service['metadata']['name']}.monitoring.svc:{service['spec']['ports'][0]['port']}"
    assert prometheus_yml["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [target]


def test_dcgm_exporter_on_gpu_nodes_only_with_the_roles_counters(objects: list[dict[str, Any]]) -> None:
    plugin = yaml.safe_load((ROOT / "roles" / "nvidia_device_plugin" / "defaults" / "main.yml").read_text())
    daemonset = by(objects, "DaemonSet", "dcgm-exporter")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == plugin["nvidia_device_plugin_node_label"]
    assert spec["runtimeClassName"] == plugin["nvidia_device_plugin_runtime_class"]
    # still on a GPU node tainted for GPU work or a control plane that keeps its taint
    tolerated = {(t["key"], t["effect"]) for t in spec["tolerations"] if t["operator"] == "Exists"}
    assert tolerated == {
        ("nvidia.com/gpu", "NoSchedule"),
        ("node-role.kubernetes.io/control-plane", "NoSchedule"),
    }
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "counters")
    volume = next(v for v in spec["volumes"] if v["name"] == "counters")
    assert volume["configMap"]["name"] == "dcgm-exporter-counters"
    assert env["DCGM_EXPORTER_COLLECTORS"] == mount["mountPath"] + "/counters.csv"
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9400"
    assert all(o["metadata"]["namespace"] == "monitoring" for o in dcgm_exporter_objects())


def test_network_policy_lets_prometheus_scrape_the_serving_pods(objects: list[dict[str, Any]]) -> None:
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "NetworkPolicy"}
    assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    peers = [peer for rule in policies["prometheus"]["egress"] for peer in rule.get("to", [])]
    serving = [
        p
        for p in peers
        if p.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
        == "serving"
    ]
    assert serving == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "serving"}},
            "podSelector": {
                "matchExpressions": [
                    {"key": "app.kubernetes.io/name", "operator": "In", "values": ["vllm", "llm-gateway"]}
                ]
            },
        }
    ]
    names = {
        p["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
        for n, p in policies.items()
        if n != "default-deny"
    }
    pods = {
        o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet")
    }
    assert names == pods  # every workload has its own allowances on top of the default deny
    # the label the serving namespace's policy admits (docs/CONTRACTS.md, "Serving stage")
    labels = by(objects, "Deployment", "prometheus")["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "prometheus"


@pytest.mark.parametrize(
    ("url", "port"), [("https://a.example.org/x", 443), ("http://bridge.ops:8080/h", 8080)]
)
def test_alertmanager_may_reach_the_receivers_port_only(url: str, port: int) -> None:
    objs = render_objects("network-policy.yml.j2", monitoring_alert_webhook_url=url)
    egress = by(objs, "NetworkPolicy", "alertmanager")["spec"]["egress"]
    assert egress[0] == {"ports": [{"protocol": "TCP", "port": port}]}


def test_prometheus_may_reach_the_api_servers_port() -> None:
    for port in (6443, 8443):
        objs = render_objects("network-policy.yml.j2", __monitoring_api_server_port=str(port))
        egress = by(objs, "NetworkPolicy", "prometheus")["spec"]["egress"]
        assert {"ports": [{"protocol": "TCP", "port": port}]} in egress


def test_prometheus_may_reach_the_gpu_health_agents_on_the_nodes_addresses_only() -> None:
    """The agent runs on the host: pod and namespace selectors never match it, and the default deny drops
    Prometheus's egress to a node's address. One rule lets it reach the nodes' InternalIPs (read from the
    Node objects, where its discovery finds the agents) on the agent's port and nothing else there."""
    port = LOADED["gpu_health_agent_metrics_port"]
    objs = render_objects("network-policy.yml.j2", __monitoring_node_addresses=["10.89.42.11", "fd00::12"])
    egress = by(objs, "NetworkPolicy", "prometheus")["spec"]["egress"]
    agent = [rule for rule in egress if {"protocol": "TCP", "port": port} in rule.get("ports", [])]
    assert agent == [
        {
            "to": [{"ipBlock": {"cidr": "10.89.42.11/32"}}, {"ipBlock": {"cidr": "fd00::12/128"}}],
            "ports": [{"protocol": "TCP", "port": port}],
        }
    ]
    # no address read (no node yet): no rule, never an empty `to`, which would allow every destination
    objs = render_objects("network-policy.yml.j2", __monitoring_node_addresses=[])
    egress = by(objs, "NetworkPolicy", "prometheus")["spec"]["egress"]
    assert all(rule.get("to", None) != [] for rule in egress)
    assert not [rule for rule in egress if {"protocol": "TCP", "port": port} in rule.get("ports", [])]


def test_prometheus_may_reach_the_control_plane_metrics_on_the_control_planes_address_only() -> None:
    """Role control_plane_metrics's exporter is a host service too: one rule for the control-plane Nodes'
    InternalIPs (read from the Node objects with kubeadm's control-plane label) on its port, nothing else."""
    port = LOADED["control_plane_metrics_port"]
    objs = render_objects("network-policy.yml.j2", __monitoring_control_plane_addresses=["10.89.42.11"])
    egress = by(objs, "NetworkPolicy", "prometheus")["spec"]["egress"]
    rules = [rule for rule in egress if {"protocol": "TCP", "port": port} in rule.get("ports", [])]
    assert rules == [
        {"to": [{"ipBlock": {"cidr": "10.89.42.11/32"}}], "ports": [{"protocol": "TCP", "port": port}]}
    ]
    objs = render_objects("network-policy.yml.j2", __monitoring_control_plane_addresses=[])
    egress = by(objs, "NetworkPolicy", "prometheus")["spec"]["egress"]
    assert all(rule.get("to", None) != [] for rule in egress)
    assert not [rule for rule in egress if {"protocol": "TCP", "port": port} in rule.get("ports", [])]


def test_the_templates_use_the_roles_variables_only() -> None:
    """StrictUndefined rendering with the defaults alone (no site values) still renders: nothing undefined."""
    for template in ("prometheus-workload.yml.j2", "grafana-workload.yml.j2", "network-policy.yml.j2"):
        assert render(
            template,
            monitoring_alert_webhook_url="https://a.example.org/x",
            __monitoring_api_server_port=6443,
            __monitoring_node_addresses=["10.89.42.11"],
            __monitoring_control_plane_addresses=["10.89.42.11"],
        )


def test_the_tests_renderer_matches_ansibles(tmp_path: Path) -> None:
    """The objects above are what Ansible itself renders from the role (a copy of it with one extra task that
    writes each template's lookup to a file), so the policies hold for what the role applies."""
    templates = [
        "configmaps.yml.j2",
        "secrets.yml.j2",
        "prometheus-workload.yml.j2",
        "alertmanager-workload.yml.j2",
        "grafana-workload.yml.j2",
        "network-policy.yml.j2",
    ]
    role = tmp_path / "roles" / "monitoring"
    shutil.copytree(ROOT / "roles" / "monitoring", role)
    task = {
        "name": "Render",
        "ansible.builtin.copy": {
            "dest": f"{tmp_path}/{{{{ item }}}}.out",
            "content": "{{ lookup('ansible.builtin.template', item) }}",
            "mode": "0644",
        },
        "loop": templates,
    }
    (role / "tasks" / "render.yml").write_text(yaml.safe_dump([task]))
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {**LOADED, **SITE},
            "tasks": [{"ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "render"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local", "play.yml"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={
            "ANSIBLE_ROLES_PATH": str(tmp_path / "roles"),
            "PATH": "/usr/bin:/bin",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for template in templates:
        rendered = [d for d in yaml.safe_load_all((tmp_path / f"{template}.out").read_text()) if d]
        assert rendered == render_objects(template), template
