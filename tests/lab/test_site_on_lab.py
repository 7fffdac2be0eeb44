"""The main job on the lab: repair a half-built lab, converge playbooks/site.yml over SSH, then prove it
idempotent and still finding drift (issue 19): twelve things drift behind Ansible's back (tests/lab/drift.py),
`--check --diff` reports exactly those, and the second run, `make lab` as the README has engineers run it,
puts back exactly those and changes nothing else.

    make lab-up && .venv/bin/pytest -m lab tests/lab/test_site_on_lab.py -v

Runs first in `make lab-test`: the other lab tests need the converged nodes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections import Counter
from collections.abc import Iterator

import drift
import labctl
import pytest
import yaml
from labrun import NODES, ROOT, Run, command, on_node, playbook, podman, running_nodes

pytestmark = pytest.mark.lab

# the lab's kube-proxy mode (its one home: the lab inventory; this kernel has no ip_vs, docs/lab.md)
PROXY_MODE = yaml.safe_load((ROOT / "inventories/lab/group_vars/k8s_cluster.yml").read_text())[
    "kubeadm_control_plane_proxy_mode"
]


def site(*extra: str, json_callback: bool = False) -> Run:
    run = playbook("playbooks/site.yml", *extra, json_callback=json_callback)
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
    """Two ways a node is found broken: the control plane stopped (a server powered off, its disk kept), and
    workers whose processes were killed with the session that started them (started again, their disks
    kept: the state CI finds the lab in). The cluster (CA, etcd) survives, and the site run after it must
    bring the control plane's static Pods back through the kubelet. The third way, a worker gone (replaced,
    empty disk), is test_a_replaced_worker_is_recreated_converged_and_joined below, a long test."""
    assert podman("stop", "-t", "2", "gpu-node-1").returncode == 0
    for worker in NODES[1:]:
        kill_container_processes(worker)
    # the lab network's DNS server dies with the session too, its pid file left behind
    with contextlib.suppress(ValueError, OSError, ProcessLookupError):
        os.kill(int(labctl.AARDVARK_PID.read_text()), signal.SIGKILL)

    up = command(sys.executable, "tests/lab/labctl.py", "up", timeout=900)

    assert up.rc == 0, up.output
    assert "gpu-node-1: was exited; starting it" in up.output
    for worker in NODES[1:]:
        # podman sometimes notices the killed container itself, sometimes not (then labctl sees the dead
        # processes and records the exit conmon could not): either way it is started again with its disk
        repaired = rf"{worker}: (its processes are gone .*; starting it again|was \w+; starting it)"
        assert re.search(repaired, up.output), up.output
        assert f"{worker}: created" not in up.output, up.output
    assert set(NODES) <= set(running_nodes())
    for node in NODES:
        resolved = podman("exec", node, "getent", "hosts", labctl.MIRROR_NAME)
        assert resolved.returncode == 0, f"{node} does not resolve {labctl.MIRROR_NAME}:\n{up.output}"


@pytest.fixture(scope="module")
def drifted() -> Iterator[dict[str, str]]:
    """What the drift changed (the gateway's configuration, the policy's port), once it is made; at the end
    the drift is put back by hand whatever the runs did, so a failure here leaves no drifted lab to the tests
    after it."""
    made: dict[str, str] = {}
    yield made
    if "config" in made:
        drift.put_back(made)


def test_site_converges_then_check_reports_exactly_the_drift(drifted):
    first = site()
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in first.recap.values()), first.recap

    # the second real run is `make lab` below; before it, twelve things drift (tests/lab/drift.py)
    drifted.update(drift.inject())
    checked = site("--check", "--diff", json_callback=True)
    missing, other = drift.unexpected_changes(checked)
    assert missing == [], f"--check --diff did not report the drift: {missing}"
    assert other == [], f"--check --diff reports changes beyond the drift: {other}"
    assert checked.changed()[NODES[2]] == 0, checked.changed()
    # the roles' reads found the hand-edited file, the missing Include line and the two units
    # (files_in_place), the unheld package and the model tools' venv without its pin (packages_in_place),
    # and nothing else on any node (common's read lists its edit before its unit)
    found = drift.reads_not_in_place(checked)
    wanted = [
        (drift.NODE, [drift.FILE]),
        (drift.NODE, [drift.PACKAGE]),
        (drift.NODE, [drift.UNIT]),
        (drift.NODE, [drift.SSHD_CONFIG, drift.SERVICE]),
        (drift.TOOLS_NODE, [drift.TOOLS_VENV]),
    ]
    assert sorted((host, differ) for _, host, differ in found) == sorted(wanted), found
    # and check mode changed nothing
    assert drift.power_limits_w()[drift.GPU] == drift.DRIFT_POWER_W
    assert drift.PACKAGE not in drift.held()
    assert drift.sysctl_value() == "0"
    assert drift.file_state() == ("600", True)
    assert drift.unit_state() == ("disabled", "inactive")
    assert not drift.include_present()
    assert drift.tools_version() == ""
    assert drift.policy_port() == int(drifted["port"]) + 1
    assert drift.ca_edited()
    assert drift.key_slipped_in()


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


def test_make_lab_puts_back_exactly_the_drift_and_reports_every_node(drifted):
    """The README's main command, as an engineer runs it: lab-up, site.yml, then the report. After the
    converging run above it is the second run: it puts back the twelve drifts (each task changed on its host)
    and changes nothing else, gpu-node-3, which did not drift, changed=0."""
    if "config" not in drifted:
        pytest.fail("no drift was made: the converge above failed")
    made = command("make", "lab")
    assert made.rc == 0, made.tail()
    tasks = [name.split(" : ", 1)[-1] for name in made.changed_tasks()]
    wanted = set(drift.EXPECTED_TASKS.values())
    assert {t for t in tasks if not any(t.startswith(w) for w in wanted)} == set(), made.changed_tasks()
    assert {w for w in wanted if not any(t.startswith(w) for t in tasks)} == set(), made.changed_tasks()
    assert made.changed()[NODES[2]] == 0, made.changed()
    # one change per drift on its host (and sshd's reload and the agent's restart on NODE)
    per_host = Counter(host for _, host in drift.EXPECTED)
    assert {host: made.changed()[host] for host in per_host} == dict(per_host), made.changed()
    assert set(drift.power_limits_w()) == {drift.POWER_W}
    assert drift.PACKAGE in drift.held()
    assert drift.sysctl_value() == drift.SYSCTL_VALUE
    assert drift.file_state() == (drift.FILE_MODE, False)
    assert drift.unit_state() == ("enabled", "active")
    assert drift.include_present()
    assert drift.tools_version() == drift.TOOLS_REQUIREMENT.split("==")[1]
    assert drift.gateway_config() == drifted["config"]
    assert drift.policy_port() == int(drifted["port"])
    assert not drift.ca_edited()
    assert not drift.key_slipped_in()
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


def test_a_replaced_worker_is_recreated_converged_and_joined():
    """A worker gone (a server replaced, its disk empty): `labctl up` creates it again, and one site run
    converges it from nothing (driver, CUDA, containerd, kubeadm join under its old name, the health agent,
    the models) while the rest of the cluster stays as it was. A long test (LONG_LAB_TESTS): its converge
    from an empty disk is about ten minutes on this machine; last, so the tests after it find the lab
    whole."""
    worker = NODES[1]
    assert podman("rm", "-f", "-t", "2", worker).returncode == 0

    up = command(sys.executable, "tests/lab/labctl.py", "up", timeout=900)
    assert up.rc == 0, up.output
    assert f"{worker}: created" in up.output, up.output
    assert on_node(worker, "test -e /etc/kubernetes/kubelet.conf").returncode != 0, "the disk was not empty"

    run = site()
    assert run.changed()[worker] > 0, run.changed()
    assert run.changed()[NODES[2]] == 0, run.changed()
    flat = " ".join(run.output.split())
    for node in NODES:
        assert f"{node}: Ready, 4/4 GPUs allocatable, kube-proxy {PROXY_MODE}" in flat, run.tail(3000)
    assert "gateway: http://10.89.42.11:30001 (2/2 pods ready)" in flat, run.tail(3000)
    assert on_node(worker, "systemctl is-enabled kubelet").stdout.strip() == "enabled"
