"""The unit tests' control plane (real_kube.py) is the real one of the production pin, with the flags kubeadm
gives it: what the lab's API stand-in used to accept, it refuses."""

from __future__ import annotations

import subprocess
from pathlib import Path

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
