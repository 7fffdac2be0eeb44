"""The monitoring role's templates render into configurations the real tools accept: Prometheus
(`promtool check config`, with the rule file), Alertmanager (`amtool check-config`, Debian's
prometheus-alertmanager), the ConfigMaps against the Kubernetes 1.36 schemas (kubernetes-validate, strict);
the GPU health agent's job turns the Node objects into one target per GPU node; the role refuses a missing
receiver before anything changes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from monitoring_promql import ROLE, RULES
from monitoring_render import LOADED, SITE, render

K8S_VERSION = "1.36.0"
WEBHOOK = "https://alerts.example.org/hook"


def test_prometheus_config_is_accepted_with_its_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: apt-get install prometheus")
    config = yaml.safe_load(render("prometheus.yml.j2", monitoring_alert_webhook_url=WEBHOOK))
    assert config["rule_files"] == ["/etc/prometheus/rules/alert-rules.yml"]
    config["rule_files"] = [str(RULES)]  # where the ConfigMap mounts it in the pod, here
    assert [job["job_name"] for job in config["scrape_configs"]] == [
        "vllm",
        "llm-gateway",
        "dcgm-exporter",
        "gpu-health-agent",
        "control-plane-metrics",
    ]
    for job in config["scrape_configs"]:
        # Debian builds Prometheus without Kubernetes discovery (its client-go is not packaged): promtool here
        # refuses kubernetes_sd_configs. The pinned upstream image has it; everything else is checked as is.
        role = "node" if job["job_name"] in ("gpu-health-agent", "control-plane-metrics") else "pod"
        assert job.pop("kubernetes_sd_configs") == [{"role": role}]
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 20 rules found" in result.stdout


def relabel(labels: dict[str, str], configs: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus's relabelling for the actions the role uses (keep, replace), with its defaults: separator
    `;`, regex `(.*)` anchored at both ends, replacement `$1`; None when a keep drops the target."""
    labels = dict(labels)
    for config in configs:
        value = ";".join(labels.get(name, "") for name in config.get("source_labels", []))
        match = re.fullmatch(config.get("regex", "(.*)"), value)
        action = config.get("action", "replace")
        if action == "keep":
            if not match:
                return None
        elif action == "replace":
            if match:
                replacement = config.get("replacement", "$1")
                for number, group in enumerate((match.group(0), *match.groups())):
                    replacement = replacement.replace(f"${number}", group or "")
                labels[config["target_label"]] = replacement
        else:
            raise AssertionError(f"relabel action {action} not simulated")
    return labels


def node_target(name: str, address: str, labels: dict[str, str]) -> dict[str, str]:
    """What Prometheus's Kubernetes discovery (role node) gives a Node: the kubelet's address and the
    node's labels and addresses as meta labels (label names with every invalid character as `_`)."""
    meta = {
        "__address__": f"{address}:10250",
        "__meta_kubernetes_node_name": name,
        "__meta_kubernetes_node_address_InternalIP": address,
        "__meta_kubernetes_node_address_Hostname": name,
    }
    for key, value in labels.items():
        meta["__meta_kubernetes_node_label_" + re.sub(r"[^A-Za-z0-9_]", "_", key)] = value
        meta["__meta_kubernetes_node_labelpresent_" + re.sub(r"[^A-Za-z0-9_]", "_", key)] = "true"
    return meta


