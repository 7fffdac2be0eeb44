"""module_utils.gpu_health_rules: the reason -> verdict and action table, on plain dicts; the A100 memory
rules (containment from the Xids, NVML's recovery action where the driver reports it, the row-remapping flags
and histogram)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from ansible.module_utils.gpu_health_rules import (
    DEGRADED,
    HEALTHY,
    REASONS,
    UNHEALTHY,
    action_of,
    gpu_findings,
    node_findings,
    verdict_of,
    worst,
)
from ansible.module_utils.gpu_inventory import empty_gpu_facts
from ansible.module_utils.gpu_xid import (
    NONE,
    REBOOT_NODE,
    REPAIR,
    RESET_AT_DRAIN_WINDOW,
    RESET_GPU,
    RESTART_APP,
    XidEvent,
    cordons,
    incidents,
)

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
    gpu["remapped_rows"] = {
        "correctable": 0,
        "uncorrectable": 0,
        "pending": False,
        "failure": False,
        "histogram": {"max": 640, "high": 0, "partial": 0, "low": 0, "none": 0},
    }
    gpu["pci_bus_id"] = "00000000:17:00.0"
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
    assert {reason.verdict for reason in REASONS.values()} == {UNHEALTHY, DEGRADED}
    for code, reason in REASONS.items():  # a reason that cordons is unhealthy, a notice degraded
        assert (reason.verdict == UNHEALTHY) == cordons(reason.action), code


def test_healthy() -> None:
    assert gpu_findings(healthy_gpu()) == []
    assert verdict_of([]) == HEALTHY


@pytest.mark.parametrize(
    ("gpu", "reason", "verdict", "action"),
    [
        # no Xid says whether it was contained, no recovery action (a 535 driver): treated as uncontained
        (with_("ecc.volatile_uncorrected", 1), "ecc_uncorrectable_volatile", UNHEALTHY, RESET_GPU),
        # NVIDIA: work may continue with a remap pending; reset at the next chance
        (with_("remapped_rows.pending", True), "row_remap_pending", DEGRADED, RESET_AT_DRAIN_WINDOW),
        (with_("remapped_rows.failure", True), "row_remap_failure", UNHEALTHY, REPAIR),
        (
            with_("retired_pages", {"single_bit_ecc": 0, "double_bit_ecc": 1, "pending": True}),
            "retired_pages_pending",
            DEGRADED,
            RESET_AT_DRAIN_WINDOW,
        ),
        (
            with_("remapped_rows.histogram", {"max": 639, "high": 0, "partial": 0, "low": 0, "none": 1}),
            "row_remap_spares_exhausted",
            DEGRADED,
            NONE,
        ),
        (with_("recovery_action", 2), "nvml_recovery_action", UNHEALTHY, REBOOT_NODE),
        (with_("temperature.gpu_c", 89), "temperature_slowdown", DEGRADED, NONE),
        (with_("ecc.enabled", False), "ecc_disabled", DEGRADED, NONE),
        (
            with_("nvlinks", [{"link": 3, "active": False, "remote_gpu_index": 1}]),
            "nvlink_inactive",
            DEGRADED,
            NONE,
        ),
    ],
)
def test_single_reason(gpu: dict[str, Any], reason: str, verdict: str, action: str) -> None:
    findings = gpu_findings(gpu)
    assert [f.reason for f in findings] == [reason]
    assert verdict_of(findings) == verdict
    assert action_of(findings) == action
    assert findings[0].message.startswith("GPU 0:")


S = 1_000_000


def xid(number: int, at_s: float = 10, text: str = "") -> XidEvent:
    return XidEvent(
        number,
        "00000000:17:00.0",
        text or f"NVRM: Xid (PCI:0000:17:00): {number}, x",
        1,
        int(at_s * S),
        None,
        None,
    )


def test_a_contained_error_is_an_application_restart() -> None:
    gpu = with_("ecc.volatile_uncorrected", 1)
    gpu["remapped_rows"]["pending"] = True
    findings = gpu_findings(gpu, incidents=incidents([xid(48), xid(63, 10.001), xid(94, 10.002)]))
    assert [f.reason for f in findings] == ["ecc_uncorrectable_volatile", "row_remap_pending", "xid_94"]
    assert action_of(findings) == RESET_AT_DRAIN_WINDOW and verdict_of(findings) == DEGRADED
    assert findings[0].action == RESTART_APP and "Xid 94" in findings[0].message


def test_an_uncontained_error_is_a_reset() -> None:
    gpu = with_("ecc.volatile_uncorrected", 1)
    findings = gpu_findings(gpu, incidents=incidents([xid(48), xid(95, 10.002)]))
    assert action_of(findings) == RESET_GPU and verdict_of(findings) == UNHEALTHY
    assert [f.reason for f in findings] == ["ecc_uncorrectable_volatile", "xid_95"]


def test_the_recovery_action_decides_where_the_driver_reports_it() -> None:
    gpu = with_("ecc.volatile_uncorrected", 1)
    gpu["recovery_action"] = 0  # R565+: no recovery needed, a new process may use the GPU
    findings = gpu_findings(gpu)
    assert [(f.reason, f.action) for f in findings] == [("ecc_uncorrectable_volatile", RESTART_APP)]
    gpu["recovery_action"] = 1
    assert action_of(gpu_findings(gpu)) == RESET_GPU


def test_application_xids_do_nothing() -> None:
    findings = gpu_findings(healthy_gpu(), incidents=incidents([xid(13), xid(31, 11), xid(43, 12)]))
    assert action_of(findings) == NONE and verdict_of(findings) == HEALTHY


def test_an_xid_of_another_gpu_is_not_this_gpus() -> None:
    other = XidEvent(95, "00000000:B1:00.0", "NVRM: Xid (PCI:0000:b1:00): 95, x", 1, 1, None, None)
    assert gpu_findings(healthy_gpu(), incidents=incidents([other])) == []


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
    assert action_of(findings) == REBOOT_NODE  # Xid 79: RESTART_BM
    assert verdict_of(gpu_findings(empty_gpu_facts(1), "nvml_error")) == UNHEALTHY


def test_unhealthy_beats_degraded() -> None:
    gpu = with_("ecc.volatile_uncorrected", 2)  # no Xid read: treated as uncontained
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
    assert action_of(node_findings(3, 4)) == REBOOT_NODE
    assert verdict_of(node_findings(8, 4)) == DEGRADED
