"""playbooks/upgrade-kubernetes.yml on the lab's real cluster (issue 18; docs/runbook.md, "Upgrade Kubernetes
one minor"): from the site's Kubernetes (1.36.3) to the newest patch of the next minor (1.37.2), the control
plane first, then each worker, one at a time, while chat completions go to the gateway.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_kubernetes_upgrade_on_lab.py -v -s

Both releases are real, built from their Go modules (tests/lab/gobuild: kubernetes and kubernetes-next, with
kubeadm 1.37's etcd 3.7.0 and CoreDNS v1.14.6: etcd-next, coredns-next), their kubeadm, kubelet and kubectl
in the lab mirror's pkgs.k8s.io repository of each minor (tests/lab/mirror/packages.yml, kubernetes and its
next), their images in the lab's registry. The target is raised as the runbook says: kubernetes_version
alone (the cri-tools and kubernetes-cni pins follow the minor's row of roles/kubernetes/vars/main.yml).
1. --check prints the plan (the control plane, then each worker) and changes nothing.
2. The upgrade, under traffic (tests/lab/traffic.py): kubeadm-config says the target, every Node is Ready on
   it, the control plane's static Pods, kube-proxy, etcd and CoreDNS run the images kubeadm of the target
   names, kubeadm, kubelet, kubectl and cri-tools are the target minor's packages and held, nothing is left
   cordoned. The failed requests are printed (docs/benchmarks.md: the goal is 0) and asserted none.
3. A second --check has nothing to do.
Always afterwards (the fixture): kubeadm does not downgrade, so the three nodes are replaced by new ones
(`labctl.py replace-nodes`) and site.yml builds the cluster at the site's version again.

A long test (LONG_LAB_TESTS): about 25 minutes, most of it the rebuild.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import yaml
from images import kubeadm_constant
from labrun import ADMIN_KUBECTL, NODES, ROOT, Run, on_node, playbook
from traffic import Traffic

pytestmark = pytest.mark.lab

CONTROL_PLANE = NODES[0]
PINNED = yaml.safe_load((ROOT / "roles/kubernetes/defaults/main.yml").read_text())["kubernetes_version"]
NEXT_PACKAGES = yaml.safe_load((ROOT / "tests/lab/mirror/packages.yml").read_text())["kubernetes"]["next"]
TARGET = NEXT_PACKAGES["versions"][0].split("-")[0]
TO_TARGET = ("-e", f"kubernetes_version={TARGET}")


def sh(node: str, command: str) -> str:
    proc = on_node(node, command, timeout=120)
    assert proc.returncode == 0, f"{node}: {command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def kubectl_json(args: str) -> dict:
    return json.loads(sh(CONTROL_PLANE, f"{ADMIN_KUBECTL} {args} -o json"))


def kubelets() -> dict[str, str]:
    """Each Node's kubelet version, "v1.36.3"; "NotReady" appended where it is not Ready."""
    found = {}
    for node in kubectl_json("get nodes")["items"]:
        ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
        found[node["metadata"]["name"]] = node["status"]["nodeInfo"]["kubeletVersion"] + (
            "" if ready else " NotReady"
        )
    return found


def cluster_version() -> str:
    config = kubectl_json("-n kube-system get configmap kubeadm-config")["data"]["ClusterConfiguration"]
    return str(yaml.safe_load(config)["kubernetesVersion"])


def cordoned() -> list[str]:
    return sorted(
        n["metadata"]["name"] for n in kubectl_json("get nodes")["items"] if n["spec"].get("unschedulable")
    )


def kube_system_images() -> set[str]:
    pods = kubectl_json("-n kube-system get pods")["items"]
    return {container["image"] for pod in pods for container in pod["spec"]["containers"]}


def upgrade(*extra: str) -> Run:
    return playbook("playbooks/upgrade-kubernetes.yml", *TO_TARGET, *extra, timeout=3600)


