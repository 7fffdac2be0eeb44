"""fake-nvml's Xids (issue 20): each Xid injected with its kernel-log record in the real format, the NVML
event the driver raises for it and what it does to the GPU's state; the recovery action of R565 drivers, the
row-remap histogram, and what a GPU reset (nvidia-smi -r) does to the state."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pynvml
import pytest
from ansible.module_utils.gpu_kernel_log import read_log
from ansible.module_utils.gpu_xid import parse_record
from conftest import FAKE_NVML_DIR, ROOT, FakeNode


@pytest.fixture
def nvml(pcie_node: FakeNode) -> Any:
    pynvml.nvmlInit()
    yield pynvml
    pynvml.nvmlShutdown()


def xids(node: FakeNode) -> list[tuple[int, str, int | None]]:
    events, _ = read_log(str(node.kmsg_path))
    return [(e.xid, e.pci_bus_id, e.seq) for e in events]


def test_an_xid_is_logged_in_the_kernel_log_format(pcie_node: FakeNode) -> None:
    assert pcie_node.ctl("xid", "--gpu", "2", "--xid", "95") == 0
    assert pcie_node.ctl("xid", "--gpu", "2", "--xid", "13", "--pid", "4242", "--name", "vllm") == 0
    lines = pcie_node.kmsg_path.read_text().splitlines()
    assert len(lines) == 2
    prefix, message = lines[0].split(";", 1)
    priority, seq, usec, flags = prefix.split(",")
    assert priority.isdigit() and int(usec) > 0 and flags == "-"
    assert message.startswith("NVRM: Xid (PCI:0000:b1:00): 95, pid='<unknown>', name=<unknown>, Uncontained")
    assert "NVRM: Xid (PCI:0000:b1:00): 13, pid=4242, name=vllm, Graphics" in lines[1]
    assert xids(pcie_node) == [(95, "00000000:B1:00.0", int(seq)), (13, "00000000:B1:00.0", int(seq) + 1)]
    event = parse_record(lines[1])
    assert event is not None and (event.pid, event.process) == ("4242", "vllm")


@pytest.mark.parametrize(
    ("xid", "check"),
    [
        (94, lambda g: g["ecc"]["volatile"]["uncorrected"] == 1 and g["remapped_rows"]["pending"] == 1),
        (95, lambda g: g["ecc"]["volatile"]["uncorrected"] == 1 and g["remapped_rows"]["pending"] == 1),
        (48, lambda g: g["ecc"]["volatile"]["uncorrected"] == 1 and g["remapped_rows"]["pending"] == 0),
        (63, lambda g: g["remapped_rows"]["pending"] == 1 and g["ecc"]["volatile"]["uncorrected"] == 0),
        (64, lambda g: g["remapped_rows"]["failure"] == 1 and g["remapped_rows"]["histogram"]["none"] == 1),
        (79, lambda g: g["lost"] is True),
        (74, lambda g: g["nvlinks"][0]["active"] is False),
        (13, lambda g: g["ecc"]["volatile"]["uncorrected"] == 0 and not g["lost"]),
    ],
)
def test_an_xid_does_to_the_gpu_what_the_fault_does(pcie_node: FakeNode, xid: int, check: Any) -> None:
    before = pcie_node.gpu(1)
    assert pcie_node.ctl("xid", "--gpu", "1", "--xid", str(xid)) == 0
    assert check(pcie_node.gpu(1)), pcie_node.gpu(1)
    if xid == 74:  # a bridge link has two ends
        assert pcie_node.gpu(0)["nvlinks"][0]["active"] is False
    assert pcie_node.ctl("xid", "--gpu", "3", "--xid", str(xid), "--log-only") == 0
    assert pcie_node.gpu(3)["ecc"] == before["ecc"] and not pcie_node.gpu(3)["lost"]


def test_the_event_set_sees_the_xids_queued_after_it(pcie_node: FakeNode, nvml: Any) -> None:
    pcie_node.ctl("xid", "--gpu", "0", "--xid", "43")  # before the set: not delivered
    events = nvml.nvmlEventSetCreate()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    supported = nvml.nvmlDeviceGetSupportedEventTypes(handles[0])
    assert supported & nvml.nvmlEventTypeXidCriticalError and supported & nvml.nvmlEventTypeDoubleBitEccError
    for handle in handles[:3]:  # not GPU 3
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
    pcie_node.ctl("xid", "--gpu", "3", "--xid", "79")
    pcie_node.ctl("xid", "--gpu", "2", "--xid", "48")  # a double-bit event too, not registered for
    data = nvml.nvmlEventSetWait_v2(events, 1000)
    assert isinstance(data, nvml.c_nvmlEventData_t)
    assert (data.eventType, data.eventData) == (nvml.nvmlEventTypeXidCriticalError, 48)
    assert nvml.nvmlDeviceGetUUID(data.device) == nvml.nvmlDeviceGetUUID(handles[2])
    with pytest.raises(nvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(events, 50)
    nvml.nvmlEventSetFree(events)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlEventSetWait_v2(events, 0)


def test_the_recovery_action_is_reported_from_r565_on(pcie_node: FakeNode, nvml: Any) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    (value,) = nvml.nvmlDeviceGetFieldValues(handle, [230])
    assert value.nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED  # the lab's 535 driver does not report it
    assert pcie_node.ctl("recovery-action", "--gpu", "1", "--action", "reboot") == 0
    (value, pending) = nvml.nvmlDeviceGetFieldValues(handle, [230, nvml.NVML_FI_DEV_REMAPPED_PENDING])
    assert (value.nvmlReturn, value.value.uiVal) == (nvml.NVML_SUCCESS, 2)
    assert (pending.nvmlReturn, pending.value.uiVal) == (nvml.NVML_SUCCESS, 0)
    (line,) = pcie_node.kmsg_path.read_text().splitlines()
    assert "): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)" in line
    assert pcie_node.ctl("recovery-action", "--gpu", "2", "--action", "none") == 0  # reported, nothing to do
    assert pcie_node.ctl("xid", "--gpu", "2", "--xid", "95") == 0  # then an uncontained error: reset needed
    assert pcie_node.gpu(2)["recovery_action"] == 1
    assert (
        "): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
        in (pcie_node.kmsg_path.read_text().splitlines()[-1])
    )
    assert pcie_node.ctl("recovery-action", "--gpu", "1", "--action", "unsupported") == 0
    (value,) = nvml.nvmlDeviceGetFieldValues(handle, [230])
    assert value.nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED


def test_the_row_remap_histogram(pcie_node: FakeNode, nvml: Any) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    histogram = nvml.nvmlDeviceGetRowRemapperHistogram(handle)
    assert (histogram.max, histogram.high, histogram.partial, histogram.low, histogram.none) == (
        640,
        0,
        0,
        0,
        0,
    )
    pcie_node.ctl("remap", "--gpu", "0", "--failure")
    histogram = nvml.nvmlDeviceGetRowRemapperHistogram(handle)
    assert (histogram.max, histogram.none) == (639, 1)


def test_a_gpu_reset_clears_what_a_reset_clears(pcie_node: FakeNode) -> None:
    pcie_node.ctl("xid", "--gpu", "1", "--xid", "95")
    pcie_node.ctl("xid", "--gpu", "1", "--xid", "74")
    assert pcie_node.ctl("gpu-reset", "--uuid", pcie_node.gpu(1)["uuid"]) == 0
    gpu = pcie_node.gpu(1)
    assert gpu["ecc"]["volatile"] == {"corrected": 0, "uncorrected": 0}
    assert gpu["ecc"]["aggregate"]["uncorrected"] == 1  # the lifetime counter keeps it
    assert (gpu["remapped_rows"]["pending"], gpu["remapped_rows"]["uncorrectable"]) == (0, 1)
    assert all(link["active"] for link in gpu["nvlinks"])
    pcie_node.ctl("remap", "--gpu", "1", "--failure")
    pcie_node.ctl("gpu-reset", "--gpu", "1")
    assert pcie_node.gpu(1)["remapped_rows"]["failure"] == 1  # the failure flag stays: the GPU is for repair
    pcie_node.ctl("xid", "--gpu", "2", "--xid", "79")
    assert pcie_node.ctl("gpu-reset", "--gpu", "2") == 1  # a GPU off the bus needs a reboot


def test_a_reboot_empties_the_kernel_log_and_its_numbers_go_on(pcie_node: FakeNode) -> None:
    pcie_node.ctl("xid", "--gpu", "0", "--xid", "79")
    pcie_node.ctl("xid", "--gpu", "1", "--xid", "13")
    last = xids(pcie_node)[-1][2]
    assert pcie_node.ctl("reset") == 0
    assert pcie_node.kmsg_path.read_text() == ""
    pcie_node.ctl("xid", "--gpu", "0", "--xid", "31")
    ((xid, _, seq),) = xids(pcie_node)
    assert xid == 31 and seq is not None and last is not None and seq > last


def test_the_nvidia_smi_stand_in_resets_one_idle_gpu(pcie_node: FakeNode, tmp_path: Any) -> None:
    ctl = tmp_path / "fake-nvml"
    ctl.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_NVML_DIR / "fake_nvml_ctl.py"} "$@"\n')
    ctl.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(FAKE_NVML_DIR), "FAKE_NVML_CTL": str(ctl)}
    smi = [sys.executable, str(ROOT / "tests" / "lab" / "mirror" / "payloads" / "nvidia-smi")]

    def reset(target: str) -> subprocess.CompletedProcess[str]:
        command = [*smi, "-r", "-i", target]
        return subprocess.run(command, env=env, capture_output=True, text=True, check=False)

    pcie_node.ctl("xid", "--gpu", "1", "--xid", "95")
    pcie_node.ctl("process", "--gpu", "1", "--pid", "4242", "--add")
    busy = reset(pcie_node.gpu(1)["uuid"])
    assert busy.returncode == 255 and "is currently in use by another process" in busy.stdout
    assert pcie_node.gpu(1)["remapped_rows"]["pending"] == 1  # nothing reset
    pcie_node.ctl("process", "--gpu", "1", "--clear")
    done = reset(pcie_node.gpu(1)["uuid"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "GPU 00000000:31:00.0 was successfully reset.\nAll done.\n"
    assert pcie_node.gpu(1)["remapped_rows"]["pending"] == 0
    assert pcie_node.gpu(1)["ecc"]["volatile"]["uncorrected"] == 0
    pcie_node.ctl("xid", "--gpu", "2", "--xid", "79")
    lost = reset("2")
    assert lost.returncode == 15 and "GPU is lost" in lost.stdout


def test_the_lab_points_the_product_at_the_fake_drivers_kernel_log() -> None:
    """The lab's nodes share this machine's kernel: the product reads the file the fake driver writes."""
    import fake_nvml_ctl
    import yaml

    lab = yaml.safe_load((ROOT / "inventories" / "lab" / "group_vars" / "gpu_nodes.yml").read_text())
    assert lab["gpu_health_agent_kernel_log"] == fake_nvml_ctl.DEFAULT_KMSG != "/dev/kmsg"
    defaults = yaml.safe_load((ROOT / "roles" / "gpu_health_agent" / "defaults" / "main.yml").read_text())
    assert defaults["gpu_health_agent_kernel_log"] == "/dev/kmsg"
