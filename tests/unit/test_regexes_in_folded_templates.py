"""Regular expressions inside folded (`>-`) YAML templates do what they say, rendered by Ansible's templar.

A folded scalar reaches Jinja with its backslashes as written: a doubled backslash before a dot there is, to
the regex, a backslash followed by any character (a double-quoted YAML string halves it first). Four such
regexes did nothing on ansible-core 2.19: the kubeadm token was shown unmasked in the failure messages of init
and join; the static Pod names kept their `.yaml`, so the stop wait could not fail and the start wait
could not pass (the etcd restore and the certificate renewal ran out on the lab); old models'
`.manifest.json.cache` files were never pruned. Each task is read from its file, as Ansible reads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from role_render import RoleVars

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "abcdef.0123456789abcdef"
MANIFESTS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]


def task(path: str, name: str) -> dict[str, Any]:
    tasks = yaml.safe_load((ROOT / path).read_text())
    (found,) = [t for t in tasks if t.get("name") == name]
    return dict(found)


@pytest.mark.parametrize(
    ("role", "path", "name", "result"),
    [
        (
            "kubeadm_join",
            "roles/kubeadm_join/tasks/join.yml",
            "Stop when kubeadm join failed (its output shown with the token masked)",
            "__kubeadm_join_result",
        ),
        (
            "kubeadm_control_plane",
            "roles/kubeadm_control_plane/tasks/init.yml",
            "Stop when kubeadm init failed (its output shown with the tokens masked)",
            "__kubeadm_control_plane_init",
        ),
    ],
)
def test_a_failed_kubeadm_shows_its_output_with_the_token_masked(
    role: str, path: str, name: str, result: str
) -> None:
    output = {"rc": 1, "stderr": f"error: kubeadm join 10.0.0.1:6443 --token {TOKEN} failed", "stdout": ""}
    role = RoleVars(role, inventory_hostname="gpu-node-2", **{result: output})
    msg = str(role.template(task(path, name)["ansible.builtin.fail"]["msg"]))
    assert TOKEN not in msg and "--token <token> failed" in msg, msg


def crictl_running(names: list[str]) -> dict[str, str]:
    return {"stdout": json.dumps({"containers": [{"metadata": {"name": n}} for n in names]})}


def until_holds(path: str, name: str, running: list[str]) -> bool:
    wait = task(path, name)
    held = {
        "files": [{"path": f"/etc/kubernetes/manifests.stopped/{n}.yaml"} for n in MANIFESTS],
        "matched": 4,
    }
    role = RoleVars(
        "kubeadm_control_plane",
        __static_pods_found=held,
        __static_pods_held_files=held,
        __static_pods_running=crictl_running(running),
    )
    names = role.template(wait["vars"]["__static_pods_names"])
    assert names == MANIFESTS
    return RoleVars(
        "kubeadm_control_plane", __static_pods_names=names, __static_pods_running=crictl_running(running)
    ).when(wait["until"])


def test_the_start_wait_passes_once_every_control_plane_container_runs_and_not_before() -> None:
    start = (
        "playbooks/remediate/tasks/static-pods-start.yml",
        "Wait until every control-plane container runs again",
    )
    assert until_holds(*start, [*MANIFESTS, "kube-proxy", "calico-node"])
    assert not until_holds(
        *start, ["kube-apiserver", "kube-scheduler", "kube-controller-manager", "kube-proxy"]
    )


def test_the_stop_wait_passes_once_no_control_plane_container_runs_and_not_before() -> None:
    stop = ("playbooks/remediate/tasks/static-pods-stop.yml", "Wait until no control-plane container runs")
    assert until_holds(*stop, ["kube-proxy", "calico-node"])
    assert not until_holds(*stop, ["etcd", "kube-proxy"])


def test_pruning_an_old_model_version_removes_its_manifest_and_its_cache() -> None:
    prune = task(
        "roles/model_sync/tasks/main.yml",
        "Remove old versions beyond model_sync_keep_versions (never current)",
    )
    versions = [
        {"path": "/srv/models/qwen2/v2", "ctime": 2.0},
        {"path": "/srv/models/qwen2/v1", "ctime": 1.0},
    ]
    role = RoleVars(
        "model_sync",
        model_sync_root="/srv/models",
        model_sync_models=[{"name": "qwen2", "version": "v2"}],
        model_sync_keep_versions=1,
        ansible_check_mode=False,
        __model_sync_replaced=[],
        __model_sync_versions_now={"skipped": True},
        __model_sync_found={"found": {"versions": {"files": versions}}},
    )
    assert role.template(prune["loop"]) == [
        "/srv/models/qwen2/v1",
        "/srv/models/qwen2/v1.manifest.json",
        "/srv/models/qwen2/.v1.manifest.json.cache",
    ]