def test_the_gpu_health_agent_is_scraped_on_every_gpu_node_only() -> None:
    """The agent is a host service, not a pod: its targets come from the Node objects (discovery role node;
    Prometheus's ClusterRole reads nodes already), one per node with the GPU node label of
    nvidia_device_plugin, on the node's InternalIP at the agent's port, labelled with the node's name."""
    config = yaml.safe_load(render("prometheus.yml.j2", monitoring_alert_webhook_url=WEBHOOK))
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gpu-health-agent"]
    assert job["kubernetes_sd_configs"] == [{"role": "node"}]
    assert job.get("metrics_path", "/metrics") == "/metrics" and job.get("scheme", "http") == "http"
    gpu_label = LOADED["nvidia_device_plugin_node_label"]
    port = LOADED["gpu_health_agent_metrics_port"]
    nodes = [
        node_target("gpu-node-1", "10.89.42.11", {**gpu_label, "node-role.kubernetes.io/control-plane": ""}),
        node_target("gpu-node-2", "10.89.42.12", gpu_label),
        node_target("cpu-node-1", "10.89.42.21", {"kubernetes.io/os": "linux"}),
        node_target("gpu-node-3", "10.89.42.13", {key: "false" for key in gpu_label}),
    ]
    targets = [relabel(node, job["relabel_configs"]) for node in nodes]
    kept = [t for t in targets if t is not None]
    assert [(t["__address__"], t["node"]) for t in kept] == [
        (f"10.89.42.11:{port}", "gpu-node-1"),
        (f"10.89.42.12:{port}", "gpu-node-2"),
    ]
    # another port or label is followed, not copied
    other = yaml.safe_load(
        render(
            "prometheus.yml.j2",
            monitoring_alert_webhook_url=WEBHOOK,
            gpu_health_agent_metrics_port=9555,
            nvidia_device_plugin_node_label={"example.org/accelerator": "a100"},
        )
    )
    (job,) = [j for j in other["scrape_configs"] if j["job_name"] == "gpu-health-agent"]
    node = node_target("gpu-node-2", "10.89.42.12", {"example.org/accelerator": "a100"})
    assert relabel(node, job["relabel_configs"])["__address__"] == "10.89.42.12:9555"  # type: ignore[index]
    assert relabel(node_target("gpu-node-2", "10.89.42.12", gpu_label), job["relabel_configs"]) is None


def test_the_control_plane_metrics_are_scraped_on_the_control_plane_only() -> None:
    """Role control_plane_metrics's exporter is a host service on the control plane: its target is the
    Node kubeadm labels node-role.kubernetes.io/control-plane (with an empty value), on its InternalIP at the
    role's port, labelled with the node's name; the workers are not scraped there."""
    config = yaml.safe_load(render("prometheus.yml.j2", monitoring_alert_webhook_url=WEBHOOK))
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "control-plane-metrics"]
    assert job["kubernetes_sd_configs"] == [{"role": "node"}]
    port = LOADED["control_plane_metrics_port"]
    gpu_label = LOADED["nvidia_device_plugin_node_label"]
    nodes = [
        node_target("gpu-node-1", "10.89.42.11", {**gpu_label, "node-role.kubernetes.io/control-plane": ""}),
        node_target("gpu-node-2", "10.89.42.12", gpu_label),
        node_target("cpu-node-1", "10.89.42.21", {"node-role.kubernetes.io/worker": ""}),
    ]
    kept = [t for t in (relabel(node, job["relabel_configs"]) for node in nodes) if t is not None]
    assert [(t["__address__"], t["node"]) for t in kept] == [(f"10.89.42.11:{port}", "gpu-node-1")]
    other = yaml.safe_load(
        render("prometheus.yml.j2", monitoring_alert_webhook_url=WEBHOOK, control_plane_metrics_port=9555)
    )
    (job,) = [j for j in other["scrape_configs"] if j["job_name"] == "control-plane-metrics"]
    assert relabel(nodes[0], job["relabel_configs"])["__address__"] == "10.89.42.11:9555"  # type: ignore[index]


