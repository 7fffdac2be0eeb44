"""playbooks/remove-node.yml on the lab's real cluster (issue 18; docs/runbook.md, "Remove a node / replace a
failed server"), then the same server joined again under its name by playbooks/site.yml.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_remove_node_on_lab.py -v -s

gpu-node-3, which the breaker Lease names as held back before it starts:
- `--check` prints the plan (drain, the host's steps, the Lease entry to drop) and changes nothing: the Node
  is there, its kubelet runs, the Lease still names it;
- the run drains it (the gateway keeps 2 ready replicas, on the other nodes), resets the host (kubelet and GPU
  health agent stopped and disabled, kubeadm's files, the CNI configuration, the pod network's bridge,
  kube-proxy's nftables tables and the KUBE-/cali- iptables chains gone, no container left), deletes the Node
  and drops it from the Lease; the DaemonSets' pods bound to it go;
- a second run finds nothing to do (changed=0 on every host);
- site.yml joins it again: Ready with its 4 GPUs allocatable, the gateway 2/2.

A long test (LONG_LAB_TESTS): about 8 minutes, most of it the site run that joins the node again. Whatever
fails, the site run at the end puts the node back for the tests after it.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator

import pytest
import yaml
from labrun import ADMIN_KUBECTL, NODES, ROOT, Run, on_node, playbook, wait_for

pytestmark = pytest.mark.lab

NODE = NODES[2]
CONTROL_PLANE = NODES[0]
AGENT_VARS = yaml.safe_load((ROOT / "roles/gpu_health_agent/vars/main.yml").read_text())
AGENT_DEFAULTS = yaml.safe_load((ROOT / "roles/gpu_health_agent/defaults/main.yml").read_text())
AGENT_UNIT = AGENT_VARS["__gpu_health_agent_unit"]
LEASE = AGENT_VARS["__gpu_health_agent_lease"]
LEASE_NAMESPACE = AGENT_DEFAULTS["gpu_health_agent_namespace"]
HELD_BACK = "gpu-health.llm-platform.io/held-back"  # module_utils/gpu_breaker.py HELD_BACK_ANNOTATION
GATEWAY = yaml.safe_load((ROOT / "roles/llm_gateway/defaults/main.yml").read_text())
GATEWAY_NAMESPACE = GATEWAY["llm_gateway_namespace"]
POD_NETWORK_LINKS = yaml.safe_load((ROOT / "playbooks/remove-node.yml").read_text())[0]["vars"][
    "remove_node_pod_network_links"
]
PROXY_MODE = yaml.safe_load((ROOT / "inventories/lab/group_vars/k8s_cluster.yml").read_text())[
    "kubeadm_control_plane_proxy_mode"
]


def sh(node: str, command: str) -> str:
    proc = on_node(node, command, timeout=120)
    assert proc.returncode == 0, f"{node}: {command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def kubectl(*args: str) -> str:
    return sh(CONTROL_PLANE, f"{ADMIN_KUBECTL} {shlex.join(args)}")


def node_known() -> bool:
    return bool(kubectl("get", "nodes", "-o", "name").count(f"node/{NODE}\n"))


def node_ready() -> bool:
    got = on_node(CONTROL_PLANE, f"{ADMIN_KUBECTL} get node {NODE} -o json", timeout=60)
    if got.returncode != 0:
        return False
    conditions = json.loads(got.stdout)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def held_back() -> dict[str, str]:
    lease = json.loads(kubectl("-n", LEASE_NAMESPACE, "get", "lease", LEASE, "-o", "json"))
    return json.loads((lease["metadata"].get("annotations") or {}).get(HELD_BACK) or "{}")


def hold_back(entries: dict[str, str]) -> None:
    patch = {"metadata": {"annotations": {HELD_BACK: json.dumps(entries, sort_keys=True)}}}
    kubectl("-n", LEASE_NAMESPACE, "patch", "lease", LEASE, "--type=merge", "-p", json.dumps(patch))


def unit_state(unit: str) -> tuple[str, str]:
    """(is-enabled, is-active) of a unit on NODE."""
    enabled = on_node(NODE, f"systemctl is-enabled {unit}", timeout=60).stdout.strip()
    active = on_node(NODE, f"systemctl is-active {unit}", timeout=60).stdout.strip()
    return enabled, active


def pods_on_node() -> list[str]:
    return kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={NODE}", "-o", "name").split()


def gateway_ready() -> int:
    got = json.loads(kubectl("-n", GATEWAY_NAMESPACE, "get", "deployment", "llm-gateway", "-o", "json"))
    return int(got["status"].get("readyReplicas", 0))


def remove(*extra: str) -> Run:
    return playbook("playbooks/remove-node.yml", "-e", f"node={NODE}", *extra, timeout=1200)


@pytest.fixture
def node_put_back() -> Iterator[None]:
    """Whatever happens, the node is joined again (site.yml) and the Lease holds no entry of this test."""
    before = held_back()
    yield
    if not node_ready():
        run = playbook("playbooks/site.yml", timeout=2400)
        assert run.rc == 0, run.tail()
    if held_back() != before:
        hold_back(before)


def test_remove_node_drains_resets_deletes_and_site_joins_it_again(node_put_back):
    started_with = held_back()
    hold_back({**started_with, NODE: "held back by test_remove_node_on_lab.py"})

    plan = remove("--check")
    assert plan.rc == 0, plan.tail()
    flat = " ".join(plan.output.split())
    assert f"{NODE}: would drain it (evictions respect PodDisruptionBudgets)" in flat, plan.tail()
    first_steps = "kubeadm reset -f"
    if unit_state(AGENT_UNIT)[1] == "active":
        first_steps = f"systemctl disable --now {AGENT_UNIT}; {first_steps}"
    assert f"on {NODE} (reachable) would run: {first_steps}" in flat, plan.tail()
    assert f"would drop {NODE} from the breaker Lease's held-back list" in flat, plan.tail()
    assert f"kube-proxy mode: {PROXY_MODE}" in flat, plan.tail()
    assert node_ready(), "--check changed the Node"
    assert unit_state("kubelet") == ("enabled", "active"), "--check stopped the kubelet"
    assert NODE in held_back(), "--check changed the Lease"

    t0 = time.monotonic()
    run = remove()
    removal_s = time.monotonic() - t0
    assert run.rc == 0, run.tail()
    flat = " ".join(run.output.split())
    assert f"deleted the Node {NODE}, drained first" in flat, run.tail()
    assert f"dropped {NODE} from the breaker Lease's held-back list" in flat, run.tail()

    # the cluster's side
    assert not node_known(), f"the Node {NODE} is still there"
    assert held_back() == started_with, held_back()
    # the drain evicted what it may; the DaemonSets' pods go with the Node: kube-controller-manager's pod
    # garbage collector deletes pods bound to a Node that is gone (after its quarantine of 40 s)
    wait_for(f"no pod bound to {NODE}", lambda: pods_on_node() == [], 180)
    wait_for("the gateway's 2 replicas ready on the other nodes", lambda: gateway_ready() == 2, 180)

    # the host's side
    assert unit_state("kubelet") == ("disabled", "inactive")
    assert unit_state(AGENT_UNIT) == ("disabled", "inactive")
    assert on_node(NODE, "test -e /etc/kubernetes/kubelet.conf", timeout=60).returncode != 0
    assert on_node(NODE, "test -e /var/lib/kubelet/config.yaml", timeout=60).returncode != 0
    assert sh(NODE, "find /etc/cni/net.d -mindepth 1").strip() == ""
    # the pod network's bridge (kube-router's kube-bridge here) went: it kept the old pod CIDR, and the node
    # joined again below gets another one (its pods could not start, 2026-12-05)
    links = sh(NODE, "ip -o link show")
    assert [link for link in POD_NETWORK_LINKS if f" {link}:" in links or f" {link}@" in links] == [], links
    assert sh(NODE, "iptables-save; ip6tables-save").count(":KUBE-") == 0
    assert "cali-" not in sh(NODE, "iptables-save; ip6tables-save")
    assert "kube-proxy" not in sh(NODE, "nft list tables")
    assert sh(NODE, "crictl ps -a -q").strip() == "", "kubeadm reset left containers"

    again = remove()
    assert again.changed_nothing(), (again.changed(), again.changed_tasks())
    flat = " ".join(again.output.split())
    unknown = f"{NODE} is not a Node of the cluster (removed already, or never joined): nothing to delete"
    assert unknown in flat, again.tail()
    assert f"on {NODE} (reachable) ran: nothing (nothing of the cluster is left there)" in flat, again.tail()

    t0 = time.monotonic()
    joined = playbook("playbooks/site.yml", timeout=2400)
    join_s = time.monotonic() - t0
    assert joined.rc == 0, joined.tail()
    assert joined.changed()[NODE] > 0, joined.changed()
    flat = " ".join(joined.output.split())
    for node in NODES:
        assert f"{node}: Ready, 4/4 GPUs allocatable, kube-proxy {PROXY_MODE}" in flat, joined.tail(3000)
    assert "gateway: http://10.89.42.11:30001 (2/2 pods ready)" in flat, joined.tail(3000)
    assert unit_state("kubelet") == ("enabled", "active")
    assert unit_state(AGENT_UNIT) == ("enabled", "active")
    print(f"\nremove-node.yml: {removal_s:.0f} s; site.yml joining {NODE} again: {join_s:.0f} s")
