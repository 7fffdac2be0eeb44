"""playbooks/upgrade-driver.yml on the lab (issue 18): gpu-node-2 moved from driver branch 535 (535.183.06)
to 580 (580.95.05) for real, rebooted on the way, while clients keep asking the gateway, then back to 535
whatever happened.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_driver_upgrade_on_lab.py -v -s

Needs the lab converged through the serving stage (make lab), with this checkout's fake NVML on the nodes
(make lab-up copies it there) and nodes that can reboot (docs/lab.md, "Reboots": podman starts a node's
container again, each start a boot with its own boot id, the simulated GPUs cleared at boot). A driver's CUDA
version follows its branch (tests/lab/fake_nvml/fake_nvml_ctl.py, CUDA_BY_BRANCH: 535 reports CUDA 12.2, 580
reports 13.0, as the real drivers do).

1. Before: NVML on gpu-node-2 (the node's own pynvml, the library gpu_facts reads) reports 535.183.06, CUDA
   12.2.
2. `--check -l gpu-node-2 -e nvidia_driver_branch=580 -e nvidia_driver_version=580.95.05` with
   nvidia_driver_reboot true (a server's path; the lab inventory's false is for its site runs): the plan names
   gpu-node-2, 535.183.06 -> 580.95.05 (branch 535 -> 580), the reboot, the breaker's limit and R535's end of
   life; nothing changed: the recap, NVML, the Node, the holds.
3. The same without --check, while one thread sends chat completions to the gateway's NodePort of every node
   in turn (each a new connection, as separate clients make; one that cannot reach gpu-node-2 while it is
   down goes to the next node, as a load balancer's health check would send it) and another watches the
   Node. The gateway runs llm_gateway_replicas (2, the role's default: the lab inventory keeps it) behind a
   PodDisruptionBudget of min 1, the model 2 replicas behind a budget of max 1 unavailable: the drain takes
   at most one of each.
4. After: NVML 580.95.05, CUDA 13.0 (13000, NVML version 13.580.95.05); apt holds only the 580 driver packages
   and no 535 driver package is installed; the role's pin names 580; the node rebooted once (a new boot id,
   read on the node and reported by its kubelet; its container started once more) and no reboot marker is
   left; the cluster's own GPU clients are back on the node (the agent, the device plugin's and
   dcgm-exporter's pods Ready, allocatable nvidia.com/gpu back to the GPU count); the watcher saw the node
   cordoned with the playbook's annotation and out of the GPU node label meanwhile; the Node is uncordoned,
   that annotation gone, the history naming the upgrade; a second --check has nothing to do; no request
   failed.
5. Always afterwards (the fixture): the runbook's undo, the same playbook back to 535.183.06 with
   allow_downgrade (without a reboot: the modules reloaded), and what a run stopped half-way could leave (a
   driver/library mismatch or no driver, this playbook's cordon, the GPU clients stopped) put back as the
   runbook says; then NVML 535.183.06 with CUDA 12.2 again, no 580 package, the node schedulable with its
   GPUs offered, serving whole again, the reboot marker as found.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from labrun import (
    ADMIN_KUBECTL,
    AGENT_CORDON,
    AGENT_HISTORY,
    GPU_RESOURCE,
    LIVE_PODS,
    NODES,
    PLUGIN_SELECTOR,
    ROOT,
    Run,
    kube_json,
    on_node,
    playbook,
    podman,
    running_nodes,
    wait_for,
)
from traffic import MODEL, Traffic, chat_url, node_ips
from unit.role_render import RoleVars

pytestmark = pytest.mark.lab

NODE = "gpu-node-2"
CONTROL_PLANE = NODES[0]
PLAYBOOK = "playbooks/upgrade-driver.yml"
FROM, TO = ("535", "535.183.06"), ("580", "580.95.05")
# what a driver of each branch reports through NVML (nvmlSystemGetCudaDriverVersion): R535 supports CUDA 12.2,
# R580 CUDA 13.0 (NVIDIA's release notes)
CUDA = {"535.183.06": 12020, "580.95.05": 13000}
TO_580 = ("-e", f"nvidia_driver_branch={TO[0]}", "-e", f"nvidia_driver_version={TO[1]}")
# the way there reboots the node, as on a server (the lab inventory's false is for its site runs); the way
# back reloads the modules instead
REBOOT = ("-e", '{"nvidia_driver_reboot": true}')
# the runbook's undo: the values back, a downgrade on purpose
BACK_TO_535 = (
    "-e", f"nvidia_driver_branch={FROM[0]}", "-e", f"nvidia_driver_version={FROM[1]}",
    "-e", '{"allow_downgrade": true}',
)  # fmt: skip

LAB_GPU_VARS = yaml.safe_load((ROOT / "inventories/lab/group_vars/gpu_nodes.yml").read_text())
GPUS = int(LAB_GPU_VARS["nvidia_driver_expected_gpu_count"])
# the playbook's own cordon mark, and the nvidia_driver role's files (each from its one home)
OWN_ANNOTATION = yaml.safe_load((ROOT / PLAYBOOK).read_text())[0]["vars"]["upgrade_driver_annotation"]
DRIVER_VARS = yaml.safe_load((ROOT / "roles/nvidia_driver/vars/main.yml").read_text())
REBOOT_MARKER = DRIVER_VARS["__nvidia_driver_reboot_marker"]
CLIENTS_RECORD = DRIVER_VARS["__nvidia_driver_gpu_clients_record"]
NVML_PYTHON = f"{DRIVER_VARS['__nvidia_driver_nvml_venv']}/bin/python3"
(PIN_TASK,) = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/pin-driver-packages.yml").read_text())
PIN_FILE = PIN_TASK["ansible.builtin.template"]["dest"]
GPU_LABEL = yaml.safe_load((ROOT / "roles/nvidia_device_plugin/defaults/main.yml").read_text())[
    "nvidia_device_plugin_node_label"
]
AGENT_UNIT = "gpu-health-agent"
# the GPU DaemonSets whose pods leave a node out of the GPU node label (namespace/DaemonSet)
GPU_DAEMONSETS = ("kube-system/nvidia-device-plugin-daemonset", "monitoring/dcgm-exporter")


def branch_pattern(branch: str) -> re.Pattern[str]:
    """Every driver package of BRANCH, by the role's own pattern (what its pin and holds cover)."""
    return re.compile(
        RoleVars("nvidia_driver", nvidia_driver_branch=branch)["__nvidia_driver_branch_package_regex"]
    )


