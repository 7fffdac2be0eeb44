"""playbooks/remove-node.yml run by ansible-playbook against the real control plane of the production pin
(real_kube.py; test_gpu_health_agent.Cluster: three GPU Nodes, the agents' breaker Lease), as
test_oncall_playbooks.py runs the on-call playbooks: gpu-node-1 (the control plane) and gpu-node-2 are this
machine (connection local), gpu-node-3 a server that does not answer (SSH to a closed port of 127.0.0.1). So
the host steps (kubeadm reset, the CNI configuration, kube-proxy's rules) never run here: the unreachable
path reports the commands they would run, and --check on gpu-node-2 only reads. kubeadm reset and the rules'
cleanup on a real node are the lab's to prove. real_kube.Kubelets writes what the Nodes' kubelets would for
their pods (Running and Ready; the final delete once evicted); kube-controller-manager's disruption
controller keeps the PodDisruptionBudgets' status the eviction API judges by."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_kube import ControlPlane, Kubelets
from test_gpu_health_agent import HELD_BACK, NODES, Cluster, wait
from test_oncall_playbooks import Site, recap_changed

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "remove-node.yml"
APP = "retired-app"
PODS = f"/api/v1/namespaces/default/pods?labelSelector=app%3D{APP}"
IMAGE = "registry.k8s.io/pause:3.10.2"
KUBE_PROXY = "/api/v1/namespaces/kube-system/configmaps/kube-proxy"


def closed_port() -> int:
    """A port nothing listens on: SSH to it is refused at once, as to a server that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RemoveSite(Site):
    """The on-call tests' site with gpu-node-3 unreachable."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        super().__init__(cluster, tmp)
        inventory = json.loads(self.inventory.read_text())
        workers = inventory["all"]["children"]["k8s_cluster"]["children"]["workers"]["hosts"]
        workers["gpu-node-3"] = {
            "ansible_connection": "ssh",
            "ansible_host": "127.0.0.1",
            "ansible_port": closed_port(),
            "ansible_user": "nobody",
        }
        self.inventory.write_text(json.dumps(inventory))

    def command(self, playbook: str, *args: str) -> list[str]:
        command = super().command(playbook, *args)
        command[3] = str(PLAYBOOK)  # Site's commands name playbooks/remediate/<playbook>
        return command

    def remove(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.play("remove-node.yml", *args)

    def nodes(self) -> list[str]:
        return sorted(n["metadata"]["name"] for n in self.cluster.admin.ok("GET", "/api/v1/nodes")["items"])

    def kube_proxy_mode(self, mode: str) -> None:
        """ConfigMap kube-system/kube-proxy as kubeadm writes it (config.conf: the KubeProxyConfiguration)."""
        admin = self.cluster.admin
        admin.request("DELETE", KUBE_PROXY)
        config = f"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\n"
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
            "data": {"config.conf": config},
        }
        admin.ok("POST", "/api/v1/namespaces/kube-system/configmaps", body)

    def held_back(self, entries: dict[str, str]) -> None:
        lease = self.cluster.admin.ok("GET", self.cluster.lease_path)
        annotation = {
            n: {"why": why, "by": "gpu-node-x", "time": "2026-01-01T00:00:00.000000Z"}
            for n, why in entries.items()
        }
        lease["metadata"].setdefault("annotations", {})[HELD_BACK] = json.dumps(annotation, sort_keys=True)
        self.cluster.admin.ok("PUT", self.cluster.lease_path, lease)

    def pods(self) -> list[dict[str, Any]]:
        return self.cluster.admin.ok("GET", PODS)["items"]

    def one_replica_a_budget_lets_go(self, node: str) -> str:
        """A pod of a ReplicaSet on NODE and a PodDisruptionBudget that allows evicting it (maxUnavailable 1),
        once the disruption controller counted it. Returns the pod's name."""
        admin = self.cluster.admin
        replicaset = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": APP, "namespace": "default", "labels": {"app": APP}},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": APP}},
                "template": {
                    "metadata": {"labels": {"app": APP}},
                    "spec": {"containers": [{"name": "main", "image": IMAGE}]},
                },
            },
        }
        owner = admin.ok("POST", "/apis/apps/v1/namespaces/default/replicasets", replicaset)["metadata"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{APP}-",
                "namespace": "default",
                "labels": {"app": APP},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": APP,
                        "uid": owner["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": IMAGE}],
            },
        }
        name = admin.ok("POST", "/api/v1/namespaces/default/pods", pod)["metadata"]["name"]
        pdb = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": APP, "namespace": "default"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": APP}}},
        }
        admin.ok("POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", pdb)

        def counted() -> bool:
            path = f"/apis/policy/v1/namespaces/default/poddisruptionbudgets/{APP}"
            status = admin.ok("GET", path).get("status") or {}
            return status.get("currentHealthy") == 1 and status.get("disruptionsAllowed") == 1

        wait(counted, timeout=30)
        return name

    def restore(self) -> None:
        """What a test removed, back: the Nodes (as their kubelets would register them again), no app, no
        kube-proxy ConfigMap; then the on-call tests' reset (uncordoned, annotations and the Lease clean)."""
        admin = self.cluster.admin
        for name in set(NODES) - set(self.nodes()):
            node = NODES[name]
            self.cluster.api.register_node(name, node["labels"], node["ip"], node["gpus"])
        admin.request("DELETE", f"/apis/apps/v1/namespaces/default/replicasets/{APP}")
        admin.request("DELETE", f"/apis/policy/v1/namespaces/default/poddisruptionbudgets/{APP}")
        admin.request("DELETE", f"{PODS}&gracePeriodSeconds=0")
        admin.request("DELETE", KUBE_PROXY)
        self.reset()


