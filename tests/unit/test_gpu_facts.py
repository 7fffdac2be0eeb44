"""gpu_facts on both machine shapes, with unsupported values and unreadable GPUs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gpu_facts
import pytest
from ansible.module_utils import gpu_host
from conftest import FakeNode, run_module
from test_gpu_host import add_pci, add_process

GPU_KEYS = {
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "memory_total_mib",
    "persistence_mode",
    "power",
    "temperature",
    "ecc",
    "remapped_rows",
    "retired_pages",
    "nvlinks",
}


@pytest.fixture(autouse=True)
def host_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Empty fake /proc and /sys/bus/pci/devices for every test; tests add processes and devices."""
    proc, pci = tmp_path / "proc", tmp_path / "pci-devices"
    proc.mkdir()
    pci.mkdir()
    monkeypatch.setattr(gpu_host, "PROC_ROOT", str(proc))
    monkeypatch.setattr(gpu_host, "PCI_DEVICES_DIR", str(pci))
    return proc, pci


def facts() -> dict[str, Any]:
    failed, result = run_module(gpu_facts)
    assert not failed, result["msg"]
    assert result["changed"] is False
    return result["ansible_facts"]["nvidia"]


def test_reports_every_gpu_with_the_issue_keys(node: FakeNode) -> None:
    nvidia = facts()
    assert nvidia["driver_version"] == "535.183.06"
    assert nvidia["cuda_driver_version"] == "12.2"
    assert nvidia["gpu_count"] == node.gpu_count == len(nvidia["gpus"])
    for index, gpu in enumerate(nvidia["gpus"]):
        assert set(gpu) >= GPU_KEYS
        assert gpu["index"] == index
        assert gpu["uuid"].startswith("GPU-")
        assert gpu["memory_total_mib"] == 40960
        assert gpu["persistence_mode"] is False
        assert set(gpu["power"]) >= {
            "limit_w",
            "default_limit_w",
            "min_limit_w",
            "max_limit_w",
            "enforced_limit_w",
            "draw_w",
        }
        assert set(gpu["temperature"]) >= {"gpu_c", "slowdown_c", "shutdown_c"}
        assert gpu["temperature"]["slowdown_c"] == 89 and gpu["temperature"]["shutdown_c"] == 92
        assert gpu["ecc"] == {
            "enabled": True,
            "pending_enabled": True,
            "volatile_corrected": 0,
            "volatile_uncorrected": 0,
            "aggregate_corrected": 0,
            "aggregate_uncorrected": 0,
        }
        assert gpu["remapped_rows"] == {
            "correctable": 0,
            "uncorrectable": 0,
            "pending": False,
            "failure": False,
            "histogram": {"max": 640, "high": 0, "partial": 0, "low": 0, "none": 0},
        }
        assert gpu["retired_pages"] is None  # A100 remaps rows instead
        assert gpu["recovery_action"] is None  # a 535 driver does not report it
        assert gpu["temperature"]["target_c"] is None  # unsupported on A100
        assert gpu["error"] is None
        assert len(gpu["nvlinks"]) == 12 and all(link["active"] for link in gpu["nvlinks"])
    assert len({g["uuid"] for g in nvidia["gpus"]}) == node.gpu_count


def test_pcie_shape(pcie_node: FakeNode) -> None:
    nvidia = facts()
    gpu0 = nvidia["gpus"][0]
    assert gpu0["name"] == "NVIDIA A100-PCIE-40GB"
    assert gpu0["pci_bus_id"] == "00000000:17:00.0"
    assert gpu0["power"]["limit_w"] == 250 and gpu0["power"]["default_limit_w"] == 250
    assert (gpu0["power"]["min_limit_w"], gpu0["power"]["max_limit_w"]) == (150, 250)
    assert isinstance(gpu0["power"]["draw_w"], float | int) and 30 < gpu0["power"]["draw_w"] < 60
    assert {link["remote_gpu_index"] for link in gpu0["nvlinks"]} == {1}
    assert {link["remote_device_type"] for link in gpu0["nvlinks"]} == {"gpu"}
    assert {link["remote_pci_bus_id"] for link in nvidia["gpus"][2]["nvlinks"]} == {"00000000:CA:00.0"}
    assert nvidia["topology"] == [
        ["X", "NV12", "SYS", "SYS"],
        ["NV12", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "NV12"],
        ["SYS", "SYS", "NV12", "X"],
    ]