ANY_BRANCH = re.compile(
    DRIVER_VARS["__nvidia_driver_package_regex_of_branch"].replace("@BRANCH@", "[0-9]{3}")
)

SERVING = yaml.safe_load((ROOT / "roles/vllm_serving/defaults/main.yml").read_text())[
    "vllm_serving_namespace"
]
GATEWAY = "llm-gateway"  # the Deployment, its Service and its pods' app.kubernetes.io/name

# Bounds, each over the setting it waits on, for these machines (two shared cores, nested containers)
PLUGIN_POD_START_S = 60  # a new device plugin pod registered and its GPUs in the Node's status (every 10 s)
POD_START_S = 120  # a pod scheduled, its image pulled from the lab's registry, started, its probes passing
WATCH_S = 3


# ------------------------------------------------------------------------------------------------ helpers
def sh(node: str, command: str, timeout: int = 120) -> str:
    done = on_node(node, command, timeout=timeout)
    assert done.returncode == 0, f"{node}: {command}: {done.stdout}{done.stderr}"
    return done.stdout


def kubectl(args: str) -> None:
    sh(CONTROL_PLANE, f"{ADMIN_KUBECTL} {args}")


def flat(text: str) -> str:
    """Output on one line, as the YAML callback's single-quoted strings read (`''` is `'`)."""
    return " ".join(text.replace("''", "'").split())


def upgrade(*args: str) -> Run:
    return playbook(PLAYBOOK, "-l", NODE, *args)


# what a client of NVML reads on the node: the driver (the library's version), the CUDA version the driver
# reports, the NVML version, the GPUs; an NVML error (a driver/library mismatch, no driver) as such
NVML_READ = (
    "import json, pynvml\n"
    "try:\n"
    "    pynvml.nvmlInit()\n"
    "except pynvml.NVMLError as error:\n"
    "    print(json.dumps({'error': str(error)}))\n"
    "    raise SystemExit(0)\n"
    "try:\n"
    "    print(json.dumps({'driver': pynvml.nvmlSystemGetDriverVersion(),\n"
    "                      'cuda': pynvml.nvmlSystemGetCudaDriverVersion(),\n"
    "                      'nvml': pynvml.nvmlSystemGetNVMLVersion(),\n"
    "                      'gpus': pynvml.nvmlDeviceGetCount()}))\n"
    "finally:\n"
    "    pynvml.nvmlShutdown()\n"
)