def test_alertmanager_config_is_accepted(tmp_path: Path) -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool missing: apt-get install prometheus-alertmanager")
    text = render("alertmanager.yml.j2", monitoring_alert_webhook_url=WEBHOOK)
    (tmp_path / "alertmanager.yml").write_text(text)
    result = subprocess.run(
        [amtool, "check-config", str(tmp_path / "alertmanager.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    receivers = yaml.safe_load(text)["receivers"]
    assert receivers == [{"name": "on-call", "webhook_configs": [{"url": WEBHOOK, "send_resolved": True}]}]


def test_configmaps_validate_and_carry_every_file() -> None:
    docs = list(yaml.safe_load_all(render("configmaps.yml.j2", monitoring_alert_webhook_url=WEBHOOK)))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert doc["metadata"]["namespace"] == "monitoring"
    data = {doc["metadata"]["name"]: doc["data"] for doc in docs}
    # the Alertmanager configuration holds the receiver URL: a Secret (test_monitoring_workloads.py)
    assert set(data) == {
        "prometheus-config",
        "grafana-provisioning",
        "grafana-dashboards",
        "dcgm-exporter-counters",
    }
    assert data["prometheus-config"]["alert-rules.yml"] == RULES.read_text().rstrip()
    assert set(data["grafana-dashboards"]) == {"overview.json", "vllm-instance.json", "gpu-health.json"}
    for board in data["grafana-dashboards"].values():
        json.loads(board)
    datasource = yaml.safe_load(data["grafana-provisioning"]["datasource.yml"])["datasources"][0]
    assert datasource["uid"] == "prometheus" and datasource["url"] == "http://prometheus.monitoring.svc:9090"
    assert "DCGM_FI_DEV_ROW_REMAP_PENDING" in data["dcgm-exporter-counters"]["counters.csv"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("monitoring_alert_webhook_url", ""),
        ("monitoring_alert_webhook_url", "alerts.example.org"),
        ("monitoring_namespace", "Monitoring"),
        ("monitoring_scrape_interval", "30"),
        ("monitoring_prometheus_image_digest", ""),
        ("monitoring_alertmanager_image_digest", "sha256:abc"),
        ("monitoring_grafana_image_digest", ""),
        ("monitoring_dcgm_exporter_image_digest", ""),
        ("monitoring_grafana_image", "docker.io/grafana/grafana@sha256:" + "ab" * 32),
        ("monitoring_prometheus_retention", "15"),
        ("monitoring_prometheus_storage_gib", 1),
        ("monitoring_prometheus_storage_class", "Fast SSD"),
        ("monitoring_prometheus_resources", {"requests": {"cpu": "1", "memory": "1Gi"}}),
        ("monitoring_grafana_datasource_uid", "a uid"),
        ("monitoring_grafana_admin_password", ""),
        ("monitoring_dcgm_exporter_manifest_sha256", "abc"),
        ("monitoring_serving_namespace", "Serving"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(variable: str, value: Any, tmp_path: Path) -> None:
    ansible = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "ansible-playbook"
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {**SITE, variable: value},
            "tasks": [{"ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "validate"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    root = ROLE.parents[1]
    result = subprocess.run(
        [str(ansible), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        env={"ANSIBLE_ROLES_PATH": str(root / "roles"), "PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"},
    )
    assert result.returncode != 0
    assert variable in result.stdout
    assert SITE["monitoring_grafana_admin_password"] not in result.stdout  # never printed


GOOD_RESOURCES = {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        (
            "monitoring_prometheus_resources",
            {**GOOD_RESOURCES, "requests": {"cpu": "500m", "memory": "2GB"}},
            "monitoring_prometheus_resources.requests.memory: '2GB' is not a quantity",
        ),
        (
            "monitoring_grafana_resources",
            {**GOOD_RESOURCES, "limits": {"cpu": "1 core", "memory": "4Gi"}},
            "monitoring_grafana_resources.limits.cpu: '1 core' is not a quantity",
        ),
        (
            "monitoring_alertmanager_resources",
            {**GOOD_RESOURCES, "limits": {"cpu": "100m", "memory": "4Gi"}},
            "monitoring_alertmanager_resources.requests.cpu: must be less than or equal to the cpu limit",
        ),
        ("monitoring_prometheus_storage_class", "a..b", "monitoring_prometheus_storage_class: 'a..b' is not"),
        ("monitoring_namespace", "Monitoring", "monitoring_namespace: 'Monitoring' is not a DNS-1123 label"),
    ],
    ids=["memory-2GB", "cpu-1-core", "requests-above-limits", "storage-class", "namespace"],
)
def test_values_the_api_server_refuses_are_refused_first(
    variable: str, value: Any, says: str, tmp_path: Path
) -> None:
    """As the API server checks them (plugins/filter/kubernetes_values.py), before anything changes."""
    ansible = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "ansible-playbook"
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {**SITE, variable: value},
            "tasks": [{"ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "validate"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    root = ROLE.parents[1]
    result = subprocess.run(
        [str(ansible), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        env={"ANSIBLE_ROLES_PATH": str(root / "roles"), "PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"},
    )
    assert result.returncode != 0
    assert says in " ".join(result.stdout.split()), result.stdout[-2000:]


def test_good_values_pass_validation(tmp_path: Path) -> None:
    ansible = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "ansible-playbook"
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": SITE,
            "tasks": [{"ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "validate"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    root = ROLE.parents[1]
    result = subprocess.run(
        [str(ansible), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        env={"ANSIBLE_ROLES_PATH": str(root / "roles"), "PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
