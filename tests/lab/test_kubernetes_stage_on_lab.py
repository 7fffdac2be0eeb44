"""The Kubernetes stage (playbooks/kubernetes.yml) on the running lab.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_kubernetes_stage_on_lab.py -v

Converges the stage (a no-op where it is converged), then proves on the lab's cluster: the rendered kubeadm
config passes `kubeadm config validate` on the node and holds the lab's kube-proxy mode (nftables: this kernel
has no ip_vs), the pod subnet, the systemd cgroup
driver and the audit policy; a second run changes nothing (`--check --diff`: site.yml's test); a worker reset
with `kubeadm reset` joins again with `--limit workers` (the control plane up, the token made by the join
role, never printed); every kubelet runs with `--node-ip` = its node_ip, which is its Node's InternalIP, and
calico-node takes its address from that InternalIP; the device plugin fault (`scripts/lab-fault NODE kube
device-plugin-unregistered`) fails the stage on that node alone, naming it; each bad value fails in the
validation play, before any change, naming the variable.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from labrun import ADMIN_KUBECTL, NODES, ROOT, Run, as_operator, env, on_node, playbook, running_nodes

pytestmark = pytest.mark.lab

STAGE = "playbooks/kubernetes.yml"
TOKEN = re.compile(r"\b[a-z0-9]{6}\.[a-z0-9]{16}\b")
VALIDATION_PLAY = "PLAY [Kubernetes - validate every role's values before any change]"
RESET_WORKER = "gpu-node-3"
FAULT_WORKER = "gpu-node-2"


def stage(*extra: str) -> Run:
    return playbook(STAGE, *extra, timeout=900)


def converged(*extra: str) -> Run:
    run = stage(*extra)
    assert run.rc == 0, f"kubernetes.yml {' '.join(extra)} failed (rc {run.rc}):\n{run.tail()}"
    assert not TOKEN.search(run.output), "a bootstrap token appeared in the output"
    return run


def joined(node: str) -> bool:
    return on_node(node, "test -s /etc/kubernetes/kubelet.conf").returncode == 0


def lab_fault(node: str, *args: str) -> None:
    subprocess.run(
        [str(ROOT / "scripts/lab-fault"), node, "kube", *args], check=True, env=env(), capture_output=True
    )


@pytest.fixture(scope="module")
def first_run() -> Run:
    """A converging run (a no-op on a converged lab)."""
    if "gpu-node-1" not in running_nodes():
        pytest.skip("the lab is not running (make lab-up)")
    run = converged()
    assert set(run.recap) == set(NODES), run.recap
    return run


@pytest.fixture(autouse=True)
def cluster(first_run: Run) -> None:
    """Every test starts from a converged cluster."""


def test_second_run_changes_nothing(first_run: Run) -> None:
    # on the lab make lab converged, the module's first run is a second run already; `--check --diff` on the
    # converged lab is site.yml's (tests/lab/test_site_on_lab.py), which imports this stage
    again = first_run if first_run.changed_nothing() else converged()
    assert again.changed() == dict.fromkeys(NODES, 0), again.changed_tasks()


def test_summary_line_per_node(first_run: Run) -> None:
    # the YAML callback wraps long messages: match the line wrapped or not
    flat = " ".join(first_run.output.split())
    for node in NODES:
        assert re.search(
            rf"{node}: Ready, 4/4 GPUs allocatable, kube-proxy nftables, "
            r"nft map ip kube-proxy service-ips has kubernetes 10\.96\.0\.1:443",
            flat,
        ), first_run.tail(4000)


def test_rendered_kubeadm_config_passes_validate_on_the_node() -> None:
    path = "/etc/kubernetes/kubeadm-config.yaml"
    result = on_node("gpu-node-1", f"kubeadm config validate --config {path} && cat {path}")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for wanted in (
        'mode: "nftables"',  # inventories/lab: the mode this kernel supports
        'podSubnet: "10.244.0.0/16"',
        "cgroupDriver: systemd",
        "name: audit-policy-file",
        "/etc/kubernetes/audit/policy.yaml",
    ):
        assert wanted in text, f"{wanted!r} missing from {path}:\n{text}"
    assert on_node("gpu-node-1", "test -s /etc/kubernetes/audit/policy.yaml").returncode == 0


def test_every_kubelet_and_calico_node_take_node_ip() -> None:
    """The kubelet's --node-ip comes from the kubeadm configs (kubeadm itself passes none), the Node's
    InternalIP is node_ip, and calico-node takes its address from the InternalIP, not first-found."""
    inventory = yaml.safe_load((ROOT / "inventories/lab/hosts.yml").read_text())
    groups = inventory["all"]["children"]["k8s_cluster"]["children"]
    node_ips = {name: host["node_ip"] for group in groups.values() for name, host in group["hosts"].items()}
    nodes = json.loads(on_node("gpu-node-1", f"{ADMIN_KUBECTL} get nodes -o json").stdout)["items"]
    internal = {
        n["metadata"]["name"]: [a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP"]
        for n in nodes
    }
    for name, node_ip in node_ips.items():
        flags = on_node(name, "cat /var/lib/kubelet/kubeadm-flags.env").stdout
        assert f"--node-ip={node_ip}" in flags, (name, flags)
        assert internal[name] == [node_ip], (name, internal[name])
    daemonset = json.loads(
        on_node("gpu-node-1", f"{ADMIN_KUBECTL} -n kube-system get daemonset calico-node -o json").stdout
    )
    (container,) = [
        c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "calico-node"
    ]
    assert {"name": "IP_AUTODETECTION_METHOD", "value": "kubernetes-internal-ip"} in container["env"]


def test_each_operator_has_a_kubeconfig_of_their_own() -> None:
    # the API (and its audit log) sees the person, not the shared kubernetes-admin
    who = as_operator("kubectl auth whoami -o json")
    assert who.returncode == 0, who.stderr
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == "ops"
    assert as_operator("kubectl get nodes -o name").stdout.split() == [f"node/{n}" for n in NODES]
    # allowed through the binding of that user alone (an unlisted operator's is deleted: unit-tested)
    binding = on_node(
        "gpu-node-1",
        "kubectl --kubeconfig /etc/kubernetes/admin.conf get clusterrolebinding "
        "llm-platform:operator:ops -o jsonpath='{.subjects[*].name}'",
    )
    assert binding.stdout == "ops", binding


@pytest.fixture
def reset_worker() -> Iterator[str]:
    """RESET_WORKER after `kubeadm reset -f`; joined again afterwards whatever the test found."""
    reset = on_node(RESET_WORKER, "kubeadm reset -f")
    try:
        assert reset.returncode == 0, reset.stderr
        yield RESET_WORKER
    finally:
        if not joined(RESET_WORKER):
            stage("--limit", RESET_WORKER)


def test_a_reset_worker_joins_again_with_limit_workers(reset_worker: str) -> None:
    # right after the reset its old Node is still Ready in the API (the kubelet stopped moments ago),
    # as on real servers: kubeadm join refuses a Ready Node of its name until it goes stale
    assert not joined(reset_worker)
    run = converged("--limit", "workers")
    assert set(run.recap) == {"gpu-node-2", "gpu-node-3"}
    assert run.recap[reset_worker]["changed"] > 0 and run.recap["gpu-node-2"]["changed"] == 0, run.recap
    assert joined(reset_worker)
    # the JoinConfiguration that carried the token is gone
    assert on_node(reset_worker, "test -e /run/kubeadm-join.yaml").returncode != 0
    flat = " ".join(run.output.split())
    assert re.search(rf"{reset_worker}: Ready, 4/4 GPUs allocatable", flat), run.tail()


@pytest.fixture
def device_plugin_fault() -> Iterator[str]:
    """FAULT_WORKER's device plugin not registering (allocatable 0); cleared afterwards."""
    lab_fault(FAULT_WORKER, "device-plugin-unregistered")
    try:
        yield FAULT_WORKER
    finally:
        lab_fault(FAULT_WORKER, "clear")


