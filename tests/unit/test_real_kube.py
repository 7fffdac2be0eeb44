"""The unit tests' control plane (real_kube.py) is the real one of the production pin, with the flags kubeadm
gives it: what the lab's API stand-in used to accept, it refuses."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import real_kube


def test_the_api_server_is_the_production_pin(kube_control_plane: real_kube.ControlPlane) -> None:
    version = kube_control_plane.admin.ok("GET", "/version")
    assert version["gitVersion"] == real_kube.kubernetes_version()
    shown = subprocess.run(
        ["go", "version", "-m", str(real_kube.binary("kube-apiserver"))], capture_output=True, text=True
    )
    assert f"k8s.io/kubernetes\t{real_kube.kubernetes_version()}" in shown.stdout


def test_kubeadm_flags_rbac_and_admission(kube_control_plane: real_kube.ControlPlane) -> None:
    flags = (kube_control_plane.dir / "manifests" / "kube-apiserver.yaml").read_text()
    assert "--authorization-mode=Node,RBAC" in flags and "--enable-admission-plugins=NodeRestriction" in flags
    # a token nobody issued is refused; a client certificate of a user without bindings is forbidden
    assert kube_control_plane.client("not-a-token").raw("GET", "/api/v1/nodes")[0] == 401


def test_strict_field_validation_refuses_an_unknown_field(kube_control_plane: real_kube.ControlPlane) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "surprise": 1}
    code, status = kube_control_plane.admin.request(
        "POST", "/api/v1/namespaces/default/configmaps?fieldValidation=Strict", config_map
    )
    assert code == 400 and 'unknown field "surprise"' in status["message"], status


def test_nothing_is_left_once_stopped(tmp_path: Path) -> None:
    with real_kube.control_plane(tmp_path / "plane") as plane:
        processes = list(plane.processes.values())
        assert plane.admin.raw("GET", "/readyz")[0] == 200
    assert all(process.poll() is not None for process in processes)
    assert not (tmp_path / "plane").exists()


def test_registered_nodes_take_a_daemonsets_pods_and_kubelets_report_them(
    kube_controllers: real_kube.ControlPlane,
) -> None:
    """A Node registered through the API is Ready and untainted (the node lifecycle controller's part); the
    real DaemonSet controller makes a pod for it, Kubelets binds it there and reports it Running and Ready,
    and finishes its graceful deletion once the node leaves the DaemonSet's selector."""
    admin = kube_controllers.admin
    node = kube_controllers.register_node("unit-kubelets-node", {"example.org/kubelets": "yes"}, "10.89.0.7")
    assert not node["spec"].get("taints")
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "kubelets-check", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": "kubelets-check"}},
            "template": {
                "metadata": {"labels": {"app": "kubelets-check"}},
                "spec": {
                    "nodeSelector": {"example.org/kubelets": "yes"},
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }
    pods = "/api/v1/namespaces/default/pods?labelSelector=app%3Dkubelets-check"

    def ready() -> list[dict[str, Any]]:
        return [
            p
            for p in admin.ok("GET", pods)["items"]
            if p["spec"].get("nodeName") == "unit-kubelets-node"
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]

    def wait(what: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + 30
        while not (got := what()):
            assert time.monotonic() < deadline, "not within 30 s"
            time.sleep(0.2)
        return got

    with real_kube.Kubelets(kube_controllers, ["unit-kubelets-node"]) as kubelets:
        try:
            admin.ok("POST", "/apis/apps/v1/namespaces/default/daemonsets", daemonset)
            (pod,) = wait(ready)
            assert pod["status"]["phase"] == "Running" and pod["status"]["hostIP"] == "10.89.0.7"
            admin.ok(
                "PATCH",
                "/api/v1/nodes/unit-kubelets-node",
                {"metadata": {"labels": {"example.org/kubelets": None}}},
                "application/merge-patch+json",
            )
            wait(lambda: not admin.ok("GET", pods)["items"])  # deleted gracefully, then gone
        finally:
            admin.request("DELETE", "/apis/apps/v1/namespaces/default/daemonsets/kubelets-check")
            admin.request("DELETE", f"{pods}&gracePeriodSeconds=0")
            admin.request("DELETE", "/api/v1/nodes/unit-kubelets-node")
    assert not kubelets.errors, kubelets.errors
