"""The lab kubelet's GPU client processes (tests/lab/kube/kube_standin/gpuclients.py): while a device
plugin or dcgm-exporter pod runs Ready on the node, a process named like the real binary holds the GPU
control device open, as the real ones keep NVML open, so the lab's `modprobe -r nvidia` is refused under
them and gpu_facts lists them; it ends when the pod leaves the node. Under systemd it runs in the pod's
slice as the kubelet's systemd cgroup driver names it (checked here by name: this machine runs no systemd;
the lab test test_remediation_on_lab.py sees the cgroup)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "lab" / "kube"))
from kube_standin import gpuclients  # noqa: E402 - the stand-in package lives in tests/lab/kube

UID = "2b7f3c1e-5d2a-4c7b-9f0e-1a2b3c4d5e6f"


def pod(uid: str, image: str, qos: str = "BestEffort") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": f"p-{uid[:4]}", "namespace": "kube-system"},
        "spec": {"containers": [{"name": "c", "image": image}]},
        "status": {"phase": "Running", "qosClass": qos},
    }


def holders_of(device: Path) -> dict[int, str]:
    """pid -> comm of the processes holding ``device`` open (as gpu_facts reads /proc)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            targets = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
        if str(device) in targets:
            found[int(entry)] = comm
    return found


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[gpuclients.GpuClientProcesses]:
    made = gpuclients.GpuClientProcesses(
        str(tmp_path / "holders"), str(tmp_path / "nvidiactl"), use_systemd=False
    )
    yield made
    for uid, record in made.running().items():
        made.stop(uid, record)


def test_a_process_holds_the_gpus_while_a_gpu_client_pod_runs(clients: gpuclients.GpuClientProcesses) -> None:
    device = Path(clients.device)
    plugin = pod(UID, "nvcr.io/nvidia/k8s-device-plugin:v0.20.0")
    dcgm = pod(
        "aaaaaaaa-1111-2222-3333-444444444444", "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless"
    )
    other = pod("bbbbbbbb-1111-2222-3333-444444444444", "registry.k8s.io/kube-proxy:v1.36.3")
    clients.sync([plugin, dcgm, other], lambda p: True)
    assert sorted(holders_of(device).values()) == ["dcgm-exporter", "nvidia-device-p"]
    assert set(clients.running()) == {UID, dcgm["metadata"]["uid"]}
    first = dict(holders_of(device))
    clients.sync([plugin, dcgm, other], lambda p: True)  # steady: the same processes
    assert holders_of(device) == first
    # the plugin's pod leaves the node (or is not Ready): its process ends, dcgm-exporter's stays
    clients.sync([plugin, dcgm], lambda p: p is dcgm)
    deadline = time.monotonic() + 10
    while "nvidia-device-p" in holders_of(device).values() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(holders_of(device).values()) == ["dcgm-exporter"]
    assert set(clients.running()) == {dcgm["metadata"]["uid"]}
    # back: a new process
    clients.sync([plugin, dcgm], lambda p: True)
    assert sorted(holders_of(device).values()) == ["dcgm-exporter", "nvidia-device-p"]


def test_a_restarted_kubelet_finds_the_processes_it_started(clients: gpuclients.GpuClientProcesses) -> None:
    plugin = pod(UID, "nvcr.io/nvidia/k8s-device-plugin:v0.20.0")
    clients.sync([plugin], lambda p: True)
    again = gpuclients.GpuClientProcesses(clients.holder_dir, clients.device, use_systemd=False)
    assert again.running() == clients.running() and len(again.running()) == 1
    again.sync([], lambda p: True)
    assert again.running() == {} and holders_of(Path(clients.device)) == {}


@pytest.mark.parametrize(
    ("qos", "slice_name"),
    [
        ("BestEffort", "kubepods-besteffort-pod2b7f3c1e_5d2a_4c7b_9f0e_1a2b3c4d5e6f.slice"),
        ("Burstable", "kubepods-burstable-pod2b7f3c1e_5d2a_4c7b_9f0e_1a2b3c4d5e6f.slice"),
        ("Guaranteed", "kubepods-pod2b7f3c1e_5d2a_4c7b_9f0e_1a2b3c4d5e6f.slice"),
    ],
)
def test_the_pods_slice_is_named_as_the_kubelet_names_it(qos: str, slice_name: str) -> None:
    """The names gpu_facts reads back (module_utils/gpu_host.py, POD_CGROUP) from /proc/PID/cgroup."""
    from ansible.module_utils.gpu_host import POD_CGROUP

    assert gpuclients.pod_slice(UID, qos) == slice_name
    match = POD_CGROUP.match(slice_name)
    assert match and match["uid"].replace("_", "-") == UID
