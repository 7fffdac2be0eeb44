"""gpu_health as a module: verdicts per GPU and node, on both shapes, for every fault the lab can inject."""

from __future__ import annotations

import os
from typing import Any

import gpu_health
import pytest
from ansible.module_utils import gpu_kernel_log
from conftest import FakeNode, run_module


def health(args: dict[str, Any] | None = None) -> dict[str, Any]:
    # the node's kernel log is the file fake-nvml xid writes, never this machine's /dev/kmsg
    args = {"kernel_log": os.environ["FAKE_NVML_KMSG"], **(args or {})}
    failed, result = run_module(gpu_health, args)
    assert not failed, result["msg"]
    assert result["changed"] is False
    return result


def test_fresh_node_is_healthy(node: FakeNode) -> None:
    result = health({"expected_gpu_count": node.gpu_count})
    assert result["verdict"] == "healthy" and result["healthy"] is True
    assert result["reasons"] == [] and result["msg"] == "healthy"
    assert [g["index"] for g in result["gpus"]] == list(range(node.gpu_count))
    assert all(g["verdict"] == "healthy" and g["reasons"] == [] and g["uuid"] for g in result["gpus"])
    assert result["driver_version"] == "535.183.06"


def test_uncorrectable_ecc_on_gpu2_makes_the_node_unhealthy(node: FakeNode) -> None:
    node.ctl("ecc", "--gpu", "2", "--uncorrectable", "1")
    result = health({"expected_gpu_count": node.gpu_count})
    assert result["verdict"] == "unhealthy" and result["healthy"] is False
    gpu2 = result["gpus"][2]
    assert gpu2["verdict"] == "unhealthy" and gpu2["reasons"] == ["ecc_uncorrectable_volatile"]
    assert all(g["verdict"] == "healthy" for g in result["gpus"] if g["index"] != 2)
    assert result["msg"] == "unhealthy: GPU 2 ecc_uncorrectable_volatile"


def test_corrected_errors_alone_are_healthy(pcie_node: FakeNode) -> None:
    pcie_node.ctl("ecc", "--gpu", "0", "--corrected", "500")
    assert health()["verdict"] == "healthy"
    assert health({"corrected_errors_threshold": 1000})["verdict"] == "healthy"
    result = health({"corrected_errors_threshold": 100})
    assert result["verdict"] == "degraded" and result["healthy"] is False
    assert result["gpus"][0]["reasons"] == ["ecc_corrected_over_threshold"]


def test_old_uncorrectable_errors_in_the_aggregate_counter_are_history(pcie_node: FakeNode) -> None:
    pcie_node.ctl("ecc", "--gpu", "1", "--uncorrectable", "2", "--aggregate")
    pcie_node.ctl("remap", "--gpu", "1", "--uncorrectable", "2")
    assert health()["verdict"] == "healthy"


@pytest.mark.parametrize(
    ("ctl", "reason", "action"),
    [
        (["remap", "--gpu", "3", "--failure"], "row_remap_failure", "repair"),
        (["gpu", "--gpu", "3", "--lost"], "gpu_lost", "reboot_node"),
    ],
)
def test_unhealthy_reasons(node: FakeNode, ctl: list[str], reason: str, action: str) -> None:
    node.ctl(*ctl)
    result = health()
    assert result["verdict"] == "unhealthy"
    assert result["gpus"][3]["reasons"] == [reason]
    assert result["gpus"][3]["messages"]
    assert result["gpus"][3]["action"] == action and result["action"] == action


def test_a_pending_remap_waits_for_the_next_drain_window(node: FakeNode) -> None:
    node.ctl("remap", "--gpu", "3", "--pending")
    result = health()
    assert result["verdict"] == "degraded" and result["action"] == "reset_at_drain_window"
    assert result["gpus"][3]["reasons"] == ["row_remap_pending"]


@pytest.mark.parametrize(
    ("ctl", "reason"),
    [
        (["temp", "--gpu", "1", "--celsius", "90"], "temperature_slowdown"),
        (["link", "--gpu", "1", "--link", "0", "--down"], "nvlink_inactive"),
    ],
)
def test_degraded_reasons(node: FakeNode, ctl: list[str], reason: str) -> None:
    node.ctl(*ctl)
    result = health()
    assert result["verdict"] == "degraded"
    assert reason in result["gpus"][1]["reasons"]


def test_retired_pages_pending_on_a_page_retiring_gpu(pcie_node: FakeNode) -> None:
    pages = {"single_bit": [], "double_bit": [4096], "pending": 1}
    pcie_node.edit(lambda s: s["gpus"][0].update(retired_pages=pages, remapped_rows=None))
    assert health()["gpus"][0]["reasons"] == ["retired_pages_pending"]


