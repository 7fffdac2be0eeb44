"""Every Kubernetes object the cluster roles apply, and the kubeadm configuration they render, offline.

- The kubeadm configuration (roles/kubeadm_control_plane/templates/kubeadm-config.yaml.j2), rendered with
  Ansible's templating and the roles' defaults, passes `kubeadm config validate` of the real kubeadm of the
  production pin (real_kube.py; kubeadm's kinds are not in kubernetes-validate) and holds IPVS mode,
  the pod subnet, the systemd cgroup driver and the audit policy flags and mounts.
- The objects applied to the API (the RuntimeClass, Calico's and the device plugin's upstream manifests
  (tests/lab/upstream_manifests.py: ../shared/upstream/ or the pinned URLs) with exactly the roles' changes,
  by the roles' own filter plugins) validate against the Kubernetes 1.36 OpenAPI schemas with
  kubernetes-validate in strict mode, and the real API server of the production pin accepts them with
  strict field validation (a server-side dry run).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import real_kube
import yaml
from manifests_render import (
    NODE,
    api_objects,
    calico_objects,
    device_plugin_objects,
    filter_module,
    render,
    role_vars,
    runtime_class,
)

K8S_VERSION = "1.36.0"  # kubernetes-validate's schemas of the minor in roles/kubernetes (1.36.x)


@pytest.mark.parametrize(
    ("source", "obj"),
    api_objects(),
    ids=[f"{source}:{obj['kind']}/{obj['metadata']['name']}" for source, obj in api_objects()],
)
def test_object_validates_against_the_1_36_schemas_strictly(source: str, obj: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{source}: {obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}")


def test_strict_validation_catches_a_typo_the_roles_could_make() -> None:
    """The check above can fail: a misspelt field in the device plugin's pod spec is refused."""
    daemonset = next(doc for doc in device_plugin_objects() if doc["kind"] == "DaemonSet")
    broken = json.loads(json.dumps(daemonset))
    broken["spec"]["template"]["spec"]["runtimeClass"] = broken["spec"]["template"]["spec"].pop(
        "runtimeClassName"
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_the_api_server_accepts_every_object_strictly(kube_control_plane: real_kube.ControlPlane) -> None:
    """The real API server of the production pin (real_kube.py) takes every object the roles apply, with
    strict field validation and its admission (a server-side dry run), and refuses the typo above by name."""
    objects = [obj for _, obj in api_objects()]
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    applied = kube_control_plane.kubectl(
        "apply", "--validate=strict", "--dry-run=server", "-f", "-", stdin=listed
    )
    assert applied.returncode == 0, applied.stderr
    names = {line.split(" ", 1)[0].split("/", 1)[1] for line in applied.stdout.splitlines()}
    assert names == {obj["metadata"]["name"] for obj in objects}, applied.stdout
    daemonset = next(doc for doc in device_plugin_objects() if doc["kind"] == "DaemonSet")
    broken = json.loads(json.dumps(daemonset))
    broken["spec"]["template"]["spec"]["runtimeClass"] = broken["spec"]["template"]["spec"].pop(
        "runtimeClassName"
    )
    refused = kube_control_plane.kubectl(
        "apply", "--validate=strict", "--dry-run=server", "-f", "-", stdin=json.dumps(broken)
    )
    assert refused.returncode != 0
    assert 'unknown field "spec.template.spec.runtimeClass"' in refused.stderr, refused.stderr


def test_calico_pool_is_the_pod_subnet() -> None:
    pod_subnet = role_vars("kubeadm_control_plane")["kubeadm_control_plane_pod_subnet"]
    daemonset = next(doc for doc in calico_objects() if doc["kind"] == "DaemonSet")
    container = next(
        c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "calico-node"
    )
    pools = [e["value"] for e in container["env"] if e["name"] == "CALICO_IPV4POOL_CIDR"]
    assert pools == [pod_subnet] == ["10.244.0.0/16"]
    assert filter_module("calico", "calico_manifest").calico_pool_cidr(daemonset) == pod_subnet


def test_calico_node_takes_the_kubelets_node_ip() -> None:
    """calico-node's address is the Node's InternalIP (the kubelet's --node-ip, i.e. node_ip), not the first
    address of the first interface (upstream's default, first-found: an InfiniBand port or a second NIC)."""
    daemonset = next(doc for doc in calico_objects() if doc["kind"] == "DaemonSet")
    container = next(
        c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "calico-node"
    )
    methods = [e["value"] for e in container["env"] if e["name"] == "IP_AUTODETECTION_METHOD"]
    assert methods == ["kubernetes-internal-ip"]
    assert [e["value"] for e in container["env"] if e["name"] == "IP"] == ["autodetect"]


def test_device_plugin_runs_in_runtime_class_nvidia_on_gpu_nodes_only() -> None:
    daemonset = next(doc for doc in device_plugin_objects() if doc["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert (
        pod["runtimeClassName"]
        == runtime_class()["metadata"]["name"]
        == runtime_class()["handler"]
        == "nvidia"
    )
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def kubeadm_config(tmp_path: Path, extra: dict[str, Any] | None = None) -> tuple[Path, dict[str, Any]]:
    text = render("kubeadm_control_plane", "kubeadm-config.yaml.j2", extra)
    path = tmp_path / "kubeadm-config.yaml"
    path.write_text(text)
    return path, {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}


def kubeadm_validate(path: Path) -> subprocess.CompletedProcess[str]:
    return real_kube.kubeadm("config", "validate", "--config", str(path))


def test_kubeadm_config_passes_kubeadm_config_validate(tmp_path: Path) -> None:
    path, docs = kubeadm_config(tmp_path)
    result = kubeadm_validate(path)
    assert result.returncode == 0, result.stderr
    assert set(docs) == {
        "InitConfiguration",
        "ClusterConfiguration",
        "KubeletConfiguration",
        "KubeProxyConfiguration",
    }
    assert all(doc["apiVersion"] != "kubeadm.k8s.io/v1beta3" for doc in docs.values())


def test_kubeadm_config_content(tmp_path: Path) -> None:
    _, docs = kubeadm_config(tmp_path)
    init, cluster = docs["InitConfiguration"], docs["ClusterConfiguration"]
    assert init["localAPIEndpoint"]["advertiseAddress"] == NODE["node_ip"]
    assert init["nodeRegistration"] == {
        "name": "gpu-node-1",
        "criSocket": "unix:///run/containerd/containerd.sock",
        # the kubelet's InternalIP (and so Calico's address, below) is node_ip, not the default route's
        "kubeletExtraArgs": [{"name": "node-ip", "value": NODE["node_ip"]}],
    }
    assert cluster["kubernetesVersion"] == "v" + role_vars("kubernetes")["kubernetes_version"]
    assert cluster["networking"] == {"podSubnet": "10.244.0.0/16", "serviceSubnet": "10.96.0.0/12"}
    assert docs["KubeletConfiguration"]["cgroupDriver"] == "systemd"
    assert docs["KubeProxyConfiguration"]["mode"] == "ipvs"
    assert docs["KubeProxyConfiguration"]["ipvs"] == {"scheduler": "rr", "strictARP": True}
    args = {arg["name"]: arg["value"] for arg in cluster["apiServer"]["extraArgs"]}
    assert args["audit-policy-file"] == "/etc/kubernetes/audit/policy.yaml"
    assert {"audit-log-path", "audit-log-maxage", "audit-log-maxbackup", "audit-log-maxsize"} <= set(args)
    mounts = {volume["mountPath"] for volume in cluster["apiServer"]["extraVolumes"]}
    assert {"/etc/kubernetes/audit", "/var/log/kubernetes/audit"} <= mounts


def test_kubeadm_config_validate_refuses_a_wrong_type(tmp_path: Path) -> None:
    """The decoder check can fail: a string where kubeadm wants an int32."""
    path, _ = kubeadm_config(tmp_path, {"kubeadm_control_plane_api_port": '"six"'})
    result = kubeadm_validate(path)
    assert result.returncode != 0 and "bindPort" in result.stderr, result.stderr


def test_crictl_uses_the_cri_socket_kubeadm_registers(tmp_path: Path) -> None:
    # one home (kubernetes_cri_socket): crictl on the nodes talks to the socket the kubelet is given
    _, docs = kubeadm_config(tmp_path)
    crictl = yaml.safe_load(render("containerd", "crictl.yaml.j2"))
    socket = docs["InitConfiguration"]["nodeRegistration"]["criSocket"]
    assert (
        socket == role_vars("kubernetes")["kubernetes_cri_socket"] == "unix:///run/containerd/containerd.sock"
    )
    assert crictl == {"runtime-endpoint": socket, "image-endpoint": socket, "timeout": 10}


def test_audit_policy_records_the_on_call_questions() -> None:
    policy = yaml.safe_load(render("kubeadm_control_plane", "audit-policy.yaml.j2"))
    assert policy["apiVersion"] == "audit.k8s.io/v1" and policy["kind"] == "Policy"

    def level(group: str, resource: str, verb: str = "patch", user_groups: tuple[str, ...] = ()) -> str:
        for rule in policy["rules"]:
            if "verbs" in rule and verb not in rule["verbs"]:
                continue
            if "userGroups" in rule and not set(rule["userGroups"]) & set(user_groups):
                continue
            if "resources" in rule and not any(
                r["group"] == group and resource in r["resources"] for r in rule["resources"]
            ):
                continue
            return str(rule["level"])
        return "None"

    assert level("", "secrets") == "Metadata"  # never the content
    assert level("", "configmaps", "update") == "Metadata"
    assert level("apps", "deployments") == "Request"  # the image, i.e. the model version
    assert level("apps", "statefulsets", "update") == "Request"
    assert level("", "nodes") == "Request"  # cordon: a patch of spec.unschedulable
    assert level("", "pods/eviction", "create") == "Metadata"  # drain
    assert level("", "nodes", "patch", ("system:nodes",)) == "None"  # the kubelets' own heartbeats
    assert level("apps", "deployments", "get") == "None"
    assert level("", "pods", "create") == "None"
