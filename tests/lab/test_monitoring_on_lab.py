"""The monitoring objects of the serving stage on the lab's cluster, as the API holds them.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_monitoring_on_lab.py -v

Reads what playbooks/serving.yml applied (it converges the stage first only when Prometheus is not there,
e.g. when this file runs before test_serving_on_lab.py): the Deployments run their pinned images, the
dcgm-exporter DaemonSet has a pod on every GPU node and nowhere else, built from the manifest whose sha256 the
role pins, the receiver URL and Grafana's password are in Secrets and in no ConfigMap, Prometheus has its
discovery RBAC and the namespace its network policies, Prometheus's configuration the GPU health agent's job
and its policy a path to every node's InternalIP on the agent's port. That Prometheus scrapes every target it
discovers, through those policies, is test_real_kubernetes_on_lab.py's (the pods run under the real kubelet).
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
import yaml
from labrun import ROOT, on_node, pinned_image, playbook, running_nodes

pytestmark = pytest.mark.lab

LAB_VARS = yaml.safe_load((ROOT / "inventories/lab/group_vars/k8s_cluster.yml").read_text())


DEFAULTS = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
PLUGIN = yaml.safe_load((ROOT / "roles/nvidia_device_plugin/defaults/main.yml").read_text())
AGENT = yaml.safe_load((ROOT / "roles/gpu_health_agent/defaults/main.yml").read_text())
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
NAMESPACE = DEFAULTS["monitoring_namespace"]


def kubectl_json(args: str) -> dict[str, Any]:
    result = on_node("gpu-node-1", f"{KUBECTL} {args} -o json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def converged() -> None:
    if "gpu-node-1" not in running_nodes():
        pytest.skip("the lab is not running (make lab-up)")
    if on_node("gpu-node-1", "test -s /etc/kubernetes/admin.conf").returncode != 0:
        pytest.fail("no cluster on gpu-node-1: converge the Kubernetes stage first (make lab)")
    if on_node("gpu-node-1", f"{KUBECTL} -n {NAMESPACE} get deployment prometheus").returncode != 0:
        run = playbook("playbooks/serving.yml", timeout=900)
        assert run.rc == 0, f"serving.yml failed (rc {run.rc}):\n{run.tail()}"


def test_deployments_run_their_pinned_images(converged: None) -> None:
    for name in ("prometheus", "alertmanager", "grafana"):
        deployment = kubectl_json(f"-n {NAMESPACE} get deployment {name}")
        image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        wanted = DEFAULTS[f"monitoring_{name}_image"]
        assert image == pinned_image(wanted)
        assert deployment["status"].get("readyReplicas") == 1, (name, deployment["status"])


def test_dcgm_exporter_on_every_gpu_node_and_only_there(converged: None) -> None:
    selector = ",".join(f"{k}={v}" for k, v in PLUGIN["nvidia_device_plugin_node_label"].items())
    gpu_nodes = {n["metadata"]["name"] for n in kubectl_json(f"get nodes -l {selector}")["items"]}
    assert gpu_nodes, "no node carries the GPU label"
    pods = kubectl_json(f"-n {NAMESPACE} get pods -l app.kubernetes.io/name=dcgm-exporter")["items"]
    assert sorted(p["spec"].get("nodeName") for p in pods) == sorted(gpu_nodes)
    daemonset = kubectl_json(f"-n {NAMESPACE} get daemonset dcgm-exporter")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    wanted = f"nvcr.io/nvidia/k8s/dcgm-exporter:{DEFAULTS['monitoring_dcgm_exporter_version']}-distroless"
    assert container["image"] == pinned_image(wanted)
    version = DEFAULTS["monitoring_dcgm_exporter_version"]
    path = f"{DEFAULTS['monitoring_dcgm_exporter_manifest_dir']}/dcgm-exporter-{version}.yaml"
    manifest = on_node("gpu-node-1", f"sha256sum {path}")
    assert manifest.stdout.split()[:1] == [DEFAULTS["monitoring_dcgm_exporter_manifest_sha256"]], manifest


def test_secret_values_only_in_secrets(converged: None) -> None:
    url = LAB_VARS["monitoring_alert_webhook_url"]
    password = LAB_VARS["monitoring_grafana_admin_password"]
    secret = kubectl_json(f"-n {NAMESPACE} get secret alertmanager-config")
    config = yaml.safe_load(base64.b64decode(secret["data"]["alertmanager.yml"]))
    assert config["receivers"][0]["webhook_configs"][0]["url"] == url
    admin = kubectl_json(f"-n {NAMESPACE} get secret grafana-admin")
    assert base64.b64decode(admin["data"]["admin-password"]).decode() == password
    configmaps = json.dumps(kubectl_json(f"-n {NAMESPACE} get configmaps"))
    assert url not in configmaps and password not in configmaps
    # the checksum annotation is of the whole configuration file, not of the URL or the password alone
    annotations = json.dumps(kubectl_json(f"-n {NAMESPACE} get pods")["items"])
    for value in (url, password):
        assert hashlib.sha256(value.encode()).hexdigest() not in annotations


def test_prometheus_rbac_and_the_network_policies(converged: None) -> None:
    role = kubectl_json("get clusterrole llm-serving-prometheus")
    assert role["rules"][0]["verbs"] == ["get", "list", "watch"]
    binding = kubectl_json("get clusterrolebinding llm-serving-prometheus")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "prometheus", "namespace": NAMESPACE}]
    policies = {p["metadata"]["name"] for p in kubectl_json(f"-n {NAMESPACE} get networkpolicies")["items"]}
    assert policies == {"default-deny", "prometheus", "alertmanager", "grafana", "dcgm-exporter"}


def test_prometheus_scrapes_the_gpu_health_agents_and_may_reach_them(converged: None) -> None:
    config = kubectl_json(f"-n {NAMESPACE} get configmap prometheus-config")["data"]["prometheus.yml"]
    (job,) = [j for j in yaml.safe_load(config)["scrape_configs"] if j["job_name"] == "gpu-health-agent"]
    assert job["kubernetes_sd_configs"] == [{"role": "node"}]
    port = AGENT["gpu_health_agent_metrics_port"]
    nodes = kubectl_json("get nodes")["items"]
    addresses = sorted(
        a["address"] for n in nodes for a in n["status"]["addresses"] if a["type"] == "InternalIP"
    )
    assert addresses, "the nodes report no InternalIP"
    policy = kubectl_json(f"-n {NAMESPACE} get networkpolicy prometheus")
    (rule,) = [r for r in policy["spec"]["egress"] if {"protocol": "TCP", "port": port} in r.get("ports", [])]
    assert sorted(peer["ipBlock"]["cidr"] for peer in rule["to"]) == [f"{a}/32" for a in addresses]
    # what Prometheus will find there: the agent answers on each GPU node's address
    for node in nodes:
        address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        metrics = on_node(
            node["metadata"]["name"],
            f"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://{address}:{port}/metrics',"
            ' timeout=5).read().decode())"',
        )
        if all(
            node["metadata"].get("labels", {}).get(k) == v
            for k, v in PLUGIN["nvidia_device_plugin_node_label"].items()
        ):
            assert "gpu_health_agent_polls_total" in metrics.stdout, (
                node["metadata"]["name"],
                metrics.stderr,
            )
