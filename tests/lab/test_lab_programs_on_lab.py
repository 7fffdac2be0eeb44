"""The lab's own programs (tests/lab/gobuild/lab-programs) with the real kubelet, API server and kube-router.

- nvidia-device-plugin: every GPU node offers its fake NVML's GPUs (capacity and allocatable); a pod asking
  for 2 GPUs in the RuntimeClass gets NVIDIA_VISIBLE_DEVICES with two of the node's UUIDs, an NVLink-bridged
  pair (the kubelet asked GetPreferredAllocation); a GPU lost on the bus leaves allocatable one short and
  stays so after it is restored, until the plugin's pod is replaced, as with NVIDIA's plugin.
- calico-standin: calico-node is Ready on every node through its real probes (kube-router's /healthz), and
  the conflist it installed carries the node's podCIDR, written in by kube-router; calico-kube-controllers is
  Ready.

Needs a converged lab (make lab) whose images hold these programs.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from labrun import ADMIN_KUBECTL, NODES, PLUGIN_SELECTOR, ROOT, kube_json, on_node, take_back_agent_cordons

pytestmark = pytest.mark.lab

CONTROL_PLANE = NODES[0]
FAULT_NODE = NODES[2]
RUNTIME_CLASS = yaml.safe_load((ROOT / "roles/nvidia_device_plugin/defaults/main.yml").read_text())[
    "nvidia_device_plugin_runtime_class"
]
KUBERNETES_VERSION = yaml.safe_load((ROOT / "roles/kubernetes/defaults/main.yml").read_text())[
    "kubernetes_version"
]
PROBE_POD = "lab-programs-gpu-probe"


def sh(node: str, command: str) -> str:
    proc = on_node(node, command)
    assert proc.returncode == 0, f"{node}: {command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def kubectl(*args: str, stdin: str | None = None) -> str:
    command = f"{ADMIN_KUBECTL} {shlex.join(args)}"
    if stdin is not None:
        command = f"printf '%s' {shlex.quote(stdin)} | {command}"
    return sh(CONTROL_PLANE, command)


def wait_for(what: str, check: Callable[[], bool], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(2)


def gpus(node: str, field: str = "allocatable") -> str:
    return kube_json("get", "node", node)["status"][field].get("nvidia.com/gpu", "absent")


def nvml_state(node: str) -> dict[str, Any]:
    return json.loads(sh(node, "fake-nvml show --json"))


def present_gpus(node: str) -> int:
    return sum(1 for gpu in nvml_state(node)["gpus"] if gpu.get("present", True) and not gpu.get("lost"))


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def test_every_gpu_node_offers_its_gpus() -> None:
    for node in NODES:
        count = str(present_gpus(node))
        wait_for(f"{node} offering {count} GPUs", lambda node=node, count=count: gpus(node) == count)
        assert gpus(node, "capacity") == count
    for pod in kube_json("get", "pods", "-n", "kube-system", "-l", PLUGIN_SELECTOR)["items"]:
        log = kubectl("logs", "-n", "kube-system", pod["metadata"]["name"])
        assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in log, log


@pytest.fixture
def probe_pod() -> Iterator[dict[str, Any]]:
    images = sh(CONTROL_PLANE, f"kubeadm config images list --kubernetes-version v{KUBERNETES_VERSION}")
    pause = next(image for image in images.split() if "/pause:" in image)
    spec = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": PROBE_POD, "namespace": "default"},
        "spec": {
            "nodeName": FAULT_NODE,
            "runtimeClassName": RUNTIME_CLASS,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [
                {"name": "probe", "image": pause, "resources": {"limits": {"nvidia.com/gpu": "2"}}}
            ],
        },
    }
    kubectl("apply", "--validate=strict", "-f", "-", stdin=json.dumps(spec))
    try:
        wait_for(f"{PROBE_POD} Ready", lambda: ready(kube_json("get", "pod", "-n", "default", PROBE_POD)))
        yield kube_json("get", "pod", "-n", "default", PROBE_POD)
    finally:
        kubectl("delete", "pod", "-n", "default", PROBE_POD, "--ignore-not-found", "--wait=true")


def test_a_gpu_pod_gets_an_nvlink_pair_by_envvar(probe_pod: dict[str, Any]) -> None:
    container = sh(
        FAULT_NODE, f"crictl ps --name probe --label io.kubernetes.pod.name={PROBE_POD} -q"
    ).split()
    assert len(container) == 1, container
    envs = json.loads(sh(FAULT_NODE, f"crictl inspect {container[0]}"))["info"]["config"]["envs"]
    visible = [e["value"] for e in envs if e["key"] == "NVIDIA_VISIBLE_DEVICES"]
    assert len(visible) == 1, envs
    uuids = visible[0].split(",")
    slots = {gpu["uuid"]: gpu["slot"] for gpu in nvml_state(FAULT_NODE)["gpus"]}
    assert len(uuids) == 2 and all(u in slots for u in uuids), (uuids, slots)
    assert {slots[u] for u in uuids} in ({0, 1}, {2, 3}), f"not an NVLink-bridged pair: {uuids}"


def test_a_lost_gpu_stays_unhealthy_until_the_plugin_restarts() -> None:
    count = present_gpus(FAULT_NODE)
    saved = sh(FAULT_NODE, "fake-nvml show --json")
    sh(FAULT_NODE, "fake-nvml gpu --gpu 3 --lost")
    try:
        wait_for("allocatable one short", lambda: gpus(FAULT_NODE) == str(count - 1))
        assert gpus(FAULT_NODE, "capacity") == str(count)
        sh(FAULT_NODE, "fake-nvml gpu --gpu 3 --restore")
        time.sleep(10)  # five polls of the plugin
        assert gpus(FAULT_NODE) == str(count - 1), "NVIDIA's plugin never marks a GPU Healthy again"
    finally:
        on_node(FAULT_NODE, f"printf '%s' {shlex.quote(saved)} | fake-nvml load -")
        kubectl("delete", "pod", "-n", "kube-system", "-l", PLUGIN_SELECTOR, "--field-selector",
                f"spec.nodeName={FAULT_NODE}", "--wait=true")  # fmt: skip
        take_back_agent_cordons()
    wait_for(f"{FAULT_NODE} offering {count} GPUs again", lambda: gpus(FAULT_NODE) == str(count))


def test_calico_pods_run_kube_router() -> None:
    pods = kube_json("get", "pods", "-n", "kube-system", "-l", "k8s-app=calico-node")["items"]
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(NODES)
    for pod in pods:
        node = pod["spec"]["nodeName"]
        wait_for(f"calico-node on {node} Ready", lambda name=pod["metadata"]["name"]: ready(
            kube_json("get", "pod", "-n", "kube-system", name)))  # fmt: skip
        conflist = json.loads(sh(node, "cat /etc/cni/net.d/10-calico.conflist"))
        bridge = next(p for p in conflist["plugins"] if p["type"] == "bridge")
        subnets = {r["subnet"] for ranges in bridge["ipam"]["ranges"] for r in ranges}
        assert subnets == set(kube_json("get", "node", node)["spec"]["podCIDRs"]), (node, bridge)
    controllers = kube_json("get", "pods", "-n", "kube-system", "-l", "k8s-app=calico-kube-controllers")[
        "items"
    ]
    assert controllers and all(ready(p) for p in controllers)
