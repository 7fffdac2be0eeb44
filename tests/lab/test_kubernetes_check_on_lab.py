"""`--check` of the Kubernetes stage (playbooks/kubernetes.yml) on a never-converged server.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_kubernetes_check_on_lab.py -v

README's first production command is `ansible-playbook ... playbooks/site.yml --check --diff`. On new
servers the stage must say what it would do (kubeadm init, Calico, the device plugin) and fail nowhere,
as the GPU stage does (tests/lab/test_gpu_stage_on_lab.py). The server is a throw-away container of the
lab image (`k8s-check-fresh`, 10.89.42.20, reached with podman exec) in control_plane, k8s_cluster and
gpu_nodes, with the lab's group_vars (its mirror). Needs the lab up (`make lab-up`): skipped otherwise.
That `--check` on the converged lab changes nothing is proved by tests/lab/test_site_on_lab.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from labrun import NODES, ROOT, playbook, podman, running_nodes

pytestmark = pytest.mark.lab

LAB_INVENTORY = ROOT / "inventories" / "lab"
FRESH = "k8s-check-fresh"
# on the lab network next to the nodes (.11-.13) and gpu-check-fresh (.19), clear of lab
# services (.3-.10) and molecule (.31-.59)
FRESH_IP = "10.89.42.20"
LAB_IMAGE = "localhost/llm-lab-node:bookworm"


def default(role: str, name: str) -> str:
    return str(yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())[name])


@pytest.fixture
def fresh_inventory(tmp_path: Path) -> Iterator[Path]:
    """A never-converged server: a throw-away lab-image container; yields an inventory for it."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed: the lab is not set up here (make lab-up, docs/lab.md)")
    running = running_nodes()
    down = [node for node in NODES if node not in running]
    if down:
        pytest.skip(f"lab nodes not running: {', '.join(down)} (make lab-up)")
    podman("rm", "--force", "--time", "0", FRESH)
    started = podman(
        "run", "--detach", "--name", FRESH, "--hostname", FRESH, "--systemd", "always",
        "--network", "llmlab", "--ip", FRESH_IP, "--no-hosts", LAB_IMAGE, "/sbin/init",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        group_vars = tmp_path / "group_vars"
        group_vars.mkdir()
        # the lab's group_vars find the lab's state (SSH keys, registry CA, image digests: .lab/) relative
        # to their inventory: point them at the checkout's
        for name in ("all.yml", "gpu_nodes.yml", "k8s_cluster.yml"):
            (group_vars / name).write_text(
                (LAB_INVENTORY / "group_vars" / name)
                .read_text()
                .replace("{{ inventory_dir }}/../..", str(ROOT))
                .replace("inventory_dir + '/../..", f"'{ROOT}")
                .replace("inventory_dir ~ '/../..", f"'{ROOT}")
            )
        (tmp_path / "hosts.yml").write_text(
            "all:\n  children:\n    k8s_cluster:\n      children:\n"
            "        control_plane:\n          hosts:\n"
            f"            {FRESH}:\n"
            "              ansible_connection: containers.podman.podman\n"
            f"              ansible_host: {FRESH}\n"
            "              ansible_user: root\n"
            "              ansible_python_interpreter: /usr/bin/python3\n"
            f"              node_ip: {FRESH_IP}\n"
            # no worker to copy the etcd backups to (role etcd_backup refuses a control plane keeping them
            # alone): a site path stands in
            "              etcd_backup_copy_to_path: /var/backups/etcd-site-copy\n"
            "        workers:\n          hosts: {}\n"
            "    gpu_nodes:\n      children:\n        control_plane:\n"
        )
        yield tmp_path / "hosts.yml"
    finally:
        podman("rm", "--force", "--time", "0", FRESH)


def test_check_mode_on_a_fresh_node_reports_the_cluster_it_would_make(fresh_inventory: Path) -> None:
    run = playbook("playbooks/kubernetes.yml", "--check", inventory=str(fresh_inventory), timeout=900)
    assert run.rc == 0, run.tail()
    assert run.failed()[FRESH] == 0
    assert run.changed()[FRESH] > 0
    said = " ".join(run.output.split())
    assert "A real run adds it and installs kubeadm=" in said  # kubernetes_node's check-mode report
    assert "would run kubeadm init" in said
    assert f"would apply Calico {default('calico', 'calico_version')}" in said
    plugin_version = default("nvidia_device_plugin", "nvidia_device_plugin_version")
    assert f"would apply the device plugin {plugin_version}" in said
    assert "no Kubernetes cluster" in said
    assert "Check mode: would copy etcdctl and etcdutl out of the etcd image kubeadm init pulls" in said
    # --check wrote nothing
    left = podman(
        "exec", FRESH, "sh", "-c",
        "ls -d /etc/kubernetes/admin.conf /etc/kubernetes/kubeadm-config.yaml /etc/kubernetes/addons"
        " /etc/apt/sources.list.d/kubernetes.sources /etc/apt/sources.list.d/docker.sources"
        " /etc/containerd/config.toml /opt/kubernetes-client /var/backups/etcd /usr/local/lib/etcd-backup"
        " /usr/local/lib/control-plane-metrics /etc/systemd/system/etcd-backup.timer 2>/dev/null; true",
    )  # fmt: skip
    assert left.returncode == 0, left.stderr
    assert left.stdout.split() == []
