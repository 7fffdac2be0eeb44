"""playbooks/upgrade-driver.yml run by ansible-playbook against the real control plane of the production pin
(real_kube.py; test_gpu_health_agent.Cluster: three GPU Nodes, the breaker Lease) and the fake NVML, as
test_upgrade_kubernetes_playbook.py runs upgrade-kubernetes.yml: gpu-node-1 (the control plane), gpu-node-2
and gpu-node-3 are this machine (connection local), each with its own fake NVML state; the driver each runs is
the fake library's version (and its kernel module's, so NVML answers without a mismatch).

What runs here is everything before a change: each refusal (named variable, nothing changed), --check's plan,
the circuit breaker's limit, the vLLM image's CUDA against the target branch, the no-op. The refusals run with
--check: they come in the first play, before the plan, in a real run as in --check (the playbook has one path
through that play), and a refusal that broke must not let a real run go on to the node play, whose driver role
would change this machine's packages (every host here is local). The upgrade itself
(apt packages of two branches, holds, a reboot) needs root on real nodes and the mirror's packages: the lab's
to prove (docs/runbook.md, "Upgrade the NVIDIA driver branch"; not yet run there).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_kube import ControlPlane, Kubelets
from test_gpu_health_agent import NODES, Cluster
from test_oncall_playbooks import Site, recap_changed
from test_remove_node_playbook import said

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "upgrade-driver.yml"
R535 = {"nvidia_driver_branch": "535", "nvidia_driver_version": "535.183.06"}
R580 = {"nvidia_driver_branch": "580", "nvidia_driver_version": "580.95.05"}
# the tasks that change a node or the cluster; none may run before the plan is accepted
CHANGES = (
    "TASK [Take the breaker Lease",
    "TASK [Cordon, marked as this playbook's",
    "TASK [Drain",
    "TASK [Stop the cluster's own GPU clients",
    "TASK [Install, hold and load the new driver",
    "TASK [nvidia_driver : Pin every package",
    "TASK [nvidia_driver : Install the packages of driver",
    "TASK [nvidia_driver : Remove the packages of another driver branch",
    "TASK [Uncordon the node",
)


class UpgradeSite(Site):
    """The on-call tests' site, running upgrade-driver.yml."""

    def command(self, playbook: str, *args: str) -> list[str]:
        command = super().command(playbook, *args)
        command[3] = str(PLAYBOOK)  # Site's commands name playbooks/remediate/<playbook>
        return command

    def upgrade(self, target: dict[str, object], *args: str) -> subprocess.CompletedProcess[str]:
        return self.play("upgrade-driver.yml", "-e", json.dumps(target), *args)

    def runs(self, node: str, version: str) -> None:
        """NODE runs driver VERSION: the fake library's and its kernel module's version."""
        (self.tmp / node / "libnvidia-ml.so.1").write_text(f"# lab stand-in\nversion={version}\n")
        self.fault(node, "kernel-version", version)

    def drivers(self) -> dict[str, str]:
        return {n: (self.tmp / n / "libnvidia-ml.so.1").read_text() for n in NODES}


@pytest.fixture(scope="module")
def site(kube_controllers: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpgradeSite]:
    cluster = Cluster(kube_controllers, tmp_path_factory.mktemp("upgrade-driver-api"))
    kubelets = Kubelets(kube_controllers, NODES)
    made = UpgradeSite(cluster, tmp_path_factory.mktemp("upgrade-driver-site"))
    with kubelets:
        yield made
        made.reset()
    cluster.close()
    assert not kubelets.errors, kubelets.errors


@pytest.fixture
def fresh(site: UpgradeSite) -> Iterator[UpgradeSite]:
    site.reset()
    for node in NODES:
        site.runs(node, "535.183.06")
    yield site
    site.reset()
    for node in NODES:
        site.runs(node, "535.183.06")


def assert_nothing_changed(
    site: UpgradeSite, run: subprocess.CompletedProcess[str], drivers: dict[str, str], cordoned: list[str]
) -> None:
    assert site.cluster.cordoned() == cordoned, said(run)[-3000:]
    assert site.drivers() == drivers
    for task in CHANGES:
        assert task not in run.stdout, task
    for name in NODES:
        annotations = site.cluster.node(name)["metadata"].get("annotations") or {}
        assert "upgrade-driver.llm-platform.io/cordoned" not in annotations


