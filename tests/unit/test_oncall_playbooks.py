"""playbooks/remediate/ecc-cordon.yml and uncordon.yml run by ansible-playbook against the real control plane
of the production pin (real_kube.py; test_gpu_health_agent.Cluster: its three GPU Nodes, the agents' breaker
Lease) and the fake NVML: every host is local, its Python a wrapper that points the fake NVML at that node's
state file; the control plane's kubernetes.core tasks use kubeadm's super-admin kubeconfig. No kubelet runs:
the pods a drain evicts are made through the API, bound to their node, and real_kube.Kubelets writes what
their kubelet would (Running and Ready; the final delete once evicted); kube-controller-manager's disruption
controller keeps the PodDisruptionBudgets' status, which the API server's eviction judges by. Not the lab
(tests/lab/test_oncall_on_lab.py is)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import fake_nvml_ctl
import pytest
from real_kube import ControlPlane, Kubelets
from test_gpu_health_agent import CORDON, HISTORY, NODES, Cluster, wait

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "playbooks" / "remediate"


class Site:
    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        self.cluster = cluster
        self.tmp = tmp
        self.kubeconfig = cluster.api.admin_kubeconfig
        hosts = {}
        for name in NODES:
            folder = tmp / name
            folder.mkdir()
            (folder / "libnvidia-ml.so.1").write_text(
                f"# lab stand-in\nversion={fake_nvml_ctl.DEFAULT_DRIVER_VERSION}\n"
            )
            python = folder / "python"
            python.write_text(
                "#!/bin/sh\n"
                f"export FAKE_NVML_STATE={folder / 'state.json'}\n"
                f"export FAKE_NVML_LIBRARY={folder / 'libnvidia-ml.so.1'}\n"
                f"export FAKE_NVML_KMSG={folder / 'kmsg'}\n"
                f"export PYTHONPATH={ROOT / 'tests' / 'lab' / 'fake_nvml'}\n"
                f'exec {sys.executable} "$@"\n'
            )
            python.chmod(0o755)
            hosts[name] = {
                "ansible_connection": "local",
                "ansible_python_interpreter": str(python),
                # the node's kernel log is the fake driver's (fake-nvml xid writes it), as in the lab's
                # inventory: never this machine's /dev/kmsg
                "gpu_health_agent_kernel_log": str(folder / "kmsg"),
            }
        self.inventory = tmp / "hosts.json"
        self.inventory.write_text(
            json.dumps(
                {
                    "all": {
                        "children": {
                            "k8s_cluster": {
                                "children": {
                                    "control_plane": {"hosts": {"gpu-node-1": hosts["gpu-node-1"]}},
                                    "workers": {"hosts": {n: hosts[n] for n in ("gpu-node-2", "gpu-node-3")}},
                                }
                            },
                            "gpu_nodes": {"children": {"control_plane": {}, "workers": {}}},
                        }
                    }
                }
            )
        )

    def reset(self) -> None:
        self.cluster.reset()
        for name in NODES:
            state = fake_nvml_ctl.build_state("a100-pcie-40gb-x4", name)
            (self.tmp / name / "state.json").write_text(json.dumps(state))
            (self.tmp / name / "kmsg").write_text("")

    def fault(self, node: str, *args: str) -> None:
        folder = self.tmp / node
        env = {**os.environ, "FAKE_NVML_STATE": str(folder / "state.json")}
        env["FAKE_NVML_LIBRARY"] = str(folder / "libnvidia-ml.so.1")
        env["FAKE_NVML_KMSG"] = str(folder / "kmsg")
        ctl = ROOT / "tests" / "lab" / "fake_nvml" / "fake_nvml_ctl.py"
        subprocess.run([sys.executable, str(ctl), *args], env=env, check=True, capture_output=True)

    def play(self, playbook: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(playbook, *args),
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )

    def env(self) -> dict[str, str]:
        return {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}

    def command(self, playbook: str, *args: str) -> list[str]:
        return [
            str(ROOT / ".venv" / "bin" / "ansible-playbook"),
            "-i",
            str(self.inventory),
            str(PLAYBOOKS / playbook),
            "-e",
            f"admin_kubeconfig={self.kubeconfig}",
            "-e",
            f"kubernetes_api_client_python={sys.executable}",
            *args,
        ]


@pytest.fixture(scope="module")
def site(kube_controllers: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    cluster = Cluster(kube_controllers, tmp_path_factory.mktemp("oncall-api"))
    kubelets = Kubelets(kube_controllers, NODES)
    with kubelets:
        yield Site(cluster, tmp_path_factory.mktemp("oncall-site"))
    cluster.close()
    assert not kubelets.errors, kubelets.errors


@pytest.fixture
def fresh(site: Site) -> Site:
    site.reset()
    return site


VLLM_PODS = "/api/v1/namespaces/default/pods?labelSelector=app%3Dvllm"


def one_replica_with_a_budget(site: Site, image: str) -> None:
    """A model with one replica on gpu-node-2 and a PodDisruptionBudget that keeps it (minAvailable 1), as
    the cluster's controllers and scheduler would leave them: the ReplicaSet, its pod bound to the node
    (Kubelets reports it Running and Ready) and the budget, once the disruption controller counted the pod
    (before that the API server's eviction refuses with "still being processed"; a pod not Running yet it
    evicts past any budget). No ReplicaSet controller runs: nothing replaces an evicted pod (its node is
    cordoned by then anyway)."""
    admin = site.cluster.admin
    template = {
        "metadata": {"labels": {"app": "vllm"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "gpu-node-2"},
            "containers": [{"name": "main", "image": image}],
        },
    }
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "vllm-7c9f5d8b4", "namespace": "default", "labels": {"app": "vllm"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "vllm"}}, "template": template},
    }
    owner = admin.ok("POST", "/apis/apps/v1/namespaces/default/replicasets", replicaset)["metadata"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{owner['name']}-",
            "namespace": "default",
            "labels": template["metadata"]["labels"],
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": owner["name"],
                    "uid": owner["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {**template["spec"], "nodeName": "gpu-node-2"},
    }
    admin.ok("POST", "/api/v1/namespaces/default/pods", pod)
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "vllm", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "vllm"}}},
    }
    admin.ok("POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", pdb)

    def counted() -> bool:
        status = admin.ok("GET", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/vllm").get("status")
        return (status or {}).get("currentHealthy") == 1 and status.get("disruptionsAllowed") == 0

    wait(counted, timeout=30)


def remove_the_replica(site: Site) -> None:
    admin = site.cluster.admin
    admin.request("DELETE", "/apis/apps/v1/namespaces/default/replicasets/vllm-7c9f5d8b4")
    admin.request("DELETE", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/vllm")
    admin.request("DELETE", f"{VLLM_PODS}&gracePeriodSeconds=0")


def recap_changed(out: str) -> dict[str, int]:
    return {
        line.split()[0]: int(line.split("changed=")[1].split()[0])
        for line in out.splitlines()
        if "changed=" in line and "ok=" in line
    }


def test_ecc_cordon_check_then_cordon_then_no_change(fresh: Site) -> None:
    fresh.fault("gpu-node-2", "ecc", "--gpu", "1", "--uncorrectable", "2")
    fresh.fault("gpu-node-3", "ecc", "--gpu", "0", "--corrected", "500")  # corrected alone: nothing
    check = fresh.play("ecc-cordon.yml", "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "would cordon: gpu-node-2" in check.stdout
    assert fresh.cluster.cordoned() == []
    run = fresh.play("ecc-cordon.yml")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "cordoned: gpu-node-2" in run.stdout
    assert fresh.cluster.cordoned() == ["gpu-node-2"]
    annotations = fresh.cluster.node("gpu-node-2")["metadata"]["annotations"]
    record = json.loads(annotations[CORDON])
    assert record["by"] == "ecc-cordon.yml" and record["reasons"] == ["ecc_uncorrectable_volatile"]
    assert record["gpus"][0]["index"] == 1
    assert [e["reason"] for e in fresh.cluster.events("gpu-node-2")] == ["GPUUnhealthyCordoned"]
    again = fresh.play("ecc-cordon.yml")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already cordoned for the same reasons (no change): gpu-node-2" in again.stdout
    assert set(recap_changed(again.stdout).values()) == {0}
    assert len(fresh.cluster.events("gpu-node-2")) == 1


def test_ecc_cordon_breaker_fails_naming_the_node_left_alone(fresh: Site) -> None:
    fresh.fault("gpu-node-2", "ecc", "--gpu", "1", "--uncorrectable", "1")
    fresh.fault("gpu-node-3", "remap", "--gpu", "2", "--failure")
    run = fresh.play("ecc-cordon.yml")
    assert run.returncode != 0
    assert "CIRCUIT BREAKER: unhealthy GPU node(s) NOT cordoned: gpu-node-3 (circuit breaker" in run.stdout
    assert fresh.cluster.cordoned() == ["gpu-node-2"]
    # named on the breaker Lease the agents share, and the Lease given back
    held_back = fresh.cluster.held_back()
    assert list(held_back) == ["gpu-node-3"] and held_back["gpu-node-3"]["by"] == "ecc-cordon.yml"
    assert not fresh.cluster.admin.ok("GET", fresh.cluster.lease_path)["spec"].get("holderIdentity")


def test_ecc_cordon_waits_for_an_agent_holding_the_breaker_lease(fresh: Site) -> None:
    """The playbook decides under the agents' Lease: while an agent holds it, it waits, then sees the
    agent's cordon and holds its own node back instead of cordoning a second one."""
    from ansible.module_utils.gpu_breaker import micro_time
    from ansible.module_utils.gpu_health_agent import now_utc  # the agents' clock (and Python 3.10's)

    admin, path = fresh.cluster.admin, fresh.cluster.lease_path
    lease = admin.ok("GET", path)
    fresh.fault("gpu-node-2", "ecc", "--gpu", "1", "--uncorrectable", "1")
    lease["spec"].update(
        holderIdentity="gpu-node-3", leaseDurationSeconds=60, renewTime=micro_time(now_utc())
    )
    admin.ok("PUT", path, lease)
    proc = subprocess.Popen(
        fresh.command("ecc-cordon.yml"), cwd=ROOT, env=fresh.env(), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("TASK [Take the breaker Lease]"):
            break
    # while the playbook waits, the agent holding the Lease cordons its node and gives the Lease back
    time.sleep(3)
    admin.ok(
        "PATCH", "/api/v1/nodes/gpu-node-3", {"spec": {"unschedulable": True}}, "application/merge-patch+json"
    )
    lease = admin.ok("GET", path)
    lease["spec"]["holderIdentity"] = None
    admin.ok("PUT", path, lease)
    out, _ = proc.communicate(timeout=300)
    run = subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines) + out, "")
    assert run.returncode != 0, run.stdout
    assert "NOT cordoned: gpu-node-2 (circuit breaker: 1 of 3" in run.stdout
    assert fresh.cluster.cordoned() == ["gpu-node-3"]
    assert not admin.ok("GET", path)["spec"].get("holderIdentity")