def nvml(node: str = NODE) -> dict[str, Any]:
    """NVML on the node, through the pynvml the product's GPU modules respawn into."""
    return dict(json.loads(sh(node, f"{NVML_PYTHON} -c {shlex.quote(NVML_READ)}")))


def runs(version: str) -> dict[str, Any]:
    """What NVML reports of a node running driver VERSION with every GPU."""
    return {
        "driver": version,
        "cuda": CUDA[version],
        "nvml": f"{CUDA[version] // 1000}.{version}",
        "gpus": GPUS,
    }


def held(node: str = NODE) -> list[str]:
    return sorted(sh(node, "apt-mark showhold").split())


def installed_of_branch(branch: str, node: str = NODE) -> list[str]:
    """The driver packages of BRANCH dpkg has on the node in any state but not-installed (removed ones whose
    configuration is left count too: the role purges)."""
    rows = sh(node, "dpkg-query -W -f '${Package} ${db:Status-Status}\\n'").splitlines()
    pattern = branch_pattern(branch)
    return sorted(
        name
        for name, status in (row.split() for row in rows)
        if status != "not-installed" and pattern.match(name)
    )


def node_object() -> dict[str, Any]:
    return dict(kube_json("get", "node", NODE))


def annotations(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"].get("annotations") or {})


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def gpu_client_pods() -> dict[str, dict[str, Any]]:
    """namespace/DaemonSet -> its pod on the node, for the GPU DaemonSets"""
    found = {}
    live_here = f"--field-selector=spec.nodeName={NODE},status.phase!=Failed,status.phase!=Succeeded"
    for pod in kube_json("get", "pods", "-A", live_here)["items"]:
        owner = (pod["metadata"].get("ownerReferences") or [{}])[0].get("name")
        key = f"{pod['metadata']['namespace']}/{owner}"
        if key in GPU_DAEMONSETS:
            found[key] = pod
    return found


def gpu_clients_missing() -> list[str]:
    """What of the cluster's own GPU clients is not back on the node (empty: all of it)."""
    missing = []
    if sh(NODE, f"systemctl is-active {AGENT_UNIT} || true").strip() != "active":
        missing.append(f"unit {AGENT_UNIT} not active")
    pods = gpu_client_pods()
    missing += [
        f"no Ready pod of {key}" for key in GPU_DAEMONSETS if not (key in pods and pod_ready(pods[key]))
    ]
    plugin = kube_json(
        "get", "pods", "-A", "-l", PLUGIN_SELECTOR, "--field-selector", f"spec.nodeName={NODE}"
    )["items"]
    if not any(p["status"].get("phase") == "Running" for p in plugin):
        missing.append("no device plugin pod Running")
    node = node_object()
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in GPU_LABEL.items()):
        missing.append(f"node label {GPU_LABEL} missing")
    offered = (
        node["status"].get("allocatable", {}).get(GPU_RESOURCE),
        node["status"].get("capacity", {}).get(GPU_RESOURCE),
    )
    if offered != (str(GPUS), str(GPUS)):
        missing.append(f"{GPU_RESOURCE} allocatable/capacity {offered}, not {GPUS}")
    if on_node(NODE, f"test -e {CLIENTS_RECORD}").returncode == 0:
        missing.append(f"{CLIENTS_RECORD} left (clients recorded as stopped)")
    return missing


def serving_whole() -> str | None:
    """None when the gateway's Deployment and the model's StatefulSet have every replica ready; else which
    not."""
    gateway = kube_json("-n", SERVING, "get", "deployment", GATEWAY)
    model = kube_json("-n", SERVING, "get", "statefulset", MODEL["name"])
    short = [
        f"{kind} {name}: {obj['status'].get('readyReplicas', 0)} of {obj['spec']['replicas']} ready"
        for kind, name, obj in (("Deployment", GATEWAY, gateway), ("StatefulSet", MODEL["name"], model))
        if obj["status"].get("readyReplicas", 0) != obj["spec"]["replicas"]
    ]
    return "; ".join(short) or None