@pytest.mark.parametrize(
    ("target", "runs", "image", "expected"),
    [
        pytest.param(
            {"nvidia_driver_branch": "570", "nvidia_driver_version": "570.133.20"}, "535.183.06", None,
            "nvidia_driver_branch must be a driver branch this role installs (535, 580",
            id="branch-not-in-the-table",
        ),
        pytest.param(
            {"nvidia_driver_branch": "580", "nvidia_driver_version": "535.216.03"}, "535.183.06", None,
            "nvidia_driver_version must be an upstream driver version of branch nvidia_driver_branch (580)",
            id="version-not-of-the-branch",
        ),
        pytest.param(
            R535, "580.95.05", None,
            "nvidia_driver_version 535.183.06 is older than the driver gpu-node-1 runs (580.95.05, NVML): "
            "a downgrade",
            id="downgrade",
        ),
        pytest.param(
            R535, "535.183.06", "v0.5.0",
            "nvidia_driver_branch: the target branch cannot serve the vLLM image: vllm_serving_image_tag "
            "v0.5.0 needs CUDA 12.4, but driver 535 (vllm_serving_driver_branch) runs CUDA up to 12.2",
            id="image-cuda-newer-than-the-branch",
        ),
    ],
)  # fmt: skip
def test_refuses_naming_the_variable_before_any_change(
    fresh: UpgradeSite, target: dict[str, str], runs: str, image: str | None, expected: str
) -> None:
    for node in NODES:
        fresh.runs(node, runs)
    drivers = fresh.drivers()
    run = fresh.upgrade({**target, **({"vllm_serving_image_tag": image} if image else {})}, "--check")
    assert run.returncode != 0, run.stdout
    assert expected in said(run), said(run)[-3000:]
    assert "TASK [Say the plan]" not in run.stdout
    assert_nothing_changed(fresh, run, drivers, [])


def test_a_downgrade_passes_the_check_when_allowed(fresh: UpgradeSite) -> None:
    for node in NODES:
        fresh.runs(node, "580.95.05")
    run = fresh.upgrade({**R535, "allow_downgrade": True}, "--check")
    assert run.returncode == 0, said(run)[-3000:]
    assert "gpu-node-1 (1 of 3): driver 580.95.05 -> 535.183.06 (branch 580 -> 535)" in said(run)


def test_an_image_the_new_branch_runs_passes_where_the_old_one_refuses(fresh: UpgradeSite) -> None:
    """v0.5.0 (CUDA 12.4) is refused on 535 (above) and planned on 580 (CUDA 13.0): the table's 580 row."""
    run = fresh.upgrade({**R580, "vllm_serving_image_tag": "v0.5.0"}, "--check")
    assert run.returncode == 0, said(run)[-3000:]
    assert "driver 535.183.06 -> 580.95.05" in said(run)


def test_an_image_newer_than_580_runs_is_refused(fresh: UpgradeSite) -> None:
    drivers = fresh.drivers()
    image = {"vllm_serving_image_cuda": {"v9.9.9": "13.1"}, "vllm_serving_image_tag": "v9.9.9"}
    run = fresh.upgrade({**R580, **image}, "--check")
    assert run.returncode != 0, run.stdout
    assert "needs CUDA 13.1, but driver 580 (vllm_serving_driver_branch) runs CUDA up to 13.0" in said(run)
    assert_nothing_changed(fresh, run, drivers, [])


def test_check_prints_the_plan_in_order_and_changes_nothing(fresh: UpgradeSite) -> None:
    drivers = fresh.drivers()
    run = fresh.upgrade(R580, "--check")
    assert run.returncode == 0, said(run)[-3000:]
    text = said(run)
    steps = [
        f"{node} ({i} of 3): driver 535.183.06 -> 580.95.05 (branch 535 -> 580): cordon, drain, stop the "
        "GPU clients of the cluster, install and hold the 580 packages, remove the 535 ones, reboot, verify "
        "through NVML (version, GPUs, GPU settings), check the CUDA of the vLLM image, uncordon"
        for i, node in enumerate(NODES, 1)
    ]
    for step in steps:
        assert step in text, (step, text[-4000:])
    assert [text.index(step) for step in steps] == sorted(text.index(step) for step in steps)
    assert "the breaker allows 1 GPU node(s) out at once; cordoned by others now: none" in text
    assert "Note: R535 is past its end of life (June 2026); R580 is the supported upgrade path" in text
    assert "Check mode: nothing was changed" in text, text[-3000:]
    assert set(recap_changed(run.stdout).values()) == {0}, run.stdout[-3000:]
    assert_nothing_changed(fresh, run, drivers, [])


