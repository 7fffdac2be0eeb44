"""The GPU health agent (module_utils/gpu_health_agent.py) against the lab's fake NVML and the real Kubernetes
control plane of the production pin (real_kube.py: etcd, kube-apiserver with kubeadm's flags and PKI, and
kube-controller-manager's ServiceAccount token controller, on 127.0.0.1). The three GPU nodes are Node objects
registered through the API as their kubelets would; no kubelet runs (the agent reads and patches Nodes only).

Each agent runs as the role runs it: ``python3 -m ansible.module_utils.gpu_health_agent --config F`` with
PYTHONPATH = a directory holding the module_utils files the role installs (its vars/main.yml list) and the
fake ``pynvml``, ``-S`` so the test venv's real ansible package is not on the path (the node has none);
one process per node, each with its own fake NVML state file; it authenticates with the ServiceAccount
token the role's manifests produce, never a certificate.

Benchmarks (docs/benchmarks.md): ``.venv/bin/python tests/unit/test_gpu_health_agent.py --bench 10`` (an
uncorrectable ECC error to the cordon) and ``... --bench-xid 5`` (an Xid to the agent's action).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "lab" / "fake_nvml"))

import fake_nvml_ctl  # noqa: E402
import real_kube  # noqa: E402
from real_kube import ControlPlane, free_port  # noqa: E402

ROLE = ROOT / "roles" / "gpu_health_agent"
GPU_LABEL = {"nvidia.com/gpu.present": "true"}
NODES = {f"gpu-node-{i}": {"gpus": 4, "ip": f"10.89.42.1{i}", "labels": GPU_LABEL} for i in (1, 2, 3)}
CORDON = "gpu-health.llm-platform.io/cordon"
HISTORY = "gpu-health.llm-platform.io/history"
HELD_BACK = "gpu-health.llm-platform.io/held-back"
NOTICE = "gpu-health.llm-platform.io/notice"


def role_vars() -> dict[str, Any]:
    values = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    values.update(yaml.safe_load((ROLE / "vars" / "main.yml").read_text()))
    return values


def rendered_manifests() -> list[dict[str, Any]]:
    """The role's RBAC template rendered with the role's defaults."""
    text = jinja2.Template((ROLE / "templates" / "gpu-health-agent-rbac.yaml.j2").read_text()).render(
        role_vars()
    )
    return [doc for doc in yaml.safe_load_all(text) if doc]


def api_path(obj: dict[str, Any], named: bool = False) -> str:
    group_version = obj["apiVersion"]
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    plural = {
        "Namespace": "namespaces",
        "ServiceAccount": "serviceaccounts",
        "Secret": "secrets",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "Role": "roles",
        "RoleBinding": "rolebindings",
        "Lease": "leases",
    }[obj["kind"]]
    ns = obj["metadata"].get("namespace")
    path = f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"
    return f"{path}/{obj['metadata']['name']}" if named else path


class Cluster:
    """The control plane, three registered GPU nodes, the role's objects, the agent's token, and agents."""

    def __init__(self, api: ControlPlane, tmp: Path) -> None:
        self.tmp = tmp
        self.api = api
        self.admin = api.admin
        for name, node in NODES.items():
            api.register_node(name, node["labels"], node["ip"], node["gpus"])
        for obj in rendered_manifests():
            # made by an earlier Cluster of this session's control plane (another test module, or this one
            # again after a test of another module ran on this xdist worker): kept, as close() keeps them
            code, out = self.admin.request("POST", api_path(obj), obj)
            assert code < 300 or code == 409, f"POST {api_path(obj)} -> {code}: {out}"
        v = role_vars()
        self.namespace = v["gpu_health_agent_namespace"]
        self.lease_path = api_path(next(o for o in rendered_manifests() if o["kind"] == "Lease"), named=True)
        secret_path = f"/api/v1/namespaces/{self.namespace}/secrets/{v['__gpu_health_agent_name']}-token"
        self.token = base64.b64decode(
            wait(lambda: self.admin.ok("GET", secret_path).get("data", {}).get("token"))
        ).decode()
        self.token_file = tmp / "token"
        self.token_file.write_text(self.token)
        self.agent_client = api.client(self.token)
        self.lib = tmp / "lib"
        code = self.lib / "ansible" / "module_utils"
        code.mkdir(parents=True)
        for name in v["__gpu_health_agent_module_utils"]:
            shutil.copy(ROOT / "module_utils" / name, code / name)
        self.agents: dict[str, Agent] = {}

    def reset(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        self.agents.clear()
        for name in NODES:
            node = self.node(name)
            annotations = node["metadata"].get("annotations") or {}
            patch: dict[str, Any] = {"spec": {"unschedulable": None}}
            drop = {k: None for k in annotations if k.startswith("gpu-health.llm-platform.io/")}
            if drop:
                patch["metadata"] = {"annotations": drop}
            self.admin.ok("PATCH", f"/api/v1/nodes/{name}", patch, "application/merge-patch+json")
        self.admin.ok("DELETE", "/api/v1/namespaces/default/events")
        lease = self.admin.ok("GET", self.lease_path)
        (lease["metadata"].get("annotations") or {}).pop(HELD_BACK, None)
        lease["spec"]["holderIdentity"] = None
        self.admin.ok("PUT", self.lease_path, lease)

    def node(self, name: str) -> dict[str, Any]:
        return self.admin.ok("GET", f"/api/v1/nodes/{name}")

    def cordon_by_hand(self, node: str) -> None:
        """As an operator's `kubectl cordon`: unschedulable, no annotation of the agents or a playbook."""
        patch = "application/merge-patch+json"
        self.admin.ok("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}}, patch)

    def cordon_by_agent(self, node: str) -> None:
        """As the GPU health agent cordons a node whose GPU needs a reset: unschedulable, with the agents'
        cordon record and history entry (module_utils/gpu_breaker.py: CORDON_ANNOTATION, cordon_record),
        written as its cordon() writes them, without running an agent."""
        # here, not at the top: this file also runs as a script (--bench), where module_utils is no package
        from ansible.module_utils.gpu_breaker import (
            CORDON_ANNOTATION,
            HISTORY_ANNOTATION,
            cordon_record,
            history_with,
        )

        gpu = {
            "index": 0,
            "uuid": f"GPU-{node}-0",
            "verdict": "unhealthy",
            "reasons": ["ecc_uncorrectable_volatile"],
        }
        health = {"verdict": "unhealthy", "gpus": [gpu], "action": "reset", "playbook": "gpu-reset.yml"}
        record = cordon_record("gpu-health-agent", health, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        annotations = {
            CORDON_ANNOTATION: json.dumps(record, sort_keys=True),
            HISTORY_ANNOTATION: history_with(None, "cordon", record),
        }
        patch = {"metadata": {"annotations": annotations}, "spec": {"unschedulable": True}}
        self.admin.ok("PATCH", f"/api/v1/nodes/{node}", patch, "application/merge-patch+json")

    def cordoned(self) -> list[str]:
        return sorted(n for n in NODES if self.node(n).get("spec", {}).get("unschedulable"))

    def events(self, node: str) -> list[dict[str, Any]]:
        items = self.admin.ok("GET", "/api/v1/namespaces/default/events")["items"]
        return [e for e in items if e.get("involvedObject", {}).get("name") == node]

    def held_back(self) -> dict[str, Any]:
        """The breaker Lease's held-back annotation: node -> {why, by, time}."""
        annotations = self.admin.ok("GET", self.lease_path)["metadata"].get("annotations") or {}
        return json.loads(annotations.get(HELD_BACK) or "{}")

    def start_agent(self, name: str, poll_interval: float = 1) -> Agent:
        agent = Agent(self, name, poll_interval)
        self.agents[name] = agent
        return agent

    def close(self) -> None:
        """Agents stopped, the Nodes deleted; the role's objects stay with the session's control plane."""
        self.reset()
        for name in NODES:
            self.admin.ok("DELETE", f"/api/v1/nodes/{name}")


class Agent:
    """One node: its fake NVML state and the agent process as the role's unit runs it."""

    def __init__(self, cluster: Cluster, name: str, poll_interval: float) -> None:
        self.name = name
        folder = cluster.tmp / name
        folder.mkdir(exist_ok=True)
        self.state = folder / "state.json"
        self.library = folder / "libnvidia-ml.so.1"
        self.kmsg = folder / "kmsg"  # the node's kernel log (fake-nvml xid writes it)
        self.kmsg.unlink(missing_ok=True)
        shutil.rmtree(folder / "agent-state", ignore_errors=True)
        self.library.write_text(f"# lab stand-in\nversion={fake_nvml_ctl.DEFAULT_DRIVER_VERSION}\n")
        self.state.write_text(json.dumps(fake_nvml_ctl.build_state("a100-pcie-40gb-x4", name)))
        self.port = free_port()
        config = {
            "node_name": name,
            "api_server": cluster.api.url,
            "ca_file": str(cluster.api.ca),
            "token_file": str(cluster.token_file),
            "lease_namespace": cluster.namespace,
            "lease_name": role_vars()["__gpu_health_agent_lease"],
            "gpu_node_selector": "nvidia.com/gpu.present=true",
            "poll_interval": poll_interval,
            "corrected_errors_threshold": 1000,
            "metrics_address": "127.0.0.1",
            "metrics_port": self.port,
            "kernel_log": str(self.kmsg),
            "state_dir": str(folder / "agent-state"),
        }
        self.config = folder / "config.json"
        self.config.write_text(json.dumps(config))
        self.env = {
            **os.environ,
            "PYTHONPATH": f"{cluster.lib}{os.pathsep}{ROOT / 'tests' / 'lab' / 'fake_nvml'}",
            "FAKE_NVML_STATE": str(self.state),
            "FAKE_NVML_LIBRARY": str(self.library),
            "FAKE_NVML_KMSG": str(self.kmsg),
        }
        self.log = folder / "agent.log"
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-S",
                    "-m",
                    "ansible.module_utils.gpu_health_agent",
                    "--config",
                    str(self.config),
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait(
            lambda: self.metrics() is not None and "gpu_health_agent_polls_total 0" not in self.metrics(), 15
        )

    def fault(self, *args: str) -> None:
        """fake-nvml (scripts/lab-fault's GPU faults) on this node's state and kernel log."""
        env = {
            **os.environ,
            "FAKE_NVML_STATE": str(self.state),
            "FAKE_NVML_LIBRARY": str(self.library),
            "FAKE_NVML_KMSG": str(self.kmsg),
        }
        subprocess.run(
            [sys.executable, str(ROOT / "tests" / "lab" / "fake_nvml" / "fake_nvml_ctl.py"), *args],
            env=env,
            check=True,
            capture_output=True,
        )

    def metrics(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as response:
                return response.read().decode()
        except OSError:
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)


def wait(what: Callable[[], Any], timeout: float = 30, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(step)


@pytest.fixture(scope="module")
def cluster(kube_controllers: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    made = Cluster(kube_controllers, tmp_path_factory.mktemp("gha"))
    yield made
    made.close()


@pytest.fixture
def agents(cluster: Cluster) -> Iterator[dict[str, Agent]]:
    cluster.reset()
    for name in NODES:
        cluster.start_agent(name)
    yield cluster.agents
    for name, agent in cluster.agents.items():
        print(f"--- {name} agent log\n{agent.log.read_text()}")
    cluster.reset()


# ------------------------------------------------------------------------------------------------ tests


def test_uncorrectable_ecc_cordons_within_30s_with_reason_annotated(
    cluster: Cluster, agents: dict[str, Agent]
) -> None:
    started = time.monotonic()
    agents["gpu-node-2"].fault("ecc", "--gpu", "1", "--uncorrectable", "1")
    wait(lambda: cluster.cordoned() == ["gpu-node-2"], timeout=30)
    elapsed = time.monotonic() - started
    assert elapsed < 30
    annotations = cluster.node("gpu-node-2")["metadata"]["annotations"]
    record = json.loads(annotations[CORDON])
    assert record["by"] == "gpu-health-agent"
    assert record["reasons"] == ["ecc_uncorrectable_volatile"]
    assert record["gpus"][0]["index"] == 1 and record["gpus"][0]["uuid"].startswith("GPU-")
    assert record["time"].endswith("Z")
    assert json.loads(annotations[HISTORY])[-1]["action"] == "cordon"
    assert record["message"] == "GPU 1: ecc_uncorrectable_volatile"
    # no Xid in the kernel log says it was contained: treated as uncontained, a GPU reset
    assert (record["gpu_action"], record["playbook"]) == ("reset_gpu", "playbooks/remediate/gpu-reset.yml")
    # the event follows the cordon's patch
    assert [e["reason"] for e in wait(lambda: cluster.events("gpu-node-2"))] == ["GPUResetNeeded"]
    assert cluster.held_back() == {}
    metrics = agents["gpu-node-2"].metrics() or ""
    assert 'gpu_health_agent_gpu_reason{gpu="1",reason="ecc_uncorrectable_volatile"} 1' in metrics
    assert 'gpu_health_agent_node_verdict{node="gpu-node-2",verdict="unhealthy"} 1' in metrics
    assert 'gpu_health_agent_cordoned{node="gpu-node-2"} 1' in metrics
    # the others stay in service, and the agent never uncordons, even once the fault is gone
    agents["gpu-node-2"].fault("reset")
    wait(lambda: 'verdict="healthy"} 1' in (agents["gpu-node-2"].metrics() or ""))
    time.sleep(2.5)
    assert cluster.cordoned() == ["gpu-node-2"]
    assert len(json.loads(cluster.node("gpu-node-2")["metadata"]["annotations"][HISTORY])) == 1


def test_corrected_errors_alone_cordon_nothing(cluster: Cluster, agents: dict[str, Agent]) -> None:
    agents["gpu-node-1"].fault("ecc", "--gpu", "0", "--corrected", "999")  # below the threshold
    agents["gpu-node-3"].fault("ecc", "--gpu", "2", "--corrected", "5000")  # above: degraded, not unhealthy
    agents["gpu-node-2"].fault("ecc", "--gpu", "3", "--uncorrectable", "4", "--aggregate")  # history
    wait(lambda: 'reason="ecc_corrected_over_threshold"} 1' in (agents["gpu-node-3"].metrics() or ""))
    time.sleep(3)  # three more polls each
    assert cluster.cordoned() == []
    assert 'verdict="healthy"} 1' in (agents["gpu-node-1"].metrics() or "")
    assert 'gpu_health_agent_node_verdict{node="gpu-node-3",verdict="degraded"} 1' in (
        agents["gpu-node-3"].metrics() or ""
    )
    assert 'gpu_health_agent_node_verdict{node="gpu-node-2",verdict="healthy"} 1' in (
        agents["gpu-node-2"].metrics() or ""
    )
    assert all(not cluster.events(n) for n in NODES)


def test_two_faulty_nodes_exactly_one_cordoned_the_breaker_names_the_other(
    cluster: Cluster, agents: dict[str, Agent]
) -> None:
    agents["gpu-node-2"].fault("xid", "--gpu", "0", "--xid", "95")
    agents["gpu-node-3"].fault("xid", "--gpu", "1", "--xid", "79")
    cordoned = wait(lambda: cluster.cordoned(), timeout=30)
    assert len(cordoned) == 1
    other = "gpu-node-3" if cordoned == ["gpu-node-2"] else "gpu-node-2"
    held = f'gpu_health_agent_breaker_held_back{{node="{other}",why="circuit breaker: 1 of 3 GPU nodes'
    wait(lambda: held in (agents[other].metrics() or ""), timeout=15)
    time.sleep(3)
    assert cluster.cordoned() == cordoned
    held_back = cluster.held_back()
    assert list(held_back) == [other] and held_back[other]["why"].startswith("circuit breaker: 1 of 3")
    assert held_back[other]["by"] == "gpu-health-agent"
    assert 'gpu_health_agent_breaker_held_back{node="gpu-node-1",why=""} 0' in (
        agents["gpu-node-1"].metrics() or ""
    )
    lease = cluster.admin.ok("GET", cluster.lease_path)
    assert not lease["spec"].get("holderIdentity"), "an agent kept the breaker Lease"
    # healthy again: the held-back node takes its name off the Lease (and nothing is uncordoned)
    agents[other].fault("reset")
    wait(lambda: cluster.held_back() == {}, timeout=15)
    assert cluster.cordoned() == cordoned


def test_agent_token_rbac_on_the_api(cluster: Cluster) -> None:
    """The role's ServiceAccount, through the API server's RBAC: exactly what the agent needs."""
    sa = cluster.agent_client
    ns = cluster.namespace
    assert sa.request("GET", "/api/v1/nodes/gpu-node-2")[0] == 200
    assert sa.request("GET", "/api/v1/nodes?labelSelector=nvidia.com%2Fgpu.present%3Dtrue")[0] == 200
    patch = {"metadata": {"annotations": {"rbac-test": "1"}}}
    assert (
        sa.request(
            "PATCH", "/api/v1/nodes/gpu-node-3", json.dumps(patch).encode(), "application/merge-patch+json"
        )[0]
        == 200
    )
    lease = sa.ok("GET", cluster.lease_path)
    assert sa.request("PUT", cluster.lease_path, lease)[0] == 200
    event = {
        "metadata": {"generateName": "x-"},
        "involvedObject": {"kind": "Node", "name": "gpu-node-3"},
        "reason": "Test",
        "message": "m",
    }
    # Node events in default (the notices and the cordons), nowhere else
    code, _ = sa.request("POST", "/api/v1/namespaces/default/events", json.dumps(event).encode())
    assert code == 201
    other_lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "someone-else", "namespace": ns},
        "spec": {},
    }
    cluster.admin.ok("POST", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", other_lease)
    forbidden = [
        ("GET", f"/api/v1/namespaces/{ns}/secrets", None),
        ("GET", "/api/v1/namespaces/kube-system/secrets", None),
        ("GET", f"/api/v1/namespaces/{ns}/secrets/gpu-health-agent-token", None),
        ("DELETE", "/api/v1/namespaces/default/pods/anything", None),
        ("POST", "/api/v1/namespaces/default/pods/anything/eviction", {"metadata": {"name": "anything"}}),
        ("DELETE", "/api/v1/nodes/gpu-node-3", None),
        ("POST", "/api/v1/nodes", {"metadata": {"name": "rogue"}}),
        ("PUT", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/someone-else", other_lease),
        ("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/someone-else", None),
        ("DELETE", cluster.lease_path, None),
        ("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/gpu-node-1", None),
        ("POST", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", other_lease),
        ("POST", "/api/v1/namespaces/kube-system/events", event),
        ("PATCH", "/api/v1/namespaces/default/events/anything", {"count": 2}),
        ("DELETE", "/api/v1/namespaces/default/events/anything", None),
        ("GET", "/api/v1/namespaces/default/events", None),
        ("PATCH", "/api/v1/nodes/gpu-node-3/status", {"status": {}}),
    ]
    for method, path, body in forbidden:
        data = json.dumps(body).encode() if body is not None else None
        ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
        code, _ = sa.request(method, path, data, ctype)
        assert code == 403, f"the agent's token may {method} {path} ({code})"


def test_rendered_rbac_is_least_privilege() -> None:
    docs = rendered_manifests()
    rules = {
        (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")): d["rules"]
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
    }
    assert rules == {
        ("ClusterRole", "gpu-health-agent", None): [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}
        ],
        ("Role", "gpu-health-agent-lease", "gpu-health"): [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": ["gpu-health-breaker"],
                "verbs": ["get", "update"],
            }
        ],
        ("Role", "gpu-health-agent-events", "default"): [
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
        ],
    }
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert len(bindings) == 3
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "gpu-health-agent", "namespace": "gpu-health"}
        ]
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in {
            (kind, name) for kind, name, _ in rules
        }
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    from ansible.module_utils.gpu_health_agent import EVENTS_NAMESPACE

    assert role_vars()["__gpu_health_agent_events_namespace"] == EVENTS_NAMESPACE


def test_installed_module_utils_are_the_agents_imports() -> None:
    """The role installs exactly the module_utils files the agent imports, transitively."""
    import ast

    wanted, todo = set(), ["gpu_health_agent.py"]
    while todo:
        name = todo.pop()
        wanted.add(name)
        tree = ast.parse((ROOT / "module_utils" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ansible.module_utils."):
                dep = node.module.rsplit(".", 1)[1] + ".py"
                if (ROOT / "module_utils" / dep).exists() and dep not in wanted:
                    todo.append(dep)
    assert set(role_vars()["__gpu_health_agent_module_utils"]) == wanted


# --------------------------------------------------------------------------------------------- benchmark


def bench(runs: int) -> None:
    """Time from the fault written to the node's cordon visible in the API, agents at the role's default
    poll interval."""
    import tempfile

    poll = float(role_vars()["gpu_health_agent_poll_interval"])
    with tempfile.TemporaryDirectory() as tmp, real_kube.control_plane(Path(tmp) / "kube") as api:
        api.start_controllers()
        cluster = Cluster(api, Path(tmp))
        try:
            samples = []
            for _ in range(runs):
                cluster.reset()
                agent = cluster.start_agent("gpu-node-2", poll_interval=poll)
                time.sleep(poll * 0.37 + (len(samples) % 5) * poll / 5)  # faults land anywhere in a poll
                started = time.monotonic()
                agent.fault("ecc", "--gpu", "1", "--uncorrectable", "1")
                wait(lambda: cluster.cordoned() == ["gpu-node-2"], timeout=30, step=0.02)
                samples.append(time.monotonic() - started)
            cluster.reset()
        finally:
            cluster.close()
    print(
        f"poll interval {poll:g} s, {runs} runs: fault -> cordon seconds "
        f"median {statistics.median(samples):.2f}, min {min(samples):.2f}, max {max(samples):.2f}"
    )
    print("samples:", " ".join(f"{s:.2f}" for s in samples))


def bench_xid(runs: int) -> None:
    """Time from an Xid written by the fake driver (its kernel-log record and NVML event) to the agent's
    action in the API: Xid 95 -> the cordon; Xids 48, 63, 94 in one burst -> the notice annotation."""
    import tempfile

    poll = float(role_vars()["gpu_health_agent_poll_interval"])
    cases = {
        "xid 95 -> cordon": (["95"], "cordon"),
        "xid 48, 63, 94 -> notice": (["48", "63", "94"], "notice"),
    }
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, real_kube.control_plane(Path(tmp) / "kube") as api:
        api.start_controllers()
        cluster = Cluster(api, Path(tmp))
        try:
            for name, (xids, action) in cases.items():
                samples = results.setdefault(name, [])
                for _ in range(runs):
                    cluster.reset()
                    agent = cluster.start_agent("gpu-node-2", poll_interval=poll)
                    time.sleep(poll * 0.37 + (len(samples) % 5) * poll / 5)  # anywhere in a poll
                    started = time.monotonic()
                    agent.fault("xid", "--gpu", "1", *[arg for x in xids for arg in ("--xid", x)])

                    def done(action: str = action) -> bool:
                        node = cluster.node("gpu-node-2")
                        if action == "cordon":
                            return bool(node["spec"].get("unschedulable"))
                        return NOTICE in (node["metadata"].get("annotations") or {})

                    wait(done, timeout=30, step=0.02)
                    samples.append(time.monotonic() - started)
                    assert action == "cordon" or not cluster.cordoned(), "a contained error was cordoned"
            cluster.reset()
        finally:
            cluster.close()
    for name, samples in results.items():
        print(
            f"poll interval {poll:g} s, {name}, {runs} runs: seconds median "
            f"{statistics.median(samples):.2f}, min {min(samples):.2f}, max {max(samples):.2f}; "
            f"samples {' '.join(f'{s:.2f}' for s in samples)}"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--bench-xid":
        bench_xid(int(sys.argv[2]) if len(sys.argv) > 2 else 5)
    else:
        bench(int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "--bench" else 10)


# ------------------------------------------------------------------------------------------- NVML events


class EventfulNvml:
    """The fake pynvml plus the event API of nvidia-ml-py (the fake has none): one queued event."""

    def __init__(self, supported: int) -> None:
        import pynvml

        self.fake = pynvml
        self.supported = supported
        self.registered: list[int] = []
        self.queue: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self.supported

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: Any) -> None:
        self.registered.append(types)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        if self.queue:
            return self.queue.pop()
        raise self.fake.NVMLError(10)  # NVML_ERROR_TIMEOUT

    def nvmlEventSetFree(self, event_set: Any) -> None:
        pass


def test_nvml_events_wake_the_agent_where_supported(pcie_node: Any) -> None:
    import threading
    import types

    import pynvml
    from ansible.module_utils.gpu_health_agent import NvmlEvents

    stop = threading.Event()
    nvml = EventfulNvml(supported=0x2 | 0x8 | 0x1)
    events = NvmlEvents(nvml)  # type: ignore[arg-type]
    events.open()
    assert events.supported and nvml.registered == [0x2 | 0x8] * pcie_node.gpu_count
    nvml.queue.append(types.SimpleNamespace(eventType=0x8, eventData=79))
    assert events.wait(5, stop) == "NVML event type 8 data 79"
    started = time.monotonic()
    assert events.wait(0.05, stop) is None  # a timeout is no event
    assert time.monotonic() - started < 1
    events.close()
    assert pynvml._nvmlLib_refcount == 0
    # GPUs that support neither event: polling only
    none = NvmlEvents(EventfulNvml(supported=0x1))  # type: ignore[arg-type]
    none.open()
    assert not none.supported and pynvml._nvmlLib_refcount == 0
    # the lab's fake has nvidia-ml-py's event API: an Xid fake-nvml injects wakes the agent
    plain = NvmlEvents(pynvml)
    plain.open()
    assert plain.supported
    started = time.monotonic()
    assert plain.wait(0.2, stop) is None and time.monotonic() - started >= 0.2
    pcie_node.ctl("xid", "--gpu", "2", "--xid", "95")
    assert plain.wait(5, stop) == "NVML event type 8 data 95"
    plain.close()
    assert pynvml._nvmlLib_refcount == 0


def test_breaker_lease_waits_for_a_live_holder_and_takes_an_expired_one(cluster: Cluster) -> None:
    from ansible.module_utils.gpu_breaker import micro_time
    from ansible.module_utils.gpu_health_agent import BreakerLease, KubeApi, now_utc

    api = KubeApi(cluster.api.url, str(cluster.api.ca), str(cluster.token_file))
    lease_name = role_vars()["__gpu_health_agent_lease"]
    mine = BreakerLease(api, cluster.namespace, lease_name, "gpu-node-3", 15)

    def held_by(holder: str, seconds_ago: float) -> None:
        lease = cluster.admin.ok("GET", cluster.lease_path)
        renewed = micro_time(now_utc() - dt.timedelta(seconds=seconds_ago))
        lease["spec"].update(holderIdentity=holder, renewTime=renewed, leaseDurationSeconds=15)
        cluster.admin.ok("PUT", cluster.lease_path, lease)

    held_by("gpu-node-1", 1)
    assert mine.acquire() is False  # a live holder: wait for the next poll
    held_by("gpu-node-1", 60)  # its agent died holding it: expired after 15 s
    assert mine.acquire() is True
    assert cluster.admin.ok("GET", cluster.lease_path)["spec"]["holderIdentity"] == "gpu-node-3"
    other = BreakerLease(api, cluster.namespace, lease_name, "gpu-node-2", 15)
    assert other.acquire() is False
    mine.release()
    assert not cluster.admin.ok("GET", cluster.lease_path)["spec"].get("holderIdentity")
    assert other.acquire() is True
    other.release()


def test_bad_settings_are_refused_naming_them(tmp_path: Path) -> None:
    from ansible.module_utils.gpu_health_agent import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"node_name": "n", "api_server": "https://x:6443", "surprise": 1}))
    assert main(["--config", str(config)]) == 2
    config.write_text(json.dumps({"node_name": "n", "api_server": "https://x:6443"}))
    assert main(["--config", str(config)]) == 2
    good = {
        "node_name": "n",
        "api_server": "http://x:6443",
        "ca_file": "/nonexistent",
        "token_file": "t",
        "lease_namespace": "gpu-health",
        "lease_name": "gpu-health-breaker",
    }
    config.write_text(json.dumps(good))
    assert main(["--config", str(config)]) == 2  # not https


# -------------------------------------------------------------------------------------- Xids (issue 20)


def test_a_contained_error_keeps_the_node_and_writes_an_event(
    cluster: Cluster, agents: dict[str, Agent]
) -> None:
    agent = agents["gpu-node-2"]
    # what the driver logs for a double-bit error contained to one process, in one burst
    agent.fault("xid", "--gpu", "1", "--xid", "48", "--xid", "63", "--xid", "94")
    events = wait(lambda: cluster.events("gpu-node-2"), timeout=30)
    time.sleep(3)  # more polls: no cordon follows, no second event
    assert cluster.cordoned() == []
    assert (
        [e["reason"] for e in cluster.events("gpu-node-2")]
        == ["GPUResetAtNextDrain"]
        == [e["reason"] for e in events]
    )
    assert "Xid 94" in events[0]["message"] and events[0]["involvedObject"]["kind"] == "Node"
    # the annotation follows the event
    notice = json.loads(
        wait(lambda: (cluster.node("gpu-node-2")["metadata"].get("annotations") or {}).get(NOTICE))
    )
    assert notice["gpu_action"] == "reset_at_drain_window" and notice["by"] == "gpu-health-agent"
    assert notice["gpus"][0]["index"] == 1 and "xid_94" in notice["gpus"][0]["reasons"]
    metrics = agent.metrics() or ""
    assert 'gpu_health_agent_node_action{node="gpu-node-2",action="reset_at_drain_window"} 1' in metrics
    assert 'gpu_health_agent_xids_total{xid="94"} 1' in metrics
    # a restart does not repeat the notice; a new Xid makes a new one
    agent.stop()
    agent.start()
    time.sleep(3)
    assert len(cluster.events("gpu-node-2")) == 1
    agent.fault("xid", "--gpu", "3", "--xid", "94")
    wait(lambda: len(cluster.events("gpu-node-2")) == 2, timeout=30)
    assert cluster.cordoned() == []


def test_an_uncontained_error_cordons_for_a_reset(cluster: Cluster, agents: dict[str, Agent]) -> None:
    agents["gpu-node-3"].fault("xid", "--gpu", "0", "--xid", "95")
    wait(lambda: cluster.cordoned() == ["gpu-node-3"], timeout=30)
    record = json.loads(cluster.node("gpu-node-3")["metadata"]["annotations"][CORDON])
    assert record["gpu_action"] == "reset_gpu" and "xid_95" in record["reasons"]
    assert record["playbook"] == "playbooks/remediate/gpu-reset.yml"


def test_fallen_off_the_bus_cordons_for_a_reboot(cluster: Cluster, agents: dict[str, Agent]) -> None:
    agents["gpu-node-1"].fault("xid", "--gpu", "2", "--xid", "79")
    wait(lambda: cluster.cordoned() == ["gpu-node-1"], timeout=30)
    record = json.loads(cluster.node("gpu-node-1")["metadata"]["annotations"][CORDON])
    assert (record["gpu_action"], record["playbook"]) == (
        "reboot_node",
        "playbooks/remediate/node-reboot.yml",
    )
    assert [e["reason"] for e in wait(lambda: cluster.events("gpu-node-1"))] == ["GPUNodeRebootNeeded"]
    assert (
        "GPU has fallen off the bus" in agents["gpu-node-1"].log.read_text()
    )  # the reason in the node's log


def test_application_xids_do_nothing(cluster: Cluster, agents: dict[str, Agent]) -> None:
    for xid in ("13", "31", "43"):
        agents["gpu-node-2"].fault("xid", "--gpu", "0", "--xid", xid, "--pid", "4242", "--name", "vllm")
    wait(lambda: 'gpu_health_agent_xids_total{xid="43"} 1' in (agents["gpu-node-2"].metrics() or ""))
    time.sleep(3)
    assert cluster.cordoned() == [] and cluster.events("gpu-node-2") == []
    assert NOTICE not in (cluster.node("gpu-node-2")["metadata"].get("annotations") or {})
    assert 'action="none"} 1' in (agents["gpu-node-2"].metrics() or "")


def test_a_pending_remap_is_a_notice_not_a_cordon(cluster: Cluster, agents: dict[str, Agent]) -> None:
    agents["gpu-node-3"].fault("remap", "--gpu", "2", "--pending")
    wait(lambda: cluster.events("gpu-node-3"), timeout=30)
    time.sleep(2)
    assert cluster.cordoned() == []
    assert [e["reason"] for e in cluster.events("gpu-node-3")] == ["GPUResetAtNextDrain"]


def test_the_notice_goes_once_a_reset_cleared_the_gpu(
    cluster: Cluster, pcie_node: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: the agent's poll after a GPU reset (gpu_reset clears the GPU's Xids) removes its notice."""
    import pynvml
    from ansible.module_utils import gpu_kernel_log
    from ansible.module_utils.gpu_health_agent import Agent as AgentCode
    from ansible.module_utils.gpu_health_agent import Config, KubeApi

    cluster.reset()
    monkeypatch.setattr(gpu_kernel_log, "CLEARED_FILE", str(tmp_path / "cleared.json"))
    config = Config(
        node_name="gpu-node-1",
        api_server=cluster.api.url,
        ca_file=str(cluster.api.ca),
        token_file=str(cluster.token_file),
        lease_namespace=cluster.namespace,
        lease_name=role_vars()["__gpu_health_agent_lease"],
        gpu_node_selector="nvidia.com/gpu.present=true",
        kernel_log=str(pcie_node.kmsg_path),
        state_dir=str(tmp_path / "state"),
    )
    agent = AgentCode(config, pynvml, KubeApi(config.api_server, config.ca_file, config.token_file))
    pcie_node.ctl("xid", "--gpu", "1", "--xid", "94")
    agent.poll()
    assert NOTICE in cluster.node("gpu-node-1")["metadata"]["annotations"]
    pcie_node.ctl("gpu-reset", "--gpu", "1")
    _, last = gpu_kernel_log.read_log(str(pcie_node.kmsg_path))
    gpu_kernel_log.save_cleared(["00000000:31:00.0"], last or 0)  # what gpu_reset records for GPU 1
    agent.poll()
    assert NOTICE not in (cluster.node("gpu-node-1")["metadata"].get("annotations") or {})
    assert [e["reason"] for e in cluster.events("gpu-node-1")] == ["GPUResetAtNextDrain"]
    agent.xids.close()
    cluster.reset()


def test_the_notice_key_ignores_an_applications_xid() -> None:
    from ansible.module_utils.gpu_health_agent import notice_key

    gpu = {
        "index": 1,
        "action": "restart_app",
        "reasons": ["xid_94"],
        "xids": [{"seq": 7, "action": "restart_app"}],
    }
    health = {"action": "restart_app", "gpus": [gpu]}
    before = notice_key(health)
    gpu["xids"].append({"seq": 9, "action": "none"})  # Xid 13 of the application on the same GPU
    assert notice_key(health) == before
    gpu["xids"].append({"seq": 11, "action": "restart_app"})  # another contained error: news
    assert notice_key(health) != before
    assert notice_key({"action": "none", "gpus": [{**gpu, "action": "none"}]}) == json.dumps(["none", []])


def test_an_ecc_error_seen_before_its_xid_waits_for_the_xid(
    cluster: Cluster, pcie_node: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, the interleaving two runs under Python 3.10 hit by chance: the driver counts an
    uncorrectable error before it logs its Xids, and a poll in between sees the count and no Xid. The
    agent waits one poll for the Xid (here 94: contained, no cordon); a count whose Xid never comes is
    judged uncontained on the next poll, as before."""
    import pynvml
    from ansible.module_utils import gpu_kernel_log
    from ansible.module_utils.gpu_health_agent import Agent as AgentCode
    from ansible.module_utils.gpu_health_agent import Config, KubeApi

    cluster.reset()
    monkeypatch.setattr(gpu_kernel_log, "CLEARED_FILE", str(tmp_path / "cleared.json"))
    config = Config(
        node_name="gpu-node-1",
        api_server=cluster.api.url,
        ca_file=str(cluster.api.ca),
        token_file=str(cluster.token_file),
        lease_namespace=cluster.namespace,
        lease_name=role_vars()["__gpu_health_agent_lease"],
        gpu_node_selector="nvidia.com/gpu.present=true",
        kernel_log=str(pcie_node.kmsg_path),
        state_dir=str(tmp_path / "state"),
    )
    agent = AgentCode(config, pynvml, KubeApi(config.api_server, config.ca_file, config.token_file))
    agent.poll()  # the kernel log as it is at start (nothing)
    # the fault's counters are written, its kernel log records held back: the poll lands between the two
    held: list[str] = []
    monkeypatch.setattr(
        fake_nvml_ctl, "_flush_kernel_log", lambda: held.extend(fake_nvml_ctl._pending_records)
    )
    pcie_node.ctl("xid", "--gpu", "1", "--xid", "48", "--xid", "63", "--xid", "94")
    assert pcie_node.gpu(1)["ecc"]["volatile"]["uncorrected"] > 0 and len(held) == 3
    agent.poll()
    assert cluster.cordoned() == [] and cluster.events("gpu-node-1") == []
    with open(pcie_node.kmsg_path, "a", encoding="utf-8") as kmsg:  # the driver logs the Xids
        kmsg.write("".join(held))
    agent.poll()
    assert cluster.cordoned() == []
    assert [e["reason"] for e in cluster.events("gpu-node-1")] == ["GPUResetAtNextDrain"]
    assert "Xid 94" in cluster.events("gpu-node-1")[0]["message"]
    # an uncorrectable count whose Xid never comes (an unreadable or lost record): uncontained next poll
    pcie_node.ctl("ecc", "--gpu", "2", "--uncorrectable", "1")
    agent.poll()
    assert cluster.cordoned() == []
    agent.poll()
    assert cluster.cordoned() == ["gpu-node-1"]
    record = json.loads(cluster.node("gpu-node-1")["metadata"]["annotations"][CORDON])
    assert record["gpu_action"] == "reset_gpu" and "ecc_uncorrectable_volatile" in record["reasons"]
    agent.xids.close()
    cluster.reset()