@pytest.fixture
def nodes_rebuilt_afterwards() -> Iterator[None]:
    """kubeadm does not downgrade: whatever happened, the nodes are replaced by new servers and site.yml
    builds the cluster at the site's kubernetes_version again (what `make lab` does on a machine without a
    lab)."""
    yield
    try:
        if cluster_version() == f"v{PINNED}" and set(kubelets().values()) == {f"v{PINNED}"}:
            return  # nothing moved
    except AssertionError as err:  # the API does not answer: rebuild all the same
        print(f"\nthe cluster could not be read ({err}); the nodes are replaced")
    began = time.monotonic()
    replaced = subprocess.run(
        [sys.executable, str(ROOT / "tests/lab/labctl.py"), "replace-nodes"], check=False, timeout=1800
    )
    assert replaced.returncode == 0, "labctl.py replace-nodes failed (its output above)"
    site = playbook("playbooks/site.yml", timeout=3600)
    assert site.rc == 0, site.tail()
    print(f"\nthe lab rebuilt at {PINNED}: {time.monotonic() - began:.0f} s")
    assert set(kubelets().values()) == {f"v{PINNED}"}, kubelets()


def test_kubernetes_moves_one_minor_node_by_node_under_traffic(nodes_rebuilt_afterwards: None) -> None:
    assert cluster_version() == f"v{PINNED}" and set(kubelets().values()) == {f"v{PINNED}"}, kubelets()
    assert cordoned() == []

    # 1. the plan, and nothing changed
    plan = upgrade("--check")
    assert plan.rc == 0, plan.tail()
    flat = " ".join(plan.output.split())
    assert f"Kubernetes {PINNED} -> {TARGET}, in this order:" in flat, plan.tail()
    assert f"{CONTROL_PLANE} (control plane): the cluster {PINNED} -> {TARGET}" in flat, plan.tail()
    assert f"{NODES[1]} (worker 1 of 2): kubelet {PINNED} -> {TARGET}" in flat, plan.tail()
    assert cluster_version() == f"v{PINNED}" and set(kubelets().values()) == {f"v{PINNED}"}, kubelets()

    # 2. the upgrade, under traffic
    began = time.monotonic()
    with Traffic("lab-kubernetes-upgrade") as traffic:
        run = upgrade()
    took = time.monotonic() - began
    print(
        f"\nupgrade {PINNED} -> {TARGET}: rc {run.rc}, {took:.0f} s; chat completions sent {traffic.sent}, "
        f"failed {len(traffic.failures)}" + "".join(f"\n  {f}" for f in traffic.failures)
    )
    assert run.rc == 0, run.tail()
    assert cluster_version() == f"v{TARGET}"
    assert set(kubelets().values()) == {f"v{TARGET}"}, kubelets()
    flat = " ".join(run.output.split())
    assert f"{CONTROL_PLANE}: the cluster {PINNED} -> {TARGET}, kubelet {PINNED} -> {TARGET}, Ready" in flat
    for node in NODES[1:]:
        assert f"{node}: kubelet {PINNED} -> {TARGET}, Ready, uncordoned" in flat, run.tail()
    images = kube_system_images()
    for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
        assert f"registry.k8s.io/{component}:v{TARGET}" in images, sorted(images)
    # what kubeadm of the target deploys (its constants.go; tests/lab/images.py built them)
    assert f"registry.k8s.io/etcd:{kubeadm_constant('DefaultEtcdVersion', 'kubernetes-next')}" in images
    assert (
        f"registry.k8s.io/coredns/coredns:{kubeadm_constant('CoreDNSVersion', 'kubernetes-next')}" in images
    )
    for node in NODES:
        versions = sh(
            node,
            "dpkg-query --show --showformat='${Package}=${Version}\\n' kubeadm kubelet kubectl cri-tools",
        )
        assert sorted(versions.split()) == sorted(
            [f"{tool}={NEXT_PACKAGES['versions'][0]}" for tool in ("kubeadm", "kubelet", "kubectl")]
            + [f"cri-tools={NEXT_PACKAGES['cri_tools'][0]}"]
        ), f"{node}: {versions}"
        held = sh(node, "apt-mark showhold").split()
        assert {"kubeadm", "kubelet", "kubectl", "cri-tools"} <= set(held), f"{node}: held {held}"
    assert cordoned() == []
    assert traffic.sent > 0
    assert traffic.failures == [], f"{len(traffic.failures)} of {traffic.sent} requests failed"

    # 3. nothing left to do
    again = upgrade("--check")
    assert again.rc == 0, again.tail()
    assert f"Nothing to do: the control plane and every kubelet run {TARGET}." in " ".join(
        again.output.split()
    )
