"""module_utils.gpu_health_rules: the reason -> verdict table, on plain dicts."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from ansible.module_utils.gpu_health_rules import (
    DEGRADED,
    HEALTHY,
    REASONS,
    UNHEALTHY,
    gpu_findings,
    node_findings,
    verdict_of,
    worst,
)
from ansible.module_utils.gpu_inventory import empty_gpu_facts

REQUIRED_REASONS = {
    "ecc_uncorrectable_volatile",
    "row_remap_pending",
    "row_remap_failure",
    "retired_pages_pending",
    "ecc_corrected_over_threshold",
    "gpu_missing",
    "temperature_slowdown",
    "nvml_error",
}


def healthy_gpu() -> dict[str, Any]:
    gpu = empty_gpu_facts(0)
    gpu["uuid"] = "GPU-x"
    gpu["temperature"].update(gpu_c=40, slowdown_c=89, shutdown_c=92)
    gpu["ecc"] = {
        "enabled": True,
        "pending_enabled": True,
        "volatile_corrected": 0,
        "volatile_uncorrected": 0,
        "aggregate_corrected": 0,
        "aggregate_uncorrected": 0,
    }
    gpu["remapped_rows"] = {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    gpu["nvlinks"] = [{"link": 0, "active": True, "remote_gpu_index": 1}]
    return gpu


def with_(path: str, value: Any) -> dict[str, Any]:
    gpu = copy.deepcopy(healthy_gpu())
    *parents, leaf = path.split(".")
    target = gpu
    for key in parents:
        target = target[key]
    target[leaf] = value
    return gpu


def test_issue_reasons_exist() -> None:
    assert set(REASONS) >= REQUIRED_REASONS
    assert {verdict for verdict, _ in REASONS.values()} == {UNHEALTHY, DEGRADED}


def test_healthy() -> None:
    assert gpu_findings(healthy_gpu()) == []
    assert verdict_of([]) == HEALTHY


@pytest.mark.parametrize(
    ("gpu", "reason", "verdict"),
    [
        (with_("ecc.volatile_uncorrected", 1), "ecc_uncorrectable_volatile", UNHEALTHY),
        (with_("remapped_rows.pending", True), "row_remap_pending", UNHEALTHY),
        (with_("remapped_rows.failure", True), "row_remap_failure", UNHEALTHY),
        (
            with_("retired_pages", {"single_bit_ecc": 0, "double_bit_ecc": 1, "pending": True}),
            "retired_pages_pending",
            UNHEALTHY,
        ),
        (with_("temperature.gpu_c", 89), "temperature_slowdown", DEGRADED),
        (with_("ecc.enabled", False), "ecc_disabled", DEGRADED),
        (
            with_("nvlinks", [{"link": 3, "active": False, "remote_gpu_index": 1}]),
            "nvlink_inactive",
            DEGRADED,
        ),
    ],
)
def test_single_reason(gpu: dict[str, Any], reason: str, verdict: str) -> None:
    findings = gpu_findings(gpu)
    assert [f.reason for f in findings] == [reason]
    assert verdict_of(findings) == verdict
    assert findings[0].message.startswith("GPU 0:")


def test_corrected_errors_need_a_threshold_and_only_degrade() -> None:
    gpu = with_("ecc.volatile_corrected", 5000)
    gpu["ecc"]["aggregate_corrected"] = 90000
    assert gpu_findings(gpu) == []
    assert gpu_findings(gpu, corrected_errors_threshold=5000) == []
    findings = gpu_findings(gpu, corrected_errors_threshold=4999)
    assert [f.reason for f in findings] == ["ecc_corrected_over_threshold"]
    assert verdict_of(findings) == DEGRADED


def test_aggregate_uncorrectable_alone_is_history() -> None:
    gpu = with_("ecc.aggregate_uncorrected", 4)
    gpu["remapped_rows"]["uncorrectable"] = 4
    assert gpu_findings(gpu) == []


def test_unknown_values_never_crash() -> None:
    assert gpu_findings(empty_gpu_facts(3)) == []


def test_read_errors_win() -> None:
    gpu = empty_gpu_facts(1)
    gpu["error"] = "GPU 1: GPU is lost"
    findings = gpu_findings(gpu, "gpu_lost")
    assert [(f.reason, f.message) for f in findings] == [("gpu_lost", "GPU 1: GPU is lost")]
    assert verdict_of(gpu_findings(empty_gpu_facts(1), "nvml_error")) == UNHEALTHY


def test_unhealthy_beats_degraded() -> None:
    gpu = with_("ecc.volatile_uncorrected", 2)
    gpu["temperature"]["gpu_c"] = 95
    findings = gpu_findings(gpu)
    assert [f.reason for f in findings] == ["ecc_uncorrectable_volatile", "temperature_slowdown"]
    assert verdict_of(findings) == UNHEALTHY
    assert worst([HEALTHY, DEGRADED]) == DEGRADED and worst([]) == HEALTHY


def test_node_findings() -> None:
    assert node_findings(4, None) == []
    assert node_findings(4, 4) == []
    assert [f.reason for f in node_findings(3, 4)] == ["gpu_missing"]
    assert verdict_of(node_findings(3, 4)) == UNHEALTHY
    assert verdict_of(node_findings(8, 4)) == DEGRADED
