"""gpu_reset (issue 20): the pods that use a GPU and its NVLink peers, the refusal while anything holds it,
the reset through nvidia-smi (the lab's stand-in, which applies it to the fake NVML), and the Xids it clears;
gpu_host.gpu_pods from a fake /proc."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import gpu_reset
import pytest
from ansible.module_utils import gpu_host, gpu_kernel_log
from conftest import FAKE_NVML_DIR, ROOT, FakeNode, run_module

POD_A = "11111111-2222-3333-4444-555555555555"
POD_B = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def add_pod_process(proc: Path, pid: int, pod: str, visible: str | None, fds: dict[int, str]) -> None:
    directory = proc / str(pid)
    (directory / "fd").mkdir(parents=True)
    (directory / "comm").write_text("vllm\n")
    slice_name = f"kubepods-besteffort-pod{pod.replace('-', '_')}.slice"
    (directory / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-besteffort.slice/{slice_name}/cri-x.scope\n"
    )
    environ = [b"PATH=/usr/bin"] + ([f"NVIDIA_VISIBLE_DEVICES={visible}".encode()] if visible else [])
    (directory / "environ").write_bytes(b"\0".join(environ) + b"\0")
    for fd, target in fds.items():
        os.symlink(target, directory / "fd" / str(fd))


def test_the_pods_that_use_each_gpu(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    add_pod_process(proc, 10, POD_A, "GPU-aaaa,GPU-bbbb", {})  # given two GPUs, opened none yet
    add_pod_process(proc, 11, POD_B, None, {4: "/dev/nvidia3", 5: "/dev/nvidiactl"})  # holds GPU 3
    add_pod_process(proc, 12, POD_B, "2", {})
    pods = gpu_host.gpu_pods(str(proc))
    assert pods[POD_A] == {"visible": ["GPU-aaaa", "GPU-bbbb"], "devices": [], "pids": [10]}
    assert pods[POD_B] == {"visible": ["2"], "devices": ["/dev/nvidia3"], "pids": [11, 12]}
    assert gpu_host.pod_uses_gpu(pods[POD_A], 0, "GPU-bbbb", 0)
    assert not gpu_host.pod_uses_gpu(pods[POD_A], 1, "GPU-cccc", 1)
    assert gpu_host.pod_uses_gpu(pods[POD_B], 3, "GPU-dddd", 3) and gpu_host.pod_uses_gpu(
        pods[POD_B], 2, "x", 2
    )
    assert gpu_host.pod_uses_gpu({"visible": ["all"]}, 7, "GPU-x", 7)


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """nvidia-smi on PATH: the lab's stand-in, resetting through fake-nvml gpu-reset."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ctl = bin_dir / "fake-nvml"
    ctl.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_NVML_DIR / "fake_nvml_ctl.py"} "$@"\n')
    payload = ROOT / "tests" / "lab" / "mirror" / "payloads" / "nvidia-smi"
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\nexec {sys.executable} {payload} "$@"\n')
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(FAKE_NVML_DIR))
    monkeypatch.setenv("FAKE_NVML_CTL", str(ctl))
    monkeypatch.setattr(gpu_kernel_log, "CLEARED_FILE", str(tmp_path / "xid-cleared.json"))
    monkeypatch.setattr(
        gpu_reset, "gpu_pods", lambda: {POD_A: {"visible": ["1"], "devices": [], "pids": [9]}}
    )
    return bin_dir


def reset(node: FakeNode, **args: Any) -> tuple[bool, dict[str, Any]]:
    return run_module(gpu_reset, {"kernel_log": str(node.kmsg_path), **args})


def test_planned_names_the_pods_and_the_nvlink_peers(pcie_node: FakeNode, smi: Path) -> None:
    failed, result = reset(pcie_node, gpus=["0"], state="planned")
    assert not failed and result["changed"] is False
    (gpu,) = result["gpus"]
    assert (gpu["index"], gpu["minor"], gpu["nvlink_peers"], gpu["pods"]) == (0, 0, [1], [])
    assert result["peer_pods"] == [POD_A]  # its bridge partner's pod: drained for the drain actions
    failed, result = reset(pcie_node, gpus=[pcie_node.gpu(1)["uuid"]], state="planned")
    assert result["gpus"][0]["pods"] == [POD_A] and result["peer_pods"] == []


def test_reset_clears_the_fault_and_its_xids(pcie_node: FakeNode, smi: Path) -> None:
    pcie_node.ctl("xid", "--gpu", "2", "--xid", "95")
    pcie_node.ctl("xid", "--gpu", "3", "--xid", "13")
    failed, result = run_module(
        gpu_reset, {"gpus": ["2"], "kernel_log": str(pcie_node.kmsg_path)}, check_mode=True
    )
    assert not failed and result["changed"] is True and result["reset"] == []
    assert pcie_node.gpu(2)["remapped_rows"]["pending"] == 1  # check mode: nothing done
    failed, result = reset(pcie_node, gpus=["00000000:B1:00.0"])
    assert not failed, result["msg"]
    assert result["reset"] == [pcie_node.gpu(2)["uuid"]] and result["cleared_seq"] == 2
    assert result["health"]["verdict"] == "healthy" and result["health"]["action"] == "none"
    assert [x["xid"] for x in result["health"]["gpus"][3]["xids"]] == [13]  # another GPU's: not cleared
    assert pcie_node.gpu(2)["ecc"]["volatile"]["uncorrected"] == 0
    assert gpu_kernel_log.load_cleared() == {"00000000:B1:00.0": 2}


def test_refused_while_a_process_holds_the_gpu(
    pcie_node: FakeNode, smi: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pcie_node.ctl("process", "--gpu", "1", "--pid", "4242", "--add")
    failed, result = reset(pcie_node, gpus=["1"])
    assert failed and "Not resetting: processes hold the GPU(s): GPU 1: pid 4242" in result["msg"]
    pcie_node.ctl("process", "--gpu", "1", "--clear")
    holder = {
        "pid": 77,
        "name": "python3",
        "user": "root",
        "devices": ["/dev/nvidia1"],
        "driver_daemon": False,
        "unit": None,
        "pod_uid": POD_A,
    }
    daemon = {**holder, "pid": 5, "name": "nvidia-persiste", "driver_daemon": True, "pod_uid": None}
    monkeypatch.setattr(gpu_reset, "device_processes", lambda exclude_pids=(): [daemon, holder])
    failed, result = reset(pcie_node, gpus=["1"])
    assert failed and f"GPU 1: python3[77] (pod {POD_A})" in result["msg"] and "persiste" not in result["msg"]


def test_a_gpu_off_the_bus_is_for_a_reboot(pcie_node: FakeNode, smi: Path) -> None:
    pcie_node.ctl("xid", "--gpu", "3", "--xid", "79")
    failed, result = reset(pcie_node, gpus=["3"])
    assert failed and "GPU is lost" in result["msg"] and "node-reboot.yml" in result["msg"]
    failed, result = reset(pcie_node, gpus=["9"])
    assert failed and result["msg"].startswith("gpus: no GPU 9")
