"""gpu_health as a module: verdicts per GPU and node, on both shapes, for every fault the lab can inject."""

from __future__ import annotations

from typing import Any

import gpu_health
import pytest
from conftest import FakeNode, run_module


def health(args: dict[str, Any] | None = None) -> dict[str, Any]:
    failed, result = run_module(gpu_health, args or {})
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
    ("ctl", "reason"),
    [
        (["remap", "--gpu", "3", "--pending"], "row_remap_pending"),
        (["remap", "--gpu", "3", "--failure"], "row_remap_failure"),
        (["gpu", "--gpu", "3", "--lost"], "gpu_lost"),
    ],
)
def test_unhealthy_reasons(node: FakeNode, ctl: list[str], reason: str) -> None:
    node.ctl(*ctl)
    result = health()
    assert result["verdict"] == "unhealthy"
    assert result["gpus"][3]["reasons"] == [reason]
    assert result["gpus"][3]["messages"]


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
    pcie_node.ctl("remap", "--gpu", "0", "--pending")
    failed, result = run_module(gpu_health, {}, check_mode=True)
    assert not failed and result["verdict"] == "unhealthy"
