"""What every lab test does: run a playbook against the lab and read its recap, run a command on a node.

One home for the environment (podman's config, ansible.cfg, no colour), the PLAY RECAP parser and the
JSON callback reader, so a change in how the lab is reached is made once:

    from labrun import NODES, on_node, playbook

    run = playbook("playbooks/kubernetes.yml", "--limit", "workers")
    assert run.rc == 0, run.tail()
    assert run.changed() == dict.fromkeys(NODES, 0)

`tests/lab` has no __init__.py, so pytest puts it on sys.path for the tests in it (import mode prepend).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
LAB_INVENTORY = "inventories/lab/hosts.yml"
NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)"
    r"\s+unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


def env(json_callback: bool = False) -> dict[str, str]:
    """The environment of a lab command: the lab's podman config, this checkout's ansible.cfg, no colour."""
    result = {
        **os.environ,
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "tests/lab/containers.conf")),
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
    }
    if json_callback:
        result["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
        # replaces ansible.cfg's list: keep the project's worker_prefork (plugins/callback) with it
        result["ANSIBLE_CALLBACKS_ENABLED"] = "ansible.posix.json, worker_prefork"
    return result


def podman(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, env=env(), timeout=timeout)
    return proc


def on_node(node: str, command: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """`sh -c command` inside a lab node (podman exec, not SSH: the test's view of the node)."""
    return podman("exec", node, "sh", "-c", command, timeout=timeout)


def pinned_image(ref: str) -> str:
    """REF@digest: the digest the lab registry gave the image it built (labctl.py up writes them to
    .lab/image-digests.json, which the lab inventory pins every *_image_digest from)."""
    return f"{ref}@{json.loads((ROOT / '.lab' / 'image-digests.json').read_text())[ref]}"


def running_nodes() -> list[str]:
    return podman("ps", "--format", "{{.Names}}").stdout.split()


# the lab's operator account (its one home: the lab inventory's common_ops_users)
_LAB_ALL = yaml.safe_load((ROOT / "inventories/lab/group_vars/all.yml").read_text())
OPERATOR = _LAB_ALL["common_ops_users"][0]["name"]


def as_operator(command: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """COMMAND as the lab's operator on the control plane, with the operator's own ~/.kube/config (the API
    and its audit log see the person, not the shared kubernetes-admin)."""
    return on_node(NODES[0], f"su - {OPERATOR} -c {shlex.quote(command)}", timeout=timeout)


AGENT_CORDON = "gpu-health.llm-platform.io/cordon"
AGENT_HISTORY = "gpu-health.llm-platform.io/history"
ADMIN_KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
GPU_RESOURCE = "nvidia.com/gpu"
# `kubectl get pods` of the pods that are not over: a Deployment's pod whose containers were lost (the node
# restarted under it: ContainerStatusUnknown, as every lab start after a killed session does) or that the
# kubelet evicted (DiskPressure) stays listed in phase Failed until someone deletes it (its ReplicaSet
# starts a new one and leaves it), and one that completed stays Succeeded
LIVE_PODS = "--field-selector=status.phase!=Failed,status.phase!=Succeeded"
# the device plugin DaemonSet's pods, by the label NVIDIA's manifest gives them
PLUGIN_SELECTOR = "name=nvidia-device-plugin-ds"
_AGENT_METRICS = (
    'python3 -c "import urllib.request; '
    "print(urllib.request.urlopen('http://127.0.0.1:9445/metrics', timeout=5).read().decode())\""
)


def kube_json(*args: str, timeout: int = 300) -> Any:
    """`kubectl ARGS -o json` as the cluster admin (ADMIN_KUBECTL) on the control plane, parsed.

    Each of ARGS is one argument, shell-quoted: kube_json("-n", namespace, "get", "pod", name). A non-zero
    exit fails the caller (AssertionError naming the arguments and kubectl's stderr); a caller that has to
    tolerate one (NotFound, no cluster yet) runs on_node itself."""
    quoted = shlex.join(args)
    done = on_node(NODES[0], f"{ADMIN_KUBECTL} {quoted} -o json", timeout=timeout)
    assert done.returncode == 0, f"kubectl {quoted}: {done.stderr}"
    return json.loads(done.stdout)


def take_back_agent_cordons(timeout: float = 30) -> list[str]:
    """After a test has cleared the GPU fault it injected: what an operator does once the GPUs are fine again.

    The GPU health agent (site.yml installs it) cordons a node within a poll of a real fault and never
    uncordons by itself, so a GPU fault test leaves its node cordoned for every later test. This waits
    until no node's agent reports its node unhealthy any more (an agent still on its last unhealthy poll may
    cordon after an early uncordon), then uncordons the nodes the agent cordoned and drops its annotations.
    A node cordoned without the agent's annotation is someone else's: AssertionError, left as found.
    Nodes without an agent or without a cluster are left alone. Returns the nodes uncordoned."""
    if on_node(NODES[0], "test -f /etc/kubernetes/admin.conf", timeout=60).returncode != 0:
        return []
    deadline = time.monotonic() + timeout
    for node in NODES:
        unhealthy = f'gpu_health_agent_node_verdict{{node="{node}",verdict="unhealthy"}} 1'
        while True:
            metrics = on_node(node, _AGENT_METRICS, timeout=30)
            if metrics.returncode != 0 or unhealthy not in metrics.stdout:
                break  # no agent on this node, or it no longer sees a fault it would cordon for
            assert time.monotonic() < deadline, f"{node}: the GPU health agent still reports it unhealthy"
            time.sleep(1)
    taken_back = []
    for item in kube_json("get", "nodes", timeout=60)["items"]:
        name = item["metadata"]["name"]
        if not (item.get("spec") or {}).get("unschedulable"):
            continue
        assert AGENT_CORDON in (item["metadata"].get("annotations") or {}), (
            f"{name} is cordoned (not by the GPU health agent): clear it first"
        )
        for args in (f"uncordon {name}", f"annotate node {name} {AGENT_CORDON}- {AGENT_HISTORY}-"):
            done = on_node(NODES[0], f"{ADMIN_KUBECTL} {args}", timeout=60)
            assert done.returncode == 0, f"kubectl {args}: {done.stderr}"
        taken_back.append(name)
    return taken_back


def has_cluster() -> bool:
    """The lab's control plane has a cluster (kubeadm init wrote its admin kubeconfig)."""
    return on_node(NODES[0], "test -f /etc/kubernetes/admin.conf", timeout=60).returncode == 0


def cluster_nodes() -> list[dict[str, Any]]:
    """The lab cluster's Node objects, as the API server has them."""
    return list(kube_json("get", "nodes", timeout=60)["items"])


# what the device plugin logs when it marks a GPU unhealthy (NVIDIA's plugin's words; the lab's stand-in,
# lab-programs/cmd/nvidia-device-plugin, markUnhealthyLocked)
PLUGIN_MARKED_UNHEALTHY = "device marked unhealthy"


def nodes_whose_plugin_marked_a_gpu_unhealthy(since: str) -> list[str]:
    """The nodes whose device plugin pod logged a GPU marked unhealthy since SINCE (RFC 3339, UTC). The
    plugin marks it when it sees the fault, and the kubelet shows it in the Node's allocatable only at its
    next status update: a test that clears its fault and reads allocatable at once may still find every GPU
    offered, and leave the next test a node one GPU short (CI, 2026-12-05: gpu-node-2 offered 3 of its 4
    GPUs for 90 s after test_gpu_health_ecc_on_node2_gpu2)."""
    marked = set()
    for pod in kube_json("get", "pods", "-A", "-l", PLUGIN_SELECTOR, timeout=60)["items"]:
        name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
        logs = on_node(
            NODES[0], f"{ADMIN_KUBECTL} logs -n {namespace} {name} --since-time={since}", timeout=60
        )
        if PLUGIN_MARKED_UNHEALTHY in logs.stdout:
            marked.add(pod["spec"]["nodeName"])
    return sorted(marked)


def wait_until_short_of_gpus(nodes: list[str], timeout: float = 60) -> None:
    """Until the kubelet of each of NODES reports fewer GPUs allocatable than it has (its plugin marked one
    unhealthy: its next node status update shows it)."""
    deadline = time.monotonic() + timeout
    while True:
        offered = {
            item["metadata"]["name"]: item["status"].get("allocatable", {}).get(GPU_RESOURCE)
            == item["status"].get("capacity", {}).get(GPU_RESOURCE)
            for item in cluster_nodes()
        }
        still_full = [node for node in nodes if offered.get(node, False)]
        if not still_full:
            return
        assert time.monotonic() < deadline, (
            f"the device plugin marked a GPU unhealthy on {still_full}, but the kubelet still offers them all"
        )
        time.sleep(2)


def give_back_unhealthy_gpus(timeout: float = 120) -> list[str]:
    """After a test has cleared the GPU fault it injected: the device plugin marks a GPU Unhealthy on a
    critical Xid or ECC event and never Healthy again (NVIDIA's plugin, v0.20; the lab's stand-in does the
    same), so the node offers fewer GPUs to the scheduler until its plugin pod is replaced, which is what
    on-call does (playbooks/remediate/restart-device-plugin.yml). This replaces the plugin pod of every node
    offering fewer GPUs than it has, and waits until each offers them all again. Returns those nodes."""
    if not has_cluster():
        return []

    def short_nodes() -> dict[str, dict[str, Any]]:
        return {
            item["metadata"]["name"]: item["status"]
            for item in cluster_nodes()
            if item["status"].get("allocatable", {}).get(GPU_RESOURCE)
            != item["status"].get("capacity", {}).get(GPU_RESOURCE)
        }

    short = sorted(short_nodes())
    for node in short:
        done = on_node(
            NODES[0],
            f"{ADMIN_KUBECTL} delete pods -A --field-selector spec.nodeName={node} -l {PLUGIN_SELECTOR}",
            timeout=120,
        )
        assert done.returncode == 0, f"{node}: deleting its device plugin pod: {done.stderr}"
    deadline = time.monotonic() + timeout
    while short and (left := short_nodes()):
        assert time.monotonic() < deadline, f"still offering fewer GPUs than they have: {left}"
        time.sleep(2)
    return short


def cordoned_nodes() -> dict[str, str]:
    """The lab cluster's cordoned nodes, each with the annotation saying who cordoned it (or '');
    {} where the lab has no cluster."""
    if not has_cluster():
        return {}
    return {
        item["metadata"]["name"]: (item["metadata"].get("annotations") or {}).get(AGENT_CORDON, "")
        for item in cluster_nodes()
        if (item.get("spec") or {}).get("unschedulable")
    }


@dataclass
class Run:
    """One ansible-playbook run: exit status, the PLAY RECAP per host, the whole output."""

    rc: int
    output: str
    recap: dict[str, dict[str, int]] = field(default_factory=dict)
    result: dict[str, Any] | None = None  # the JSON callback's document, when asked for

    def changed(self) -> dict[str, int]:
        return {host: counts["changed"] for host, counts in self.recap.items()}

    def changed_nothing(self) -> bool:
        """rc 0 and changed=0 on every host: on a converged lab, already the proof of a second run."""
        return self.rc == 0 and bool(self.recap) and set(self.changed().values()) == {0}

    def failed(self) -> dict[str, int]:
        return {host: counts["failed"] for host, counts in self.recap.items()}

    def tail(self, chars: int = 6000) -> str:
        return self.output[-chars:]

    def changed_tasks(self) -> list[str]:
        """Task headers followed by a `changed:` line (default callback), to name what broke idempotence."""
        names, current = [], ""
        for line in self.output.splitlines():
            if line.startswith(("TASK [", "RUNNING HANDLER [")):
                current = line.split("[", 1)[1].rsplit("]", 1)[0]
            elif line.startswith("changed:") and current not in names:
                names.append(current)
        return names

    def task_results(self, name_start: str) -> list[tuple[str, dict[str, Any]]]:
        """(host, result) of each task whose name starts with name_start (JSON callback only); loop items
        flattened, skipped ones left out."""
        assert self.result is not None, "run the playbook with json_callback=True"
        found = []
        for play in self.result["plays"]:
            for task in play["tasks"]:
                if task["task"]["name"].split(" : ", 1)[-1].startswith(name_start):  # "role : name"
                    for host, result in task["hosts"].items():
                        items = result.get("results", [result])
                        found += [(host, item) for item in items if not item.get("skipped")]
        return found


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    counts = ("ok", "changed", "unreachable", "failed")
    return {m["host"]: {k: int(m[k]) for k in counts} for m in RECAP.finditer(output)}


def parse_json(stdout: str) -> dict[str, Any]:
    start = stdout.find("{\n")
    assert start >= 0, f"no JSON document in the output:\n{stdout[-3000:]}"
    document, _ = json.JSONDecoder().raw_decode(stdout[start:])
    return document


def extra_vars(values: dict[str, Any]) -> tuple[str, str]:
    """`-e @file` for typed extra vars (lists, dicts, ints), through a JSON file that outlives the call."""
    with tempfile.NamedTemporaryFile("w", prefix="lab-extra-vars-", suffix=".json", delete=False) as handle:
        json.dump(values, handle)
    return "-e", f"@{handle.name}"


def playbook_args(path: str, *extra: str, inventory: str = LAB_INVENTORY) -> list[str]:
    return [str(ROOT / ".venv/bin/ansible-playbook"), "-i", inventory, path, *extra]


def playbook(
    path: str, *extra: str, inventory: str = LAB_INVENTORY, timeout: int = 1800, json_callback: bool = False
) -> Run:
    """Run `ansible-playbook -i <lab inventory> path extra...` from the checkout's root."""
    proc = subprocess.run(
        playbook_args(path, *extra, inventory=inventory),
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env(json_callback),
        timeout=timeout,
    )
    output = proc.stdout + proc.stderr
    if json_callback:
        document = parse_json(proc.stdout)
        recap = {
            host: {k: stats.get(k, 0) for k in ("ok", "changed", "unreachable", "failed")}
            for host, stats in document["stats"].items()
        }
        return Run(proc.returncode, output, recap, document)
    return Run(proc.returncode, output, parse_recap(output))


def command(*args: str, timeout: int = 1800) -> Run:
    """Any lab command run from the checkout's root (`make lab`, labctl), its output and PLAY RECAP read."""
    proc = subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True, env=env(), timeout=timeout)
    output = proc.stdout + proc.stderr
    return Run(proc.returncode, output, parse_recap(output))


def background_playbook(path: str, *extra: str, inventory: str = LAB_INVENTORY) -> subprocess.Popen[str]:
    """Start a playbook and return at once (for tests that interrupt a run); JSON callback on."""
    return subprocess.Popen(
        playbook_args(path, *extra, inventory=inventory),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(json_callback=True),
    )


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, poll_s: float = 1) -> Any:
    """check() until it returns something true, at most timeout_s (then fails naming `what`); returns that."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(poll_s)
