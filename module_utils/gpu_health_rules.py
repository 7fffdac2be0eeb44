"""GPU health verdicts and actions from plain GPU facts (the layout of ``ansible_facts.nvidia.gpus``) and the
Xids of the kernel log. Pure functions: no NVML, no Ansible, easy to test. ``gpu_health`` documents the table.

Each finding has a reason code, a verdict and an action (module_utils/gpu_xid.py: what the platform does, from
NVIDIA's Xid catalog and A100 memory error rules). The verdict follows the action: an action that takes the
node out of scheduling makes the GPU unhealthy, a notice (restart the application, reset at the next drain
window) degraded; the rest keep their table verdict.

Why corrected ECC errors alone are not a failure: a corrected (single-bit) error was fixed by ECC and the data
was delivered intact; A100s also remap the row, so memory heals itself. What matters on A100 (NVIDIA's GPU
Memory Error Management): an uncorrectable error is *contained* to one application (Xid 94: that application
restarts, the node stays in service) or *uncontained* (Xid 95: reset the GPU); a pending row remap waits for
the next reset while work goes on; a failed remap (NVIDIA's RMA thresholds) means repair; the recovery action
flag (R565 drivers and later) says which. Without a containment Xid or the recovery action (a 535 driver and
an unreadable kernel log) an uncorrectable error counts as uncontained: a reset. A burst of corrected errors
above a threshold the operator chooses makes a GPU degraded, not unhealthy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ansible.module_utils.gpu_xid import (
    CONTAINMENT_XIDS,
    NONE,
    REBOOT_NODE,
    REPAIR,
    RESET_AT_DRAIN_WINDOW,
    RESET_GPU,
    RESTART_APP,
    Incident,
    cordons,
    notifies,
    recovery_action,
    recovery_action_name,
    worst_action,
)

HEALTHY = "healthy"
DEGRADED = "degraded"
UNHEALTHY = "unhealthy"
_SEVERITY = {HEALTHY: 0, DEGRADED: 1, UNHEALTHY: 2}


class Reason(NamedTuple):
    verdict: str
    action: str  # the default; a finding may carry its own (the ECC error after its Xids, an Xid's burst)
    text: str  # what it means and what to do


REASONS: dict[str, Reason] = {
    "ecc_uncorrectable_volatile": Reason(
        UNHEALTHY,
        RESET_GPU,
        "uncorrectable ECC errors since the driver loaded: the application that hit it died; contained (Xid "
        "94): it restarts; uncontained (Xid 95) or unknown: drain and reset the GPU",
    ),
    "row_remap_pending": Reason(
        DEGRADED,
        RESET_AT_DRAIN_WINDOW,
        "a row remap is pending: work goes on; reset the GPU at the next drain",
    ),
    "row_remap_failure": Reason(
        UNHEALTHY, REPAIR, "a row remap failed (NVIDIA's RMA thresholds): the GPU needs replacing"
    ),
    "row_remap_spares_exhausted": Reason(
        DEGRADED,
        NONE,
        "a memory bank has no spare rows left: its next uncorrectable error fails the remap; plan a "
        "replacement",
    ),
    "retired_pages_pending": Reason(
        DEGRADED, RESET_AT_DRAIN_WINDOW, "pages wait to be retired: reset the GPU at the next drain"
    ),
    "nvml_recovery_action": Reason(
        UNHEALTHY, RESET_GPU, "NVML's recovery action flag asks for a recovery (driver R565 and later)"
    ),
    "gpu_lost": Reason(
        UNHEALTHY,
        REBOOT_NODE,
        "the GPU is lost (fell off the bus, Xid 79): drain and reboot the node; replace it if it recurs",
    ),
    "nvml_error": Reason(
        UNHEALTHY,
        REBOOT_NODE,
        "NVML cannot read the GPU or the driver: see the message (a driver/library version mismatch: "
        "playbooks/remediate/driver-mismatch.yml)",
    ),
    "gpu_missing": Reason(
        UNHEALTHY,
        REBOOT_NODE,
        "fewer GPUs than expected are visible: one fell off the bus or is not detected; reboot the node",
    ),
    "ecc_corrected_over_threshold": Reason(
        DEGRADED,
        NONE,
        "corrected ECC errors since the driver loaded exceed the threshold: watch it, plan a reset",
    ),
    "temperature_slowdown": Reason(
        DEGRADED, NONE, "the GPU is at or above its slowdown temperature: it is throttling"
    ),
    "ecc_disabled": Reason(
        DEGRADED, NONE, "ECC is disabled: memory errors go undetected; enable it and reset the GPU"
    ),
    "nvlink_inactive": Reason(
        DEGRADED, NONE, "an NVLink of the GPU is down: peer traffic is slower or goes over PCIe"
    ),
    "gpu_count_unexpected": Reason(
        DEGRADED, NONE, "more GPUs are visible than expected: check the inventory"
    ),
    "kernel_log_unreadable": Reason(
        DEGRADED,
        NONE,
        "the kernel log cannot be read: Xids are not seen, an uncorrectable error counts as uncontained",
    ),
}
# Findings from the Xid table: reason "xid_<n>", the action of its burst (module_utils/gpu_xid.py).
XID_REASON_PREFIX = "xid_"


@dataclass(frozen=True)
class Finding:
    reason: str
    message: str
    action: str | None = None  # None: the reason's own

    @property
    def what(self) -> str:
        return self.action if self.action is not None else REASONS[self.reason].action

    @property
    def verdict(self) -> str:
        if cordons(self.what):
            return UNHEALTHY
        if notifies(self.what):
            return DEGRADED
        if self.reason in REASONS:
            return REASONS[self.reason].verdict
        return HEALTHY  # an Xid that asks for nothing (the application's own fault)


def worst(verdicts: list[str]) -> str:
    return max(verdicts, key=_SEVERITY.__getitem__, default=HEALTHY)


def verdict_of(findings: Iterable[Finding]) -> str:
    return worst([f.verdict for f in findings])


def action_of(findings: Iterable[Finding]) -> str:
    return worst_action(f.what for f in findings)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def xid_findings(index: Any, bursts: Iterable[Incident]) -> list[Finding]:
    """One finding per settled burst: reason xid_<the Xid that decides>, the burst's action."""
    findings = []
    for burst in bursts:
        if not burst.settled:
            continue  # its containment Xid may still come: judged at the next reading
        decisive = [e.xid for e in burst.events if e.rule.action == burst.action] or burst.xids
        code = max(decisive, key=lambda x: (x in CONTAINMENT_XIDS, x))
        where = f"GPU {index}" if index is not None else burst.pci_bus_id
        findings.append(
            Finding(
                f"{XID_REASON_PREFIX}{code}",
                f"{where}: Xid {', '.join(map(str, burst.xids))}: {burst.why} -> {burst.action}",
                burst.action,
            )
        )
    return findings