def test_uncordon_refuses_while_faulty_then_succeeds_and_force_is_recorded(fresh: Site) -> None:
    # a failed row remap (the GPU needs replacing): unhealthy; a pending one is not since issue 20
    # (gpu_health's rules: a reset at the next drain window, the node stays in service): nothing to refuse
    fresh.fault("gpu-node-2", "remap", "--gpu", "0", "--failure")
    assert fresh.play("ecc-cordon.yml").returncode == 0
    assert fresh.cluster.cordoned() == ["gpu-node-2"]
    refused = fresh.play("uncordon.yml", "-e", "node=gpu-node-2")
    assert refused.returncode != 0 and "NOT uncordoning gpu-node-2: refused" in refused.stdout
    assert fresh.cluster.cordoned() == ["gpu-node-2"]
    fresh.fault("gpu-node-2", "reset")
    check = fresh.play("uncordon.yml", "-e", "node=gpu-node-2", "--check")
    assert check.returncode == 0 and "gpu-node-2: would uncordon" in check.stdout
    assert fresh.cluster.cordoned() == ["gpu-node-2"]
    done = fresh.play("uncordon.yml", "-e", "node=gpu-node-2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert fresh.cluster.cordoned() == []
    annotations = fresh.cluster.node("gpu-node-2")["metadata"]["annotations"]
    assert CORDON not in annotations
    assert [h["action"] for h in json.loads(annotations[HISTORY])] == ["cordon", "uncordon"]
    # forced while still faulty: done, and the history says so
    fresh.fault("gpu-node-2", "ecc", "--gpu", "3", "--uncorrectable", "1")
    assert fresh.play("ecc-cordon.yml").returncode == 0
    forced = fresh.play("uncordon.yml", "-e", "node=gpu-node-2", "-e", "force=true")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert fresh.cluster.cordoned() == []
    history = json.loads(fresh.cluster.node("gpu-node-2")["metadata"]["annotations"][HISTORY])
    assert history[-1]["action"] == "force-uncordon" and history[-1]["verdict"] == "unhealthy"


def test_ecc_cordon_drain_respects_pod_disruption_budgets(fresh: Site) -> None:
    admin = fresh.cluster.admin
    one_replica_with_a_budget(fresh, "vllm/vllm-openai:v0.6.3")
    try:

        def running() -> list[str]:
            pods = admin.ok("GET", VLLM_PODS)["items"]
            return [
                p["metadata"]["name"]
                for p in pods
                if p["spec"].get("nodeName") == "gpu-node-2"
                and p.get("status", {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
            ]

        first = wait(running, timeout=30)
        fresh.fault("gpu-node-2", "ecc", "--gpu", "0", "--uncorrectable", "1")
        blocked = fresh.play("ecc-cordon.yml", "-e", "drain=true", "-e", "drain_timeout=5")
        assert blocked.returncode != 0, blocked.stdout
        assert "Drain (evictions respect PodDisruptionBudgets)" in blocked.stdout
        # the run says what is left on the node, which budget holds it, and the choices, none taken for you
        said = " ".join(blocked.stdout.split())
        assert f"still on gpu-node-2 after 5 s: default/{first[0]}" in said, said[-3000:]
        assert "disruption budget" in said, said[-3000:]
        assert f"kubectl -n default delete pod {first[0]}" in said, said[-3000:]
        assert fresh.cluster.cordoned() == ["gpu-node-2"]
        assert running() == first, "the PodDisruptionBudget's only pod was evicted"
        admin.ok("DELETE", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/vllm")
        drained = fresh.play("ecc-cordon.yml", "-e", "drain=true", "-e", "drain_timeout=30")
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert "already cordoned for the same reasons (no change): gpu-node-2" in drained.stdout
        assert running() == []
    finally:
        remove_the_replica(fresh)


def test_a_drain_waits_while_a_budget_refuses_then_evicts(fresh: Site) -> None:
    """kubernetes.core.k8s_drain fails at the first eviction a PodDisruptionBudget refuses (HTTP 429) and
    returns success with a warning when its wait_timeout passes with pods still running: the playbooks try the
    refused eviction again until drain_timeout, as kubectl drain does, and never delete past a budget."""
    admin = fresh.cluster.admin
    one_replica_with_a_budget(fresh, "vllm/vllm-openai:v0.4.2")
    try:

        def on_node() -> list[str]:
            pods = admin.ok("GET", VLLM_PODS)["items"]
            return [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName") == "gpu-node-2"]

        wait(on_node, timeout=30)
        fresh.fault("gpu-node-2", "ecc", "--gpu", "0", "--uncorrectable", "1")
        run = subprocess.Popen(
            fresh.command("ecc-cordon.yml", "-e", "drain=true", "-e", "drain_timeout=120"),
            cwd=ROOT,
            env=fresh.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait(lambda: fresh.cluster.cordoned() == ["gpu-node-2"], timeout=120)
        time.sleep(15)  # at least one refused eviction
        assert run.poll() is None, "the drain gave up at the first eviction the budget refused"
        assert on_node(), "the budget's only pod was evicted"
        admin.ok("DELETE", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/vllm")  # capacity back
        out, _ = run.communicate(timeout=240)
        assert run.returncode == 0, out[-3000:]
        assert wait(lambda: not on_node(), timeout=30)
    finally:
        remove_the_replica(fresh)
