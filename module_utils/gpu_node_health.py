"""One node's GPU health, read through NVML and judged by ``gpu_health_rules``.

The ``gpu_health`` module and the GPU health agent both report this; it lives here once so the two
can never judge the same node differently.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ansible.module_utils.gpu_health_rules import (
    Finding,
    gpu_findings,
    node_findings,
    verdict_of,
    worst,
)
from ansible.module_utils.gpu_inventory import read_node
from ansible.module_utils.nvml_session import NvmlUnavailable, describe_error, nvml_session


def assess_node(nvml: ModuleType, expected_gpu_count: int | None, threshold: int | None) -> dict[str, Any]:
    """Verdict, node-level reasons and messages, and one entry per GPU.

    Keys: ``verdict``, ``reasons``, ``messages``, ``gpus`` (index, uuid, pci_bus_id, verdict, reasons,
    messages), ``gpu_count`` and ``driver_version`` (None when NVML could not be read).
    """
    system: dict[str, Any] = {"gpu_count": None, "driver_version": None}
    node_level: list[Finding] = []
    gpus: list[dict[str, Any]] = []
    try:
        with nvml_session(nvml):
            node = read_node(nvml)
    except NvmlUnavailable as exc:
        node_level.append(Finding("nvml_error", str(exc)))
    except nvml.NVMLError as exc:
        node_level.append(Finding("nvml_error", describe_error(exc, "Reading the GPUs")))
    else:
        system = {"gpu_count": node.system["gpu_count"], "driver_version": node.system["driver_version"]}
        node_level.extend(node_findings(node.system["gpu_count"], expected_gpu_count))
        for reading in node.gpus:
            findings = gpu_findings(reading.facts, reading.error_reason, threshold)
            gpus.append(
                {
                    "index": reading.index,
                    "uuid": reading.facts["uuid"],
                    "pci_bus_id": reading.facts["pci_bus_id"],
                    "verdict": verdict_of(findings),
                    "reasons": [f.reason for f in findings],
                    "messages": [f.message for f in findings],
                }
            )
    return {
        "verdict": worst([verdict_of(node_level)] + [g["verdict"] for g in gpus]),
        "reasons": [f.reason for f in node_level],
        "messages": [f.message for f in node_level],
        "gpus": gpus,
        **system,
    }