def _uncorrectable(gpu: dict[str, Any], bursts: Sequence[Incident]) -> Finding | None:
    index, count = gpu.get("index"), (gpu.get("ecc") or {}).get("volatile_uncorrected")
    if not _positive(count):
        return None
    what = f"GPU {index}: {count} uncorrectable ECC error(s) since the driver loaded"
    if any(not b.settled for b in bursts):
        return None  # its containment Xid may be on its way: judged at the next reading
    reported = gpu.get("recovery_action")
    if reported is not None:
        # the driver's own verdict (R565+); the application that hit the error restarts either way
        action = worst_action([RESTART_APP, recovery_action(reported)])
        return Finding(
            "ecc_uncorrectable_volatile",
            f"{what}; NVML recovery action {recovery_action_name(reported)}",
            action,
        )
    contained = [b for b in bursts if b.settled and set(b.xids) & set(CONTAINMENT_XIDS)]
    if contained:
        xids = sorted({x for b in contained for x in b.xids if x in CONTAINMENT_XIDS})
        action = worst_action(b.action for b in contained)
        return Finding(
            "ecc_uncorrectable_volatile",
            f"{what}; Xid {'/'.join(map(str, xids))} in the kernel log: "
            + ("contained to the application" if action == RESTART_APP else "uncontained"),
            action,
        )
    return Finding(
        "ecc_uncorrectable_volatile",
        f"{what}; no containment Xid (94/95) and no NVML recovery action: treated as uncontained",
        RESET_GPU,
    )