def test_missing_gpu_is_a_node_reason(node: FakeNode) -> None:
    node.ctl("gpu", "--gpu", "0", "--remove")
    result = health({"expected_gpu_count": node.gpu_count})
    assert result["verdict"] == "unhealthy"
    assert result["reasons"] == ["gpu_missing"]
    assert result["gpu_count"] == node.gpu_count - 1
    assert all(g["verdict"] == "healthy" for g in result["gpus"])


def test_more_gpus_than_expected_is_degraded(pcie_node: FakeNode) -> None:
    result = health({"expected_gpu_count": 2})
    assert result["verdict"] == "degraded" and result["reasons"] == ["gpu_count_unexpected"]


@pytest.mark.parametrize(
    ("fault", "text"),
    [("mismatch", "Driver/library version mismatch"), ("no_library", "not installed")],
)
def test_nvml_unavailable_is_an_unhealthy_verdict_not_a_crash(
    pcie_node: FakeNode, fault: str, text: str
) -> None:
    if fault == "mismatch":
        pcie_node.ctl("kernel-version", "550.54.15")
    else:
        pcie_node.remove_library()
    result = health({"expected_gpu_count": 4})
    assert result["verdict"] == "unhealthy" and result["reasons"] == ["nvml_error"]
    assert text in result["messages"][0]
    assert result["gpus"] == [] and result["gpu_count"] is None


def test_fail_on_unhealthy(pcie_node: FakeNode) -> None:
    pcie_node.ctl("ecc", "--gpu", "2", "--uncorrectable", "3")
    failed, result = run_module(gpu_health, {"fail_on_unhealthy": True})
    assert failed and result["verdict"] == "unhealthy"
    assert "GPU 2: 3 uncorrectable ECC error(s)" in result["msg"]


def test_fail_on_unhealthy_does_not_fail_degraded(pcie_node: FakeNode) -> None:
    pcie_node.ctl("temp", "--gpu", "0", "--celsius", "95")
    failed, result = run_module(gpu_health, {"fail_on_unhealthy": True})
    assert not failed and result["verdict"] == "degraded"


def test_negative_options_are_rejected(pcie_node: FakeNode) -> None:
    failed, result = run_module(gpu_health, {"corrected_errors_threshold": -1})
    assert failed and "corrected_errors_threshold must be >= 0" in result["msg"]


def test_check_mode_is_the_same(pcie_node: FakeNode) -> None:
    pcie_node.ctl("remap", "--gpu", "0", "--failure")
    failed, result = run_module(gpu_health, {}, check_mode=True)
    assert not failed and result["verdict"] == "unhealthy"


# ------------------------------------------------------------------------------------- Xids (issue 20)