def put_one_of_each_on_the_node() -> None:
    """A gateway pod and a model replica on the node, so the drain has to move both under traffic: where one
    is elsewhere, one of its pods is deleted while the other nodes are cordoned (before the traffic starts),
    and comes back on the node."""
    moved = []
    for name in (GATEWAY, "vllm"):
        pods = kube_json("-n", SERVING, "get", "pods", "-l", f"app.kubernetes.io/name={name}", LIVE_PODS)[
            "items"
        ]
        assert pods, f"no {name} pod in {SERVING}"
        if not any(p["spec"].get("nodeName") == NODE for p in pods):
            moved.append(pods[0]["metadata"]["name"])
    if not moved:
        return
    others = [n for n in NODES if n != NODE]
    try:
        for other in others:
            kubectl(f"cordon {other}")
        kubectl(f"-n {SERVING} delete pod {' '.join(moved)} --wait=false")
        wait_for(
            f"a gateway pod and a model replica on {NODE}",
            lambda: (
                all(NODE in placement().get(name, []) for name in (GATEWAY, "vllm"))
                and serving_whole() is None
            ),
            2 * POD_START_S,
        )
    finally:
        for other in others:
            kubectl(f"uncordon {other}")


def placement() -> dict[str, list[str]]:
    """The nodes each serving workload's pods run on (printed: what the drain had to move)."""
    found: dict[str, list[str]] = {}
    for pod in kube_json("-n", SERVING, "get", "pods", LIVE_PODS)["items"]:
        name = pod["metadata"]["labels"].get("app.kubernetes.io/name", "?")
        found.setdefault(name, []).append(pod["spec"].get("nodeName", "-"))
    return {name: sorted(nodes) for name, nodes in found.items()}


def expected_plan(was: tuple[str, str], to: tuple[str, str], reboot: bool) -> str:
    """The plan line upgrade-driver.yml prints for the node."""
    return (
        f"{NODE} (1 of 1): driver {was[1]} -> {to[1]} (branch {was[0]} -> {to[0]}): cordon, drain, stop the "
        f"GPU clients of the cluster, install and hold the {to[0]} packages, remove the {was[0]} ones, "
        + (
            "reboot"
            if reboot
            else f"no reboot (nvidia_driver_reboot is false: {REBOOT_MARKER} is left; the kernel modules are "
            "reloaded where nothing holds the GPUs)"
        )
        + ", verify through NVML (version, GPUs, GPU settings), check the CUDA of the vLLM image, uncordon"
    )


def boot_ids() -> tuple[str, str, int]:
    """The node's boot id as it reads it, as its Node reports it (the kubelet's), and how often podman started
    its container again (the lab's power-on after a reboot: labctl.py's restart policy)."""
    node_reads = sh(NODE, "cat /proc/sys/kernel/random/boot_id").strip()
    reported = node_object()["status"]["nodeInfo"]["bootID"]
    restarts = int(podman("inspect", NODE, "--format", "{{.RestartCount}}").stdout)
    return node_reads, reported, restarts


