"""GPU health verdicts from plain GPU facts (the layout of ``ansible_facts.nvidia.gpus``).

Pure functions: no NVML, no Ansible, easy to test. ``gpu_health`` documents the same table.

Why corrected ECC errors alone are not a failure: a corrected (single-bit) error was fixed by ECC and
the data was delivered intact. On A100 and later the GPU also remaps the affected row, so the memory
heals itself. Cordoning on any non-zero ECC count (``nvidia-smi | grep``) takes healthy GPUs out of
service. What does matter: an uncorrectable error since the driver loaded (the data was lost; the
application that hit it is likely dead), a row remap waiting for a GPU reset (the bad row stays in use
until then), a failed remap (the bank is out of spare rows: replace the GPU), pages waiting to be retired
on GPUs that retire pages. A burst of corrected errors above a threshold the operator chooses is worth
a look, so it makes a GPU degraded, not unhealthy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HEALTHY = "healthy"
DEGRADED = "degraded"
UNHEALTHY = "unhealthy"
_SEVERITY = {HEALTHY: 0, DEGRADED: 1, UNHEALTHY: 2}

# reason code -> (verdict, what it means and what to do)
REASONS: dict[str, tuple[str, str]] = {
    "ecc_uncorrectable_volatile": (
        UNHEALTHY,
        "uncorrectable ECC errors since the driver loaded: data was lost; drain the node and reset the GPU",
    ),
    "row_remap_pending": (UNHEALTHY, "a row remap is pending: drain the node and reset the GPU (or reboot)"),
    "row_remap_failure": (UNHEALTHY, "a row remap failed (no spare rows left): the GPU needs replacing"),
    "retired_pages_pending": (
        UNHEALTHY,
        "pages wait to be retired: drain the node and reset the GPU (or reboot)",
    ),
    "gpu_lost": (
        UNHEALTHY,
        "the GPU is lost (fell off the bus, Xid 79): drain, reset or reboot; replace if repeated",
    ),
    "nvml_error": (UNHEALTHY, "NVML cannot read the GPU or the driver: see the message"),
    "gpu_missing": (
        UNHEALTHY,
        "fewer GPUs than expected are visible: one fell off the bus or is not detected",
    ),
    "ecc_corrected_over_threshold": (
        DEGRADED,
        "corrected ECC errors since the driver loaded exceed the threshold: watch it, plan a reset",
    ),
    "temperature_slowdown": (DEGRADED, "the GPU is at or above its slowdown temperature: it is throttling"),
    "ecc_disabled": (DEGRADED, "ECC is disabled: memory errors go undetected; enable it and reset the GPU"),
    "nvlink_inactive": (DEGRADED, "an NVLink of the GPU is down: peer traffic is slower or goes over PCIe"),
    "gpu_count_unexpected": (DEGRADED, "more GPUs are visible than expected: check the inventory"),
}


@dataclass(frozen=True)
class Finding:
    reason: str
    message: str

    @property
    def verdict(self) -> str:
        return REASONS[self.reason][0]


def worst(verdicts: list[str]) -> str:
    return max(verdicts, key=_SEVERITY.__getitem__, default=HEALTHY)


def verdict_of(findings: list[Finding]) -> str:
    return worst([f.verdict for f in findings])


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def gpu_findings(
    gpu: dict[str, Any], error_reason: str | None = None, corrected_errors_threshold: int | None = None
) -> list[Finding]:
    """Findings for one GPU's facts. ``error_reason`` is set when reading the GPU failed."""
    index = gpu.get("index")
    if error_reason:
        return [Finding(error_reason, gpu.get("error") or f"GPU {index}: {REASONS[error_reason][1]}")]
    findings: list[Finding] = []
    ecc = gpu.get("ecc") or {}
    rows = gpu.get("remapped_rows") or {}
    pages = gpu.get("retired_pages") or {}
    temperature = gpu.get("temperature") or {}

    if _positive(ecc.get("volatile_uncorrected")):
        findings.append(
            Finding(
                "ecc_uncorrectable_volatile",
                f"GPU {index}: {ecc['volatile_uncorrected']} uncorrectable ECC error(s) since the driver "
                "loaded",
            )
        )
    if rows.get("pending"):
        findings.append(
            Finding("row_remap_pending", f"GPU {index}: row remap pending, a GPU reset is needed")
        )
    if rows.get("failure"):
        findings.append(
            Finding("row_remap_failure", f"GPU {index}: row remap failed, the GPU needs replacing")
        )
    if pages.get("pending"):
        findings.append(
            Finding("retired_pages_pending", f"GPU {index}: page retirement pending, reset needed")
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
    return findings


def node_findings(gpu_count: int, expected_gpu_count: int | None) -> list[Finding]:
    if expected_gpu_count is None or gpu_count == expected_gpu_count:
        return []
    if gpu_count < expected_gpu_count:
        return [Finding("gpu_missing", f"{gpu_count} GPU(s) visible, {expected_gpu_count} expected")]
    return [Finding("gpu_count_unexpected", f"{gpu_count} GPU(s) visible, {expected_gpu_count} expected")]