@pytest.fixture
def cleared_file(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    path = tmp_path / "xid-cleared.json"
    monkeypatch.setattr(gpu_kernel_log, "CLEARED_FILE", str(path))
    return path


def test_a_contained_error_restarts_the_application_and_keeps_the_node(pcie_node: FakeNode) -> None:
    for xid in ("48", "63", "94"):  # what the driver logs for a contained double-bit error on A100
        pcie_node.ctl("xid", "--gpu", "1", "--xid", xid)
    result = health()
    gpu1 = result["gpus"][1]
    assert result["verdict"] == "degraded" and result["healthy"] is False
    assert result["action"] == "reset_at_drain_window"  # the remapped row waits for the next reset
    assert gpu1["reasons"] == ["ecc_uncorrectable_volatile", "row_remap_pending", "xid_94"]
    assert "Xid 94 in the kernel log: contained to the application" in gpu1["messages"][0]
    assert [x["xid"] for x in gpu1["xids"]] == [48, 63, 94]
    assert gpu1["xids"][2]["mnemonic"] == "ROBUST_CHANNEL_CONTAINED_ERROR"


def test_an_uncontained_error_asks_for_the_reset(pcie_node: FakeNode) -> None:
    pcie_node.ctl("xid", "--gpu", "2", "--xid", "48")
    pcie_node.ctl("xid", "--gpu", "2", "--xid", "95")
    result = health()
    assert result["verdict"] == "unhealthy" and result["action"] == "reset_gpu"
    assert result["playbook"] == "playbooks/remediate/gpu-reset.yml"
    assert result["gpus"][2]["action"] == "reset_gpu"


def test_application_xids_change_nothing(pcie_node: FakeNode) -> None:
    for xid in ("13", "31", "43", "45"):
        pcie_node.ctl("xid", "--gpu", "0", "--xid", xid, "--pid", "4242", "--name", "vllm")
    result = health()
    assert result["verdict"] == "healthy" and result["action"] == "none"
    assert result["gpus"][0]["reasons"] == ["xid_45"]  # one burst, seen and left alone


def test_fallen_off_the_bus_is_a_reboot(pcie_node: FakeNode) -> None:
    pcie_node.ctl("xid", "--gpu", "3", "--xid", "79")
    result = health({"expected_gpu_count": 4})
    assert result["verdict"] == "unhealthy" and result["action"] == "reboot_node"
    assert result["gpus"][3]["reasons"] == ["gpu_lost"]
    assert result["reasons"] == ["xid_79"]  # NVML cannot name the GPU any more: a node-level finding
    assert result["playbook"] == "playbooks/remediate/node-reboot.yml"


def test_a_reset_clears_its_gpus_xids(pcie_node: FakeNode, cleared_file: Any) -> None:
    pcie_node.ctl("xid", "--gpu", "2", "--xid", "95")
    pcie_node.ctl("gpu-reset", "--gpu", "2")
    assert health()["action"] == "reset_gpu"  # the Xid is still in the log
    _, last = gpu_kernel_log.read_log(os.environ["FAKE_NVML_KMSG"])
    gpu_kernel_log.save_cleared(["00000000:B1:00.0"], last or 0)
    result = health()
    assert result["verdict"] == "healthy" and result["action"] == "none"
    assert result["gpus"][2]["xids"] == []


def test_an_unreadable_kernel_log_is_said_and_errors_count_as_uncontained(
    pcie_node: FakeNode, tmp_path: Any
) -> None:
    pcie_node.ctl("ecc", "--gpu", "1", "--uncorrectable", "1")
    result = health({"kernel_log": str(tmp_path)})  # a directory: unreadable
    assert result["reasons"] == ["kernel_log_unreadable"]
    assert result["action"] == "reset_gpu" and result["verdict"] == "unhealthy"
    result = health({"kernel_log": ""})  # not read at all: nothing said about it
    assert result["reasons"] == [] and result["action"] == "reset_gpu"


def test_the_recovery_action_of_a_newer_driver_decides(pcie_node: FakeNode) -> None:
    pcie_node.ctl("recovery-action", "--gpu", "0", "--action", "none")
    pcie_node.ctl("ecc", "--gpu", "0", "--uncorrectable", "1")
    result = health()
    assert result["gpus"][0]["action"] == "restart_app"
    pcie_node.ctl("recovery-action", "--gpu", "0", "--action", "reboot")  # logs Xid 154 too
    result = health()
    assert result["action"] == "reboot_node"
    assert result["gpus"][0]["reasons"] == ["ecc_uncorrectable_volatile", "nvml_recovery_action", "xid_154"]


@pytest.mark.parametrize("shape", ["pcie_node", "hgx_node"])
def test_facts_are_gpu_facts_own_from_the_same_session(shape: str, request: pytest.FixtureRequest) -> None:
    """facts=true returns ansible_facts.nvidia as gpu_facts does (the status report's one NVML call), and the
    verdict judged on that read; without it no facts, as before."""
    import gpu_facts

    node: FakeNode = request.getfixturevalue(shape)
    node.ctl("ecc", "--gpu", "1", "--uncorrectable", "1")
    with_facts = health({"expected_gpu_count": node.gpu_count, "facts": True})
    failed, alone = run_module(gpu_facts, {})
    assert not failed, alone["msg"]
    facts, expected = with_facts["ansible_facts"]["nvidia"], alone["ansible_facts"]["nvidia"]
    # the device processes hold the module's own run (its pid differs between the two runs)
    assert {**facts, "device_processes": []} == {**expected, "device_processes": []}
    assert facts["gpu_count"] == node.gpu_count and facts["driver_version"] == "535.183.06"
    assert with_facts["gpus"][1]["reasons"] == ["ecc_uncorrectable_volatile"]
    without = health({"expected_gpu_count": node.gpu_count})
    assert "ansible_facts" not in without
    assert {k: v for k, v in with_facts.items() if k != "ansible_facts"} == without


def test_facts_are_left_out_where_nvml_does_not_answer(pcie_node: FakeNode) -> None:
    pcie_node.ctl("kernel-version", "550.54.15")  # driver/library version mismatch
    result = health({"facts": True})
    assert "ansible_facts" not in result
    assert result["verdict"] == "unhealthy" and result["reasons"] == ["nvml_error"]