# ------------------------------------------------------------------------------------------ in the background
class NodeWatch:
    """The Node as the API has it every few seconds, while the upgrade runs: what its cordon and its GPU node
    label went through (the playbook's steps a and b, seen from the cluster)."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, str, bool]] = []  # (unschedulable, this playbook's annotation, GPU label)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            done = on_node(CONTROL_PLANE, f"{ADMIN_KUBECTL} get node {NODE} -o json", timeout=60)
            if done.returncode == 0:
                node = json.loads(done.stdout)
                labels = node["metadata"].get("labels") or {}
                self.seen.append(
                    (
                        bool((node.get("spec") or {}).get("unschedulable")),
                        annotations(node).get(OWN_ANNOTATION, ""),
                        all(labels.get(k) == v for k, v in GPU_LABEL.items()),
                    )
                )
            self._stop.wait(WATCH_S)

    def __enter__(self) -> NodeWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


# ---------------------------------------------------------------------------------------------- the fixtures
@pytest.fixture(scope="module")
def lab() -> None:
    if not set(running_nodes()) >= set(NODES):
        pytest.skip("the lab is not running (make lab-up)")
    if on_node(CONTROL_PLANE, "test -s /etc/kubernetes/admin.conf").returncode != 0:
        pytest.fail("no cluster on gpu-node-1: converge the lab first (make lab)")
    # the fake NVML whose CUDA version follows the driver's branch: this checkout's (make lab-up copies it)
    want = hashlib.sha256((ROOT / "tests/lab/fake_nvml/fake_nvml_ctl.py").read_bytes()).hexdigest()
    have = sh(NODE, "sha256sum /usr/local/lib/fake-nvml/fake_nvml_ctl.py").split()[0]
    if have != want:
        pytest.fail(
            f"{NODE}'s fake NVML (/usr/local/lib/fake-nvml/fake_nvml_ctl.py) is not this checkout's: "
            "make lab-up"
        )
    # a node that can reboot: its container comes back on (labctl.py), with a boot id of its own per boot and
    # the simulated GPUs cleared (image/kernel/lab-proc-sys, fake_nvml/fake-nvml-boot.service)
    policy = podman("inspect", NODE, "--format", "{{.HostConfig.RestartPolicy.Name}}").stdout.strip()
    boot_unit = on_node(NODE, "systemctl is-enabled fake-nvml-boot.service").stdout.strip()
    if policy != "always" or boot_unit != "enabled":
        pytest.fail(
            f"{NODE} cannot reboot on the lab (restart policy {policy!r}, fake-nvml-boot.service "
            f"{boot_unit!r}): make lab (it recreates nodes of an older lab configuration, then converges)"
        )
    cordoned = [
        n["metadata"]["name"]
        for n in kube_json("get", "nodes")["items"]
        if (n.get("spec") or {}).get("unschedulable")
    ]
    assert not cordoned, (
        f"the lab must start with every node schedulable (the breaker counts them): {cordoned}"
    )


def put_back(had_marker: bool, history: str | None) -> None:
    """gpu-node-2 back on 535.183.06 whatever the test left: the runbook's undo (the same playbook with the
    values back and allow_downgrade). Before it, what upgrade-driver.yml refuses to start from, fixed as its
    refusal says: a driver/library mismatch (a run stopped between the packages and the module reload) by
    remediate/driver-mismatch.yml, no driver at all (stopped between the old branch's removal and the new
    one's install) by the GPU stage (gpu.yml, the lab's values: 535.183.06). After it, what a run stopped
    half-way leaves, undone as the runbook says (this playbook's cordon, the GPU clients stopped). The node is
    given back to the cluster only with its driver answering."""
    errors = []
    broken = nvml().get("error")
    if broken:
        fix = (
            "playbooks/remediate/driver-mismatch.yml" if "mismatch" in broken.lower() else "playbooks/gpu.yml"
        )
        fixed = playbook(fix, "-l", NODE)
        print(f"\nNVML on {NODE}: {broken}; {fix}: rc {fixed.rc}")
        if fixed.rc != 0:
            errors.append(f"{fix} -l {NODE}:\n{fixed.tail(3000)}")
    back = upgrade(*BACK_TO_535)
    print(f"\nback to {FROM[1]}: rc {back.rc}, changed {back.changed()}")
    if back.rc != 0:
        errors.append(f"upgrade-driver.yml back to {FROM[1]}:\n{back.tail(4000)}")
    now = nvml()
    if now.get("driver") == FROM[1]:
        node = node_object()
        if OWN_ANNOTATION in annotations(node):  # the undo of a run stopped after its cordon
            if (node.get("spec") or {}).get("unschedulable"):
                kubectl(f"uncordon {NODE}")
            kubectl(f"annotate node {NODE} {OWN_ANNOTATION}-")
        # the GPU clients a run that died left stopped (its record on the node)
        if on_node(NODE, f"test -e {CLIENTS_RECORD}").returncode == 0:
            labels = " ".join(f"{k}={v}" for k, v in GPU_LABEL.items())
            kubectl(f"label node {NODE} --overwrite {labels}")
            sh(NODE, f"systemctl start {AGENT_UNIT} && rm -f {CLIENTS_RECORD}")
        try:
            wait_for(
                f"the GPU clients back on {NODE}", lambda: not gpu_clients_missing(), PLUGIN_POD_START_S * 2
            )
        except AssertionError as error:
            errors.append(f"{error}: {gpu_clients_missing()}")
    else:
        errors.append(f"NVML on {NODE} after the way back: {now} (left cordoned, as the playbook leaves it)")
    if not had_marker:
        on_node(NODE, f"rm -f {REBOOT_MARKER}")
    # the Node's cordon history as found: the tests after this one read it from its start
    if history is None:
        kubectl(f"annotate node {NODE} {AGENT_HISTORY}-")
    else:
        kubectl(f"annotate node {NODE} --overwrite {AGENT_HISTORY}={shlex.quote(history)}")
    try:
        wait_for("serving whole again", lambda: serving_whole() is None, 2 * POD_START_S)
    except AssertionError as error:
        errors.append(f"{error}: {serving_whole()}")
    assert not errors, "\n".join(errors)
    assert nvml() == runs(FROM[1])
    assert installed_of_branch(TO[0]) == [], f"{TO[0]} driver packages left on {NODE}"
    assert not (node_object().get("spec") or {}).get("unschedulable"), f"{NODE} left cordoned"


@pytest.fixture
def node_put_back(lab: None) -> Iterator[None]:
    had_marker = on_node(NODE, f"test -e {REBOOT_MARKER}").returncode == 0
    history = annotations(node_object()).get(AGENT_HISTORY)
    try:
        yield
    finally:
        put_back(had_marker, history)


# ------------------------------------------------------------------------------------------------- the test
def test_gpu_node_2_moves_to_580_under_traffic_one_node_then_back(node_put_back: None) -> None:
    # 1. before
    put_one_of_each_on_the_node()
    assert nvml() == runs(FROM[1])
    held_before = held()
    assert {f"nvidia-headless-{FROM[0]}", f"nvidia-utils-{FROM[0]}"} <= set(held_before), held_before
    assert serving_whole() is None, serving_whole()
    gateway_replicas = kube_json("-n", SERVING, "get", "deployment", GATEWAY)["spec"]["replicas"]
    assert gateway_replicas >= 2, f"the gateway runs {gateway_replicas} replica(s): a drain would stop it"
    assert not gpu_clients_missing(), gpu_clients_missing()
    clients_before = gpu_client_pods()
    print(f"\nserving pods before, by node: {placement()}")
    boot_before = boot_ids()
    assert boot_before[0] == boot_before[1], boot_before

    # 2. the plan, and nothing changed
    check = upgrade(*TO_580, *REBOOT, "--check")
    assert check.rc == 0, check.tail()
    out = flat(check.output)
    assert (
        "NVIDIA driver upgrade, one node at a time, in this order (the breaker allows 1 GPU node(s) out at "
        "once; cordoned by others now: none):"
    ) in out, check.tail()
    assert expected_plan(FROM, TO, reboot=True) in out, check.tail()
    assert "Note: R535 is past its end of life (June 2026); R580 is the supported upgrade path" in out
    assert "Check mode: nothing was changed; run without --check to upgrade." in out
    assert check.changed_nothing() and NODE in check.recap, check.changed_tasks()
    assert nvml() == runs(FROM[1]) and held() == held_before
    node = node_object()
    assert not (node.get("spec") or {}).get("unschedulable") and OWN_ANNOTATION not in annotations(node)

    # 3. the upgrade, under traffic
    began = time.time()
    with Traffic("lab-driver-upgrade", rebooting=NODE) as traffic, NodeWatch() as watch:
        run = upgrade(*TO_580, *REBOOT)
    print(
        f"upgrade: rc {run.rc}, {time.time() - began:.0f} s; chat completions sent {traffic.sent}, "
        f"failed {len(traffic.failures)}, turned away from {NODE} while down {len(traffic.turned_away)}"
        + "".join(f"\n  {f}" for f in traffic.failures)
        + "".join(f"\n  turned away: {t}" for t in traffic.turned_away)
    )
    print(f"serving pods after, by node: {placement()}")
    assert run.rc == 0, run.tail()
    assert not any(NODE in placement().get(name, []) for name in (GATEWAY, "vllm")), placement()  # drained
    # and the node's own NodePort answers again (a client turned away from it meanwhile comes back)
    wait_for(f"{NODE}'s NodePort answering", lambda: traffic.ask(chat_url(node_ips()[NODE])) is None, 60)
    assert run.changed()[NODE] > 0
    out = flat(run.output)
    assert f"{NODE}: driver {FROM[1]} -> {TO[1]}, verified through NVML, uncordoned." in out, run.tail()
    # rebooted once: a new boot id, read by the node and reported by its kubelet; its container started again
    boot_after = boot_ids()
    assert boot_after[0] == boot_after[1] != boot_before[0], (boot_before, boot_after)
    assert boot_after[2] == boot_before[2] + 1, (boot_before, boot_after)
    # the cluster's own GPU clients stopped for the driver work and started again, named
    stopping = ", ".join(
        f"{key.split('/')[0]}/{clients_before[key]['metadata']['name']}" for key in GPU_DAEMONSETS
    )
    label = ", ".join(GPU_LABEL)
    assert (
        f"Stopping the cluster's own GPU clients on {NODE} for the driver work, started again afterwards: "
        f"unit {AGENT_UNIT}.service; node label {label} removed, so the pods of the GPU DaemonSets leave: "
        f"{stopping}."
    ) in out, run.tail()
    assert (
        f"Started again the cluster's own GPU clients on {NODE}: unit {AGENT_UNIT}.service, "
        + ", ".join(f"DaemonSet {key}" for key in GPU_DAEMONSETS)
        + f" (node label {label} back)."
    ) in out, run.tail()
    # seen from the cluster meanwhile: cordoned with this playbook's mark, then out of the GPU node label
    assert any(
        cordoned and mark.startswith("cordoned by upgrade-driver.yml for the driver-upgrade at ")
        for cordoned, mark, _ in watch.seen
    ), watch.seen
    assert any(cordoned and not labelled for cordoned, _, labelled in watch.seen), watch.seen

    # 4. after
    assert nvml() == runs(TO[1])  # 580.95.05, CUDA 13000, NVML 13.580.95.05, every GPU
    state = json.loads(sh(NODE, "fake-nvml show --json"))
    assert (state["kernel_module_version"], state["cuda_driver_version"]) == (TO[1], CUDA[TO[1]])
    driver_holds = [name for name in held() if ANY_BRANCH.match(name)]
    assert {f"nvidia-headless-{TO[0]}", f"nvidia-utils-{TO[0]}"} <= set(driver_holds), driver_holds
    assert [name for name in driver_holds if not branch_pattern(TO[0]).match(name)] == [], driver_holds
    assert installed_of_branch(FROM[0]) == [], f"{FROM[0]} driver packages left"
    pin = sh(NODE, f"cat {PIN_FILE}")
    assert f"NVIDIA driver {TO[0]} pinned to {TO[1]}" in pin and f"Pin: version {TO[1]}-*" in pin, pin
    (package_line,) = [line for line in pin.splitlines() if line.startswith("Package: /")]
    assert f"-{TO[0]}(" in package_line and FROM[0] not in package_line, package_line
    assert on_node(NODE, f"test -e {REBOOT_MARKER}").returncode != 0, f"{REBOOT_MARKER} left by a reboot"
    wait_for(f"the GPU clients back on {NODE}", lambda: not gpu_clients_missing(), PLUGIN_POD_START_S)
    node = node_object()
    assert not (node.get("spec") or {}).get("unschedulable"), f"{NODE} left cordoned"
    marks = annotations(node)
    assert OWN_ANNOTATION not in marks and AGENT_CORDON not in marks, marks
    history = json.loads(marks.get(AGENT_HISTORY, "[]"))
    assert history and history[-1]["action"] == "driver-upgrade" and history[-1]["by"] == "upgrade-driver.yml"

    again = upgrade(*TO_580, *REBOOT, "--check")
    assert again.rc == 0, again.tail()
    out = flat(again.output)
    assert "Nothing to do: every node of the run runs its nvidia_driver_version." in out, again.tail()
    assert f"{NODE} (1 of 1): driver {TO[1]} already: nothing" in out, again.tail()
    assert again.changed_nothing() and NODE in again.recap, again.changed_tasks()

    # Every request answered by the model: the drain takes at most one gateway pod (its budget keeps one
    # Ready) and one model replica (the other serves), and the gateway and kube-proxy stop sending to a pod
    # once it is terminating. A failure here at the drain, refused or the fallback's "unreachable", would be a
    # pod that stopped listening at SIGTERM before kube-proxy took its endpoint out (neither the gateway's
    # Deployment nor the model's StatefulSet has a preStop delay): a serving defect the upgrade shows, not one
    # to tolerate here.
    assert traffic.sent > 0
    assert traffic.failures == [], f"{len(traffic.failures)} of {traffic.sent} requests failed"