def test_hgx_shape_links_end_on_nvswitches(hgx_node: FakeNode) -> None:
    nvidia = facts()
    assert nvidia["gpu_count"] == 8
    gpu = nvidia["gpus"][5]
    assert gpu["name"] == "NVIDIA A100-SXM4-40GB"
    assert (gpu["power"]["min_limit_w"], gpu["power"]["max_limit_w"], gpu["power"]["limit_w"]) == (
        100,
        400,
        400,
    )
    assert all(link["remote_gpu_index"] is None for link in gpu["nvlinks"])
    assert {link["remote_device_type"] for link in gpu["nvlinks"]} == {"switch"}
    assert len({link["remote_pci_bus_id"] for link in gpu["nvlinks"]}) == 6
    for i, row in enumerate(nvidia["topology"]):
        assert row == ["X" if i == j else "NV12" for j in range(8)]


def test_uuids_derive_from_the_host_name(make_node: Any) -> None:
    make_node(host="gpu-node-1")
    first = [g["uuid"] for g in facts()["gpus"]]
    make_node(host="gpu-node-1")
    assert [g["uuid"] for g in facts()["gpus"]] == first
    make_node(host="gpu-node-2")
    assert not set(first) & {g["uuid"] for g in facts()["gpus"]}


def test_link_down_lowers_the_nv_count(pcie_node: FakeNode) -> None:
    assert pcie_node.ctl("link", "--gpu", "2", "--link", "5", "--down") == 0
    nvidia = facts()
    assert nvidia["topology"][2][3] == "NV11" and nvidia["topology"][3][2] == "NV11"
    assert [link["active"] for link in nvidia["gpus"][3]["nvlinks"]].count(False) == 1


def test_pair_without_links_falls_back_to_pcie_level(pcie_node: FakeNode) -> None:
    for link in range(12):
        pcie_node.ctl("link", "--gpu", "0", "--link", str(link), "--down")
    assert facts()["topology"][0][1] == "NODE"


def test_hgx_pcie_levels_when_switch_links_are_down(hgx_node: FakeNode) -> None:
    def all_down(state: dict[str, Any]) -> None:
        for gpu in state["gpus"]:
            for link in gpu["nvlinks"]:
                link["active"] = False

    hgx_node.edit(all_down)
    topology = facts()["topology"]
    assert topology[0][1] == "PXB" and topology[0][2] == "NODE" and topology[0][4] == "SYS"


def test_lost_gpu_is_reported_not_a_crash(node: FakeNode) -> None:
    node.ctl("gpu", "--gpu", "1", "--lost")
    failed, result = run_module(gpu_facts)
    assert not failed
    nvidia = result["ansible_facts"]["nvidia"]
    lost = nvidia["gpus"][1]
    assert lost["uuid"] is None and "GPU is lost" in lost["error"] and "Xid 79" in lost["error"]
    assert nvidia["gpus"][0]["error"] is None
    assert nvidia["topology"][0][1] is None and nvidia["topology"][1][1] == "X"
    assert any("GPU 1" in w and "lost" in w for w in result["warnings"])


def test_removed_gpu_renumbers_like_the_driver(pcie_node: FakeNode) -> None:
    uuid_of_slot3 = facts()["gpus"][3]["uuid"]
    pcie_node.ctl("gpu", "--gpu", "1", "--remove")
    nvidia = facts()
    assert nvidia["gpu_count"] == 3
    assert nvidia["gpus"][2]["uuid"] == uuid_of_slot3
    # GPU 0's bridge partner is gone: its links lead nowhere on this node.
    assert {link["remote_gpu_index"] for link in nvidia["gpus"][0]["nvlinks"]} == {None}


def test_function_missing_in_the_driver_is_null(pcie_node: FakeNode) -> None:
    pcie_node.edit(
        lambda s: s.update(missing_functions=["nvmlDeviceGetRemappedRows", "nvmlDeviceGetPowerUsage"])
    )
    gpu = facts()["gpus"][0]
    assert gpu["remapped_rows"] is None
    assert gpu["power"]["draw_w"] is None
    assert gpu["power"]["limit_w"] == 250


def test_ecc_disabled_gives_null_counters(pcie_node: FakeNode) -> None:
    pcie_node.edit(lambda s: s["gpus"][0]["ecc"].update(current=0, pending=0))
    ecc = facts()["gpus"][0]["ecc"]
    assert ecc["enabled"] is False and ecc["volatile_uncorrected"] is None