def test_check_of_a_subset_plans_only_it(fresh: UpgradeSite) -> None:
    run = fresh.upgrade(R580, "--check", "-l", "gpu-node-2")
    assert run.returncode == 0, said(run)[-3000:]
    text = said(run)
    assert "gpu-node-2 (1 of 1): driver 535.183.06 -> 580.95.05" in text, text[-3000:]
    assert "gpu-node-1 (" not in text and "gpu-node-3 (" not in text


def test_check_without_the_reboot_plans_the_module_reload(fresh: UpgradeSite) -> None:
    """The lab's path (nvidia_driver_reboot false, inventories/lab): no reboot, the marker left, the modules
    reloaded; the plan line tests/lab/test_driver_upgrade_on_lab.py expects, word for word."""
    run = fresh.upgrade({**R580, "nvidia_driver_reboot": False}, "--check", "-l", "gpu-node-2")
    assert run.returncode == 0, said(run)[-3000:]
    assert (
        "gpu-node-2 (1 of 1): driver 535.183.06 -> 580.95.05 (branch 535 -> 580): cordon, drain, stop the "
        "GPU clients of the cluster, install and hold the 580 packages, remove the 535 ones, no reboot "
        "(nvidia_driver_reboot is false: /var/run/reboot-required is left; the kernel modules are reloaded "
        "where nothing holds the GPUs), verify through NVML (version, GPUs, GPU settings), check the CUDA of "
        "the vLLM image, uncordon"
    ) in said(run), said(run)[-3000:]


def test_the_breaker_refuses_a_second_node_out_and_a_node_cordoned_before_is_left_cordoned(
    fresh: UpgradeSite,
) -> None:
    """One node of three cordoned by someone else: the breaker's limit (34%: one node) is reached, so the run
    may take out none of the other two; the cordoned node itself may be upgraded (it adds no node out)."""
    fresh.cluster.cordon_by_hand("gpu-node-3")
    drivers = fresh.drivers()
    run = fresh.upgrade(R580, "--check")
    assert run.returncode != 0, run.stdout
    assert "TASK [Say the plan]" not in run.stdout
    text = said(run)
    assert (
        "The cordon circuit breaker (gpu_health_agent_max_cordoned_percent 34: at most 1 GPU node(s)" in text
    )
    for node in ("gpu-node-1", "gpu-node-2"):
        assert (
            f"{node}: circuit breaker: 1 of 3 GPU nodes cordoned already (gpu-node-3), at most 1 may be"
            in text
        ), text[-3000:]
    assert "gpu-node-3: circuit" not in text
    assert_nothing_changed(fresh, run, drivers, ["gpu-node-3"])

    run = fresh.upgrade(R580, "--check", "-l", "gpu-node-3")
    assert run.returncode == 0, said(run)[-3000:]
    assert "gpu-node-3 (1 of 1): driver 535.183.06 -> 580.95.05" in said(run)
    assert "leave cordoned (it was before the run)" in said(run)


def test_a_wider_breaker_lets_the_run_go_on(fresh: UpgradeSite) -> None:
    """The limit is the agents' setting, from its one home: at 67% two nodes of three may be out."""
    fresh.cluster.cordon_by_hand("gpu-node-3")
    run = fresh.upgrade({**R580, "gpu_health_agent_max_cordoned_percent": 67}, "--check")
    assert run.returncode == 0, said(run)[-3000:]
    assert "the breaker allows 2 GPU node(s) out at once; cordoned by others now: gpu-node-3" in said(run)


def test_nothing_to_do_changes_nothing(fresh: UpgradeSite) -> None:
    drivers = fresh.drivers()
    run = fresh.upgrade(R535)
    assert run.returncode == 0, said(run)[-3000:]
    assert "Nothing to do: every node of the run runs its nvidia_driver_version." in said(run)
    assert set(recap_changed(run.stdout).values()) == {0}, run.stdout[-3000:]
    assert_nothing_changed(fresh, run, drivers, [])