def test_device_plugin_fault_fails_the_stage_naming_the_node(device_plugin_fault: str) -> None:
    # an int, as the role's argument specs want it (`-e name=9` passes a string, refused in validation)
    run = stage("-e", json.dumps({"nvidia_device_plugin_ready_timeout": 9}))
    assert run.rc != 0
    assert "PLAY [Kubernetes verification" in run.output, run.tail()  # the stage went on with the others
    assert run.failed() == {"gpu-node-1": 0, "gpu-node-2": 1, "gpu-node-3": 0}, (run.recap, run.tail())
    assert run.changed() == dict.fromkeys(NODES, 0), run.changed_tasks()
    flat = " ".join(run.output.split())
    # the restarted kubelet's device manager starts empty: capacity 0 too, as on a server
    named = rf"Node {device_plugin_fault} offers nvidia\.com/gpu allocatable 0 \(capacity 0\) but has 4 GPUs"
    assert re.search(named, flat), run.tail()
    assert not TOKEN.search(run.output), "a bootstrap token appeared in the output"


BAD_VALUES = [
    (
        "kubeadm_control_plane_pod_subnet=10.96.0.0/16",
        "kubeadm_control_plane_pod_subnet (10.96.0.0/16) overlaps",
    ),
    (
        "kubeadm_control_plane_pod_subnet=10.89.0.0/16",
        "kubeadm_control_plane_pod_subnet (10.89.0.0/16) overlaps the network",
    ),
    ("kubernetes_version=1.36", "kubernetes_version must be 1.MINOR.PATCH"),
    # another version than the running cluster's: playbooks/upgrade-kubernetes.yml moves it
    ("kubernetes_version=1.36.4", "the inventory asks 1.36.4 (kubernetes_version)"),
    (
        "kubeadm_control_plane_proxy_mode=userspace",
        "kubeadm_control_plane_proxy_mode must be ipvs, nftables or iptables",
    ),
    ("containerd_version=1.7.24", "containerd_version"),
]


@pytest.mark.parametrize(("value", "message"), BAD_VALUES, ids=[v for v, _ in BAD_VALUES])
def test_bad_value_fails_before_any_change(value: str, message: str) -> None:
    refused(stage("-e", value), message)


def test_two_control_plane_hosts_are_refused(tmp_path: Path) -> None:
    extra = tmp_path / "two-control-planes.yml"
    extra.write_text("all:\n  children:\n    control_plane:\n      hosts:\n        gpu-node-2:\n")
    refused(stage("-i", str(extra)), "control_plane must hold exactly one host")


def refused(run: Run, message: str) -> None:
    assert run.rc != 0, run.tail(3000)
    assert message in run.output, run.tail(4000)
    assert all(count == 0 for count in run.changed().values()), run.recap
    plays = re.findall(r"^PLAY \[.*\]", run.output, re.MULTILINE)
    assert plays == [VALIDATION_PLAY], f"a play after the validation ran: {plays}"