def test_retired_pages_where_the_gpu_retires_pages(pcie_node: FakeNode) -> None:
    pages = {"single_bit": [4096, 8192], "double_bit": [12288], "pending": 1}
    pcie_node.edit(lambda s: s["gpus"][0].update(retired_pages=pages, remapped_rows=None))
    gpu = facts()["gpus"][0]
    assert gpu["retired_pages"] == {"single_bit_ecc": 2, "double_bit_ecc": 1, "pending": True}
    assert gpu["remapped_rows"] is None


def test_processes_are_listed(pcie_node: FakeNode) -> None:
    pcie_node.ctl("process", "--gpu", "0", "--pid", "4242", "--add", "--used-mib", "2048")
    gpu = facts()["gpus"][0]
    assert gpu["processes"] == [{"pid": 4242, "used_memory_mib": 2048}]
    assert gpu["memory_used_mib"] == 2048


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("no_library", "the NVIDIA driver is not installed"),
        ("mismatch", "Driver/library version mismatch"),
        ("no_state", "kernel module not loaded"),
    ],
)
def test_nvml_start_failures_are_explained(pcie_node: FakeNode, fault: str, expected: str) -> None:
    if fault == "no_library":
        pcie_node.remove_library()
    elif fault == "mismatch":
        pcie_node.ctl("kernel-version", "550.54.15")
    else:
        pcie_node.state_path.unlink()
    failed, result = run_module(gpu_facts)
    assert failed
    assert expected in result["msg"]
    if fault == "mismatch":
        assert "reboot" in result["msg"] and "modprobe" in result["msg"]


def test_gpu_users_and_nvswitches_next_to_the_nvml_facts(
    pcie_node: FakeNode, host_tree: tuple[Path, Path]
) -> None:
    proc, pci = host_tree
    add_process(proc, 300, "vllm", {4: "/dev/nvidia0", 5: "/dev/nvidiactl"})
    add_process(proc, 12, "nvidia-persiste", {3: "/dev/nvidiactl"})
    nvidia = facts()
    assert nvidia["driver_version"] == "535.183.06"
    assert [(p["pid"], p["name"], p["driver_daemon"]) for p in nvidia["device_processes"]] == [
        (12, "nvidia-persiste", True),
        (300, "vllm", False),
    ]
    # PCIe cards with NVLink bridges: no NVSwitch anywhere
    assert nvidia["nvswitches"] == {"present": False, "pci_devices": [], "nvml_links": 0}
    add_pci(pci, "0000:c4:00.0", "0x10de", "0x068000")
    assert facts()["nvswitches"] == {"present": True, "pci_devices": ["0000:c4:00.0"], "nvml_links": 0}


def test_hgx_nvswitches_seen_through_nvml_links_up_or_down(hgx_node: FakeNode) -> None:
    assert facts()["nvswitches"] == {"present": True, "pci_devices": [], "nvml_links": 96}

    def all_down(state: dict[str, Any]) -> None:
        for gpu in state["gpus"]:
            for link in gpu["nvlinks"]:
                link["active"] = False

    hgx_node.edit(all_down)  # before fabric manager runs
    assert facts()["nvswitches"]["present"] is True


@pytest.mark.parametrize("fault", ["no_library", "mismatch", "no_pynvml"])
def test_nvml_false_needs_no_working_nvml(
    pcie_node: FakeNode, host_tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    proc, pci = host_tree
    add_process(proc, 77, "python3", {4: "/dev/nvidia-uvm"})
    add_pci(pci, "0000:07:00.0", "0x10de", "0x068000")
    if fault == "no_library":
        pcie_node.remove_library()
    elif fault == "mismatch":
        pcie_node.ctl("kernel-version", "550.54.15")
    else:
        monkeypatch.setitem(sys.modules, "pynvml", None)
    assert run_module(gpu_facts)[0], "with nvml (the default) the module still fails"
    failed, result = run_module(gpu_facts, {"nvml": False})
    assert not failed and result["changed"] is False
    assert result["nvml_venv"] == "/opt/nvidia-ml-py"
    nvidia = result["ansible_facts"]["nvidia"]
    assert set(nvidia) == {"device_processes", "nvswitches", "nvml_venv"}
    assert nvidia["nvml_venv"] == result["nvml_venv"]
    assert [p["pid"] for p in nvidia["device_processes"]] == [77]
    assert nvidia["nvswitches"] == {"present": True, "pci_devices": ["0000:07:00.0"], "nvml_links": None}
