"""The main job on the lab: repair a half-built lab, converge playbooks/site.yml over SSH,
then prove it idempotent (--check, then a second run as `make lab`, report changed=0 on every host).

    make lab-up && .venv/bin/pytest -m lab tests/lab/test_site_on_lab.py -v

Runs first in `make lab-test`: the other lab tests need the converged nodes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys

import pytest
import yaml
from labrun import NODES, ROOT, Run, command, on_node, playbook, podman, running_nodes

pytestmark = pytest.mark.lab

# the lab's kube-proxy mode (its one home: the lab inventory; this kernel has no ip_vs, docs/lab.md)
PROXY_MODE = yaml.safe_load((ROOT / "inventories/lab/group_vars/k8s_cluster.yml").read_text())[
    "kubeadm_control_plane_proxy_mode"
]


def site(*extra: str) -> Run:
    run = playbook("playbooks/site.yml", *extra)
    assert run.rc == 0, f"site.yml {' '.join(extra)} failed (rc {run.rc}):\n{run.tail()}"
    assert set(run.recap) == set(NODES), f"PLAY RECAP lacks hosts: {sorted(run.recap)}\n{run.tail(3000)}"
    return run


def kill_container_processes(name: str) -> None:
    """What the end of a session does to the lab: conmon and the container's init killed, while
    podman's records still say `running`."""
    pids = podman("inspect", name, "--format", "{{.State.ConmonPid}} {{.State.Pid}}").stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # killing conmon may have ended it already
            os.kill(int(pid), signal.SIGKILL)


def test_lab_up_repairs_a_half_created_lab():
    kill_container_processes("gpu-node-1")
    assert podman("rm", "-f", "-t", "2", "gpu-node-2").returncode == 0
    assert podman("stop", "-t", "2", "gpu-node-3").returncode == 0

    up = command(sys.executable, "tests/lab/labctl.py", "up", timeout=900)

    assert up.rc == 0, up.output
    # podman sometimes notices the killed container itself (then it is restarted), sometimes not
    # (then labctl sees the dead processes and recreates it): either is a repair
    repaired = r"gpu-node-1: (its processes are gone .*; recreating it|was \w+; starting it)"
    assert re.search(repaired, up.output), up.output
    assert "gpu-node-2: created" in up.output
    assert "gpu-node-3: was exited; starting it" in up.output
    assert set(NODES) <= set(running_nodes())
    if "gpu-node-1: its processes are gone" in up.output:
        # The control plane was recreated: its cluster (CA, etcd) went with it, and gpu-node-3 still holds a
        # kubelet.conf of that old cluster, which kubeadm_join leaves alone. An operator resets such a worker
        # before the next run, as here; the site run then joins it to the new cluster.
        reset = on_node("gpu-node-3", "if command -v kubeadm >/dev/null; then kubeadm reset -f; fi")
        assert reset.returncode == 0, reset.stderr


def test_site_converges_then_check_reports_no_change():
    first = site()
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in first.recap.values()), first.recap

    # the second real run is `make lab` below, as the README has engineers run it
    checked = site("--check", "--diff")
    assert checked.changed() == dict.fromkeys(NODES, 0), checked.changed_tasks()


@pytest.mark.parametrize("node", NODES)
def test_pynvml_lists_the_four_simulated_a100s(node):
    script = (
        "import pynvml; pynvml.nvmlInit(); "
        "print('\\n'.join(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) "
        "for i in range(pynvml.nvmlDeviceGetCount())))"
    )
    proc = on_node(node, f'/opt/nvidia-ml-py/bin/python3 -c "{script}"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:4] == ["NVIDIA A100-PCIE-40GB"] * 4
    assert proc.stdout.strip().count("\n") == 3


@pytest.mark.parametrize("node", NODES)
def test_python3_and_every_venv_the_roles_made_are_python_3_10(node):
    """Ubuntu 22.04's python3 is 3.10: so is the lab nodes' (labctl.node_python), and every venv the roles
    made from it (/opt/*: the NVML venv the GPU health agent runs in too, the model tools, the API client), so
    node-side code newer than 3.10 fails here first."""
    proc = on_node(
        node,
        "echo \"python3 $(python3 -c 'import platform; print(platform.python_version())')\"; "
        "for cfg in $(find /opt -maxdepth 3 -name pyvenv.cfg); do venv=$(dirname $cfg); "
        "echo \"$venv $($venv/bin/python -c 'import platform; print(platform.python_version())')\"; done",
    )
    assert proc.returncode == 0, proc.stderr
    versions = dict(line.split() for line in proc.stdout.splitlines())
    # the NVML venv on every GPU node (the GPU health agent runs in it too); the model tools'
    # and the API client's on the nodes that run them
    assert "/opt/nvidia-ml-py" in versions, f"python3 and at least the NVML venv expected: {versions}"
    assert {where: v for where, v in versions.items() if not v.startswith("3.10.")} == {}, versions


def test_apt_policy_shows_the_stand_in_packages_from_the_lab_mirror():
    proc = on_node("gpu-node-1", "apt-cache policy nvidia-headless-535 cuda-toolkit-12-1")
    assert proc.returncode == 0, proc.stderr
    policy = proc.stdout
    assert "http://lab-mirror:8080/cuda/ubuntu2204/x86_64" in policy
    assert "Installed: 535.183.06-0ubuntu1" in policy
    assert "Installed: 12.1.1-1" in policy
    # the newer 535 build is visible but pinned away
    assert "535.216.03-0ubuntu1" in policy


def test_make_lab_on_the_converged_lab_changes_nothing_and_reports_every_node():
    """The README's main command, as an engineer runs it: lab-up, site.yml, then the report. After the
    converging run above it is the second run: changed=0 on every host."""
    made = command("make", "lab")
    assert made.rc == 0, made.tail()
    assert made.changed() == dict.fromkeys(NODES, 0), made.changed_tasks()
    # one line per node; the YAML callback may wrap it once
    line = (
        r"msg: driver 535\.183\.06 \(CUDA 12\.2\), 4 x NVIDIA A100-PCIE-40GB,[^\n]*"  # first line
        r"(?:\n[^\n]*)?health (\w+)"  # and the wrapped rest, if any
    )
    report = re.findall(line, made.output)
    assert report == ["healthy"] * 3, made.tail(3000)
    # and the summaries of the Kubernetes and serving stages (flattened: the callback wraps long lines)
    flat = " ".join(made.output.split())
    for node in NODES:
        assert f"{node}: Ready, 4/4 GPUs allocatable, kube-proxy {PROXY_MODE}" in flat, made.tail(3000)
    assert "model qwen2-tiny (served as qwen2-tiny): 2/2 replicas ready" in flat, made.tail(3000)
    assert "gateway: http://10.89.42.11:30001 (2/2 pods ready)" in flat, made.tail(3000)