@pytest.fixture(scope="module")
def site(kube_controllers: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoveSite]:
    cluster = Cluster(kube_controllers, tmp_path_factory.mktemp("remove-node-api"))
    kubelets = Kubelets(kube_controllers, NODES)
    made = RemoveSite(cluster, tmp_path_factory.mktemp("remove-node-site"))
    with kubelets:
        yield made
        made.restore()
    cluster.close()
    assert not kubelets.errors, kubelets.errors


@pytest.fixture
def fresh(site: RemoveSite) -> Iterator[RemoveSite]:
    site.restore()
    yield site
    site.restore()


def said(run: subprocess.CompletedProcess[str]) -> str:
    return " ".join((run.stdout + run.stderr).split())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), "pass -e node=<a worker of k8s_cluster>"),
        (("-e", "node="), "pass -e node=<a worker of k8s_cluster>"),
        (("-e", "node=gpu-node-9"), "node=gpu-node-9 is not a host of the inventory's k8s_cluster"),
        (("-e", "node=gpu-node-1"), "node=gpu-node-1 is the control plane"),
        (("-e", "node=gpu-node-2", "-e", "drain_timeout=0"), "drain_timeout must be seconds > 0"),
    ],
)
def test_bad_input_is_refused_naming_the_variable_before_any_change(
    fresh: RemoveSite, args: tuple[str, ...], expected: str
) -> None:
    fresh.held_back({"gpu-node-3": "circuit breaker"})
    run = fresh.remove(*args)
    assert run.returncode != 0, run.stdout
    assert expected in said(run), said(run)[-3000:]
    assert "TASK [Drain" not in run.stdout and "kubeadm reset" not in run.stdout
    assert fresh.nodes() == sorted(NODES)
    assert fresh.cluster.cordoned() == []
    assert list(fresh.cluster.held_back()) == ["gpu-node-3"]


def test_check_reads_and_plans_and_changes_nothing(fresh: RemoveSite) -> None:
    fresh.kube_proxy_mode("nftables")
    pod = fresh.one_replica_a_budget_lets_go("gpu-node-2")
    wait(lambda: [p for p in fresh.pods() if p["status"].get("phase") == "Running"], timeout=30)
    fresh.held_back({"gpu-node-2": "circuit breaker", "gpu-node-3": "circuit breaker"})
    run = fresh.remove("-e", "node=gpu-node-2", "--check")
    assert run.returncode == 0, run.stdout + run.stderr
    text = said(run)
    assert "gpu-node-2: would drain it (evictions respect PodDisruptionBudgets)" in text, text[-4000:]
    assert "would delete the Node gpu-node-2" in text, text[-4000:]
    assert "would drop gpu-node-2 from the breaker Lease's held-back list" in text, text[-4000:]
    assert "on gpu-node-2 (reachable) would run:" in text, text[-4000:]
    # nothing changed: the Node, its pod, the Lease
    assert fresh.nodes() == sorted(NODES)
    assert fresh.cluster.cordoned() == []
    assert [p["metadata"]["name"] for p in fresh.pods()] == [pod]
    assert sorted(fresh.cluster.held_back()) == ["gpu-node-2", "gpu-node-3"]
    assert not fresh.cluster.admin.ok("GET", fresh.cluster.lease_path)["spec"].get("holderIdentity")