def gpu_findings(
    gpu: dict[str, Any],
    error_reason: str | None = None,
    corrected_errors_threshold: int | None = None,
    incidents: Iterable[Incident] = (),
) -> list[Finding]:
    """Findings for one GPU's facts and the Xid bursts of the kernel log (only this GPU's, by PCI bus id, are
    used). ``error_reason`` is set when reading the GPU failed."""
    index = gpu.get("index")
    bursts = [b for b in incidents if gpu.get("pci_bus_id") and b.pci_bus_id == gpu.get("pci_bus_id")]
    if error_reason:
        message = gpu.get("error") or f"GPU {index}: {REASONS[error_reason].text}"
        return [Finding(error_reason, message), *xid_findings(index, bursts)]
    findings: list[Finding] = []
    ecc = gpu.get("ecc") or {}
    rows = gpu.get("remapped_rows") or {}
    pages = gpu.get("retired_pages") or {}
    temperature = gpu.get("temperature") or {}

    uncorrectable = _uncorrectable(gpu, bursts)
    if uncorrectable:
        findings.append(uncorrectable)
    if rows.get("pending"):
        findings.append(
            Finding("row_remap_pending", f"GPU {index}: row remap pending, reset the GPU at the next drain")
        )
    if rows.get("failure"):
        findings.append(
            Finding("row_remap_failure", f"GPU {index}: row remap failed, the GPU needs replacing")
        )
    elif _positive((rows.get("histogram") or {}).get("none")):
        findings.append(
            Finding(
                "row_remap_spares_exhausted",
                f"GPU {index}: {rows['histogram']['none']} memory bank(s) without a spare row left",
            )
        )
    if pages.get("pending"):
        findings.append(
            Finding("retired_pages_pending", f"GPU {index}: page retirement pending, reset at the next drain")
        )
    reported = gpu.get("recovery_action")
    if reported is not None and recovery_action(reported) != NONE:
        findings.append(
            Finding(
                "nvml_recovery_action",
                f"GPU {index}: NVML recovery action {recovery_action_name(reported)}",
                recovery_action(reported),
            )
        )
    corrected = ecc.get("volatile_corrected")
    if (
        corrected_errors_threshold is not None
        and isinstance(corrected, int)
        and corrected > corrected_errors_threshold
    ):
        findings.append(
            Finding(
                "ecc_corrected_over_threshold",
                f"GPU {index}: {corrected} corrected ECC errors since the driver loaded "
                f"(threshold {corrected_errors_threshold})",
            )
        )
    gpu_c, slowdown_c = temperature.get("gpu_c"), temperature.get("slowdown_c")
    if isinstance(gpu_c, int) and isinstance(slowdown_c, int) and gpu_c >= slowdown_c:
        findings.append(
            Finding("temperature_slowdown", f"GPU {index}: {gpu_c} C, at or above slowdown at {slowdown_c} C")
        )
    if ecc.get("enabled") is False:
        findings.append(Finding("ecc_disabled", f"GPU {index}: ECC is disabled"))
    down = [link["link"] for link in gpu.get("nvlinks") or [] if not link.get("active")]
    if down:
        findings.append(
            Finding("nvlink_inactive", f"GPU {index}: NVLink(s) {', '.join(map(str, down))} inactive")
        )
    findings.extend(xid_findings(index, bursts))
    return findings


def node_findings(gpu_count: int, expected_gpu_count: int | None) -> list[Finding]:
    if expected_gpu_count is None or gpu_count == expected_gpu_count:
        return []
    if gpu_count < expected_gpu_count:
        return [Finding("gpu_missing", f"{gpu_count} GPU(s) visible, {expected_gpu_count} expected")]
    return [Finding("gpu_count_unexpected", f"{gpu_count} GPU(s) visible, {expected_gpu_count} expected")]
