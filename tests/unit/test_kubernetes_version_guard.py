"""playbooks/kubernetes.yml refuses, in its validation play, a kubernetes_version other than the one the
running cluster runs (roles/kubernetes/tasks/check-running-version.yml): raised in the inventory and run
through the stage instead of playbooks/upgrade-kubernetes.yml, it would put the new kubeadm, kubelet and
kubectl on every node at once, kubelets ahead of the API server. Run by ansible-playbook against the real
control plane of the production pin (real_kube.py), as test_upgrade_kubernetes_playbook.py runs
upgrade-kubernetes.yml: gpu-node-1 (the control plane), gpu-node-2 and gpu-node-3 are this machine
(connection local), the versions written as kubeadm and the kubelets write them (ConfigMap
kube-system/kubeadm-config, each Node's status.nodeInfo).

The full stage runs here in --check only, and only where it must stop in its validation play: on this machine
a run that went on would converge it. The other cases run the stage's validation play itself (the first play
of playbooks/kubernetes.yml, copied as it is into a playbook of its own), with and without --check; the lab
runs the whole stage (tests/lab/test_kubernetes_stage_on_lab.py)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from real_kube import ControlPlane, free_port
from test_gpu_health_agent import NODES, Cluster
from test_oncall_playbooks import recap_changed
from test_upgrade_kubernetes_playbook import KUBEADM_CONFIG, RELEASES, UpgradeSite, said

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / "playbooks" / "kubernetes.yml"
VALIDATION_PLAY = "PLAY [Kubernetes - validate every role's values before any change]"


class StageSite(UpgradeSite):
    """The upgrade tests' site (versions written through the API) running the Kubernetes stage, or its
    validation play alone. Every host's node_ip is 127.0.0.1 (an address this machine holds: role
    kubeadm_control_plane checks it); `joining` adds gpu-node-4, a host of the inventory that is no Node
    yet."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        super().__init__(cluster, tmp)
        inventory = json.loads(self.inventory.read_text())
        groups = inventory["all"]["children"]["k8s_cluster"]["children"]
        for group in groups.values():
            for host in group["hosts"].values():
                host["node_ip"] = "127.0.0.1"
        self.inventory.write_text(json.dumps(inventory))
        groups["workers"]["hosts"]["gpu-node-4"] = {**groups["workers"]["hosts"]["gpu-node-3"]}
        self.joining_inventory = tmp / "hosts-joining.json"
        self.joining_inventory.write_text(json.dumps(inventory))
        self.validation = tmp / "kubernetes-validation.yml"
        self.validation.write_text(yaml.safe_dump(yaml.safe_load(STAGE.read_text())[:1], sort_keys=False))
        self.playbook = self.validation

    def command(self, playbook: str, *args: str) -> list[str]:
        command = super().command(playbook, *args)
        command[3] = str(self.playbook)
        return command

    def run(
        self,
        *args: str,
        target: str | None = None,
        stage: bool = False,
        joining: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        values: dict[str, Any] = {
            "kubernetes_releases": RELEASES,
            "__kubernetes_admin_kubeconfig": str(self.kubeconfig),
            # this machine may boot cgroup v1 (role kubernetes_node refuses it otherwise)
            "kubernetes_node_allow_cgroup_v1": True,
            **(extra or {}),
        }
        if target:
            values["kubernetes_version"] = target
        self.playbook = STAGE if stage else self.validation
        inventory = ["-i", str(self.joining_inventory)] if joining else []
        return self.play("kubernetes.yml", "-e", json.dumps(values), *inventory, *args)


@pytest.fixture(scope="module")
def site(kube_controllers: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StageSite]:
    cluster = Cluster(kube_controllers, tmp_path_factory.mktemp("k8s-version-guard-api"))
    made = StageSite(cluster, tmp_path_factory.mktemp("k8s-version-guard-site"))
    yield made
    made.reset()
    cluster.admin.request("DELETE", KUBEADM_CONFIG)
    cluster.close()


@pytest.fixture
def fresh(site: StageSite) -> Iterator[StageSite]:
    site.reset()
    yield site
    site.reset()


def recap_failed(out: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\S+)\s+: ok=\d+.*?failed=(\d+)", out, re.MULTILINE)}


def plays(run: subprocess.CompletedProcess[str]) -> list[str]:
    return re.findall(r"^PLAY \[.*\]", run.stdout, re.MULTILINE)


def results(run: subprocess.CompletedProcess[str], task: str) -> list[str]:
    """The result lines (ok:, fatal:, skipping: ...) of the task whose name starts with TASK."""
    found: list[str] = []
    for block in run.stdout.split("\nTASK [")[1:]:
        if block.startswith(task):
            found += [line for line in block.splitlines() if re.match(r"^(ok|fatal|skipping): ", line)]
    return found


def refused(site: StageSite, run: subprocess.CompletedProcess[str], cluster: str, *expected: str) -> None:
    text = said(run)
    assert run.returncode != 0, text[-3000:]
    for part in expected:
        assert part in text, (part, text[-4000:])
    assert plays(run) == [VALIDATION_PLAY], plays(run)
    # every host fails: none goes on to the stage's next play
    assert {h for h, n in recap_failed(run.stdout).items() if n} == set(NODES), run.stdout[-3000:]
    assert set(recap_changed(run.stdout).values()) == {0}, run.stdout[-3000:]
    assert f"kubernetesVersion: v{cluster}" in site.kubeadm_config()["ClusterConfiguration"]


def test_the_stage_refuses_a_raised_version_in_its_validation_play(fresh: StageSite) -> None:
    """The whole stage, --check: it stops in its validation play, before role kubernetes_node."""
    fresh.versions("1.36.3")
    run = fresh.run("--check", target="1.37.1", stage=True)
    refused(
        fresh, run, "1.36.3",
        "The cluster runs Kubernetes 1.36.3 (its kubelets: gpu-node-1 1.36.3, gpu-node-2 1.36.3,"
        " gpu-node-3 1.36.3); the inventory asks 1.37.1 (kubernetes_version).",
        "run playbooks/upgrade-kubernetes.yml", "or set kubernetes_version back to 1.36.3.",
    )  # fmt: skip


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
@pytest.mark.parametrize(
    ("target", "expected"),
    [
        pytest.param(
            "1.36.4",
            "To move the cluster to 1.36.4, run playbooks/upgrade-kubernetes.yml (--check first;"
            ' docs/runbook.md, "Upgrade Kubernetes one minor"), or set kubernetes_version back to 1.36.3.'
            " Nothing was changed.",
            id="patch",
        ),
        pytest.param(
            "1.36.2",
            "the inventory asks 1.36.2 (kubernetes_version). This stage would put kubeadm, kubelet and"
            " kubectl 1.36.2 on every node at once, whatever the control plane runs. kubeadm does not"
            " downgrade: set kubernetes_version back to 1.36.3.",
            id="downgrade",
        ),
    ],
)
def test_a_version_other_than_the_clusters_is_refused(
    fresh: StageSite, check: bool, target: str, expected: str
) -> None:
    fresh.versions("1.36.3")
    run = fresh.run(*(["--check"] if check else []), target=target)
    refused(fresh, run, "1.36.3", "The cluster runs Kubernetes 1.36.3", expected)


def test_an_upgrade_left_half_way_is_refused_naming_the_kubelets_left(fresh: StageSite) -> None:
    """The control plane on 1.37.1 (the inventory's), gpu-node-3's kubelet still on 1.36.3: the upgrade
    playbook stopped there. The stage would move gpu-node-3's packages without a drain."""
    fresh.versions("1.37.1", {"gpu-node-3": "1.36.3"})
    run = fresh.run(target="1.37.1")
    refused(
        fresh, run, "1.37.1",
        "The control plane runs kubernetes_version 1.37.1, but not every kubelet does: gpu-node-3 1.36.3. An"
        " upgrade left half-way: run playbooks/upgrade-kubernetes.yml again to finish it",
    )  # fmt: skip


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_the_clusters_version_passes_a_joining_node_too(fresh: StageSite, check: bool) -> None:
    """The inventory's version is the cluster's: the validation passes and reads the cluster once, also with
    gpu-node-4 in the inventory, not a Node yet (it joins in this run)."""
    fresh.versions("1.36.3")
    run = fresh.run(*(["--check"] if check else []), target="1.36.3", joining=True)
    assert run.returncode == 0, said(run)[-4000:]
    assert set(recap_changed(run.stdout)) == {*NODES, "gpu-node-4"}, run.stdout[-2000:]
    assert set(recap_changed(run.stdout).values()) == {0}, run.stdout[-3000:]
    # one read of both, on the control plane, for all four hosts
    read = (
        "kubernetes : Read the version the control plane runs (ConfigMap kube-system/kubeadm-config) and each"
    )
    assert results(run, read) == ["ok: [gpu-node-1]"], run.stdout[-4000:]


def test_no_cluster_yet_passes_without_reading_an_api(fresh: StageSite) -> None:
    """A fresh install: no admin kubeconfig on the control plane."""
    run = fresh.run(
        "--check", target="1.37.1", extra={"__kubernetes_admin_kubeconfig": str(fresh.tmp / "absent.conf")}
    )
    assert run.returncode == 0, said(run)[-4000:]
    assert results(run, "kubernetes : Read the version the control plane runs") == ["skipping: [gpu-node-1]"]


def test_a_cluster_whose_api_does_not_answer_is_refused(fresh: StageSite) -> None:
    kubeconfig = yaml.safe_load(Path(fresh.kubeconfig).read_text())
    for entry in kubeconfig["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    down = fresh.tmp / "down.conf"
    down.write_text(yaml.safe_dump(kubeconfig))
    # waited for (a control plane just booted starts its API server first): here one retry, 10 s apart
    run = fresh.run(
        target="1.36.3", extra={"__kubernetes_admin_kubeconfig": str(down), "kubernetes_api_wait_s": 10}
    )
    text = said(run)
    assert run.returncode != 0, text[-3000:]
    assert (
        "Read the version the control plane runs (ConfigMap kube-system/kubeadm-config) and each Node's"
        " kubelet version (1 retries left)" in text
    ), text[-4000:]
    assert f"gpu-node-1 has a cluster ({down}) whose API did not answer within 10 s" in text, text[-4000:]
    assert "bring the API back first" in text, text[-4000:]
    assert "systemctl status kubelet" in text, text[-4000:]


def test_validate_playbook_reports_it(fresh: StageSite) -> None:
    """playbooks/validate.yml runs the same check in its Kubernetes play and lists the refusal with the rest
    (this machine's site values and GPU checks refuse too: only this line is looked at)."""
    fresh.versions("1.36.3")
    fresh.playbook = ROOT / "playbooks" / "validate.yml"
    values = {
        "kubernetes_releases": RELEASES,
        "__kubernetes_admin_kubeconfig": str(fresh.kubeconfig),
        "kubernetes_version": "1.37.1",
    }
    run = fresh.play("validate.yml", "-e", json.dumps(values))
    text = said(run)
    assert run.returncode != 0, text[-3000:]
    said_by = r"refused on ([^:]*): kubernetes: The cluster runs Kubernetes 1\.36\.3 [^;]*; the inventory"
    line = re.search(said_by, text)
    assert line, text[-6000:]
    assert sorted(line[1].split(", ")) == sorted(NODES), line[0]  # one line, every node


def test_the_drift_report_points_at_the_upgrade_playbook() -> None:
    """Role kubeadm_control_plane's drift report (tasks/compare-running-config.yml), which a run of the role
    outside the stage still reaches, says how a version changes: the upgrade playbook, not kubeadm by hand."""
    compare = (ROOT / "roles/kubeadm_control_plane/tasks/compare-running-config.yml").read_text()
    (version,) = [line for line in compare.split("+ ([]") if "kubernetesVersion: the cluster runs" in line]
    assert "playbooks/upgrade-kubernetes.yml" in version, version
    assert "kubernetes_version back to" in version, version
    assert "kubeadm upgrade" not in version, version