def test_check_on_an_unreachable_node_names_the_commands_for_its_kube_proxy_mode(fresh: RemoveSite) -> None:
    fresh.kube_proxy_mode("nftables")
    run = fresh.remove("-e", "node=gpu-node-3", "--check")
    assert run.returncode == 0, run.stdout + run.stderr
    text = said(run)
    assert "gpu-node-3 is unreachable" in text, text[-4000:]
    for command in (
        "kubeadm reset -f",
        "systemctl disable --now kubelet",
        "find /etc/cni/net.d -mindepth 1 -delete",
        # the pod network's interfaces, which keep the node's old pod CIDR (a node joined again gets another)
        'for link in cni0 kube-bridge vxlan.calico vxlan-v6.calico flannel.1; do ip link show "$link"',
        "nft delete table ip kube-proxy",
        "nft delete table ip6 kube-proxy",
    ):
        assert command in text, (command, text[-4000:])
    assert "ipvsadm --clear" not in text
    assert fresh.nodes() == sorted(NODES)


def test_removes_an_unreachable_worker_then_a_second_run_changes_nothing(fresh: RemoveSite) -> None:
    fresh.kube_proxy_mode("ipvs")
    pod = fresh.one_replica_a_budget_lets_go("gpu-node-3")
    wait(lambda: [p for p in fresh.pods() if p["status"].get("phase") == "Running"], timeout=30)
    fresh.held_back({"gpu-node-2": "circuit breaker", "gpu-node-3": "circuit breaker"})
    run = fresh.remove("-e", "node=gpu-node-3", "-e", "drain_timeout=60")
    assert run.returncode == 0, run.stdout + run.stderr
    text = said(run)
    # drained (the budget allowed the eviction), then the Node deleted, then gone from the breaker's state
    assert pod not in [p["metadata"]["name"] for p in fresh.pods()]
    assert fresh.nodes() == ["gpu-node-1", "gpu-node-2"]
    assert list(fresh.cluster.held_back()) == ["gpu-node-2"]
    assert not fresh.cluster.admin.ok("GET", fresh.cluster.lease_path)["spec"].get("holderIdentity")
    # the host steps: not done, said so, with what to run there (kube-proxy ran in IPVS mode)
    assert "NOT DONE on gpu-node-3 (unreachable)" in text, text[-4000:]
    for command in (
        "kubeadm reset -f",
        "systemctl disable --now kubelet",
        "ipvsadm --clear",
        "ip link delete kube-ipvs0",
    ):
        assert command in text, (command, text[-4000:])
    assert "nft delete table" not in text

    again = fresh.remove("-e", "node=gpu-node-3")
    assert again.returncode == 0, again.stdout + again.stderr
    text = said(again)
    assert "gpu-node-3 is not a Node of the cluster (removed already, or never joined)" in text, text[-4000:]
    assert "NOT DONE on gpu-node-3 (unreachable)" in text
    assert set(recap_changed(again.stdout).values()) == {0}, again.stdout[-3000:]
    assert fresh.nodes() == ["gpu-node-1", "gpu-node-2"]


def test_a_node_whose_kubelet_stopped_reporting_is_not_drained(fresh: RemoveSite) -> None:
    """A dead server's pods cannot stop (no kubelet): a drain would wait for ever. The plan says so; the pod
    garbage collector deletes them once the Node is gone."""
    status = {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}
    path = "/api/v1/nodes/gpu-node-3/status"
    patch = "application/strategic-merge-patch+json"
    fresh.cluster.admin.ok("PATCH", path, {"status": status}, patch)
    try:
        run = fresh.remove("-e", "node=gpu-node-3", "--check")
    finally:
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
        fresh.cluster.admin.ok("PATCH", path, {"status": {"conditions": [ready]}}, patch)
    assert run.returncode == 0, run.stdout + run.stderr
    text = said(run)
    assert "gpu-node-3: its kubelet does not report Ready: not drained" in text, text[-4000:]
    assert "would delete the Node gpu-node-3 (not drained: its kubelet did not report Ready)" in text
    assert fresh.nodes() == sorted(NODES)
