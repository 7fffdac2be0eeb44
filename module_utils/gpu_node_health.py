"""One node's GPU health, read through NVML and the kernel log's Xids, judged by ``gpu_health_rules``.

The ``gpu_health`` module and the GPU health agent both report this; it lives here once so the two
can never judge the same node differently.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any

from ansible.module_utils.gpu_health_rules import (
    Finding,
    action_of,
    gpu_findings,
    node_findings,
    verdict_of,
    worst,
    xid_findings,
)
from ansible.module_utils.gpu_inventory import NodeReading, read_node
from ansible.module_utils.gpu_kernel_log import load_cleared, read_log, uncleared
from ansible.module_utils.gpu_xid import ACTION_PLAYBOOK, XidEvent, incidents, worst_action
from ansible.module_utils.nvml_session import NvmlUnavailable, describe_error, nvml_session


def read_xids(kernel_log: str) -> tuple[list[XidEvent], str | None]:
    """The Xids of the kernel log that no GPU reset has cleared, and why the log could not be read (None
    when it could; "" as the path: not read)."""
    if not kernel_log:
        return [], None
    try:
        events, _ = read_log(kernel_log)
    except OSError as exc:
        return [], f"{kernel_log}: {exc.strerror or exc}"
    return uncleared(events, load_cleared()), None


def xid_entry(event: XidEvent) -> dict[str, Any]:
    return {
        "xid": event.xid,
        "mnemonic": event.rule.mnemonic,
        "action": event.rule.action,
        "seq": event.seq,
        "text": event.text,
    }


def assess_node(
    nvml: ModuleType,
    expected_gpu_count: int | None,
    threshold: int | None,
    xid_events: Iterable[XidEvent] = (),
    now_usec: int | None = None,
    kernel_log_error: str | None = None,
    node: NodeReading | None = None,
) -> dict[str, Any]:
    """Verdict, action, node-level reasons and messages, and one entry per GPU.

    Keys: ``verdict``, ``action``, ``playbook``, ``settled``, ``reasons``, ``messages``, ``xids``, ``gpus``
    (index, uuid, pci_bus_id, verdict, action, reasons, messages, xids), ``gpu_count`` and ``driver_version``
    (None when NVML could not be read).
    ``xid_events``: the Xids not cleared by a reset; ``now_usec``: the kernel log's clock (bursts that may
    still get their containment Xid wait), None to judge every burst as final. ``node``: the node as the
    caller just read it (read_node, in its own NVML session), not read again here.
    """
    events = list(xid_events)
    bursts = incidents(events, now_usec)
    system: dict[str, Any] = {"gpu_count": None, "driver_version": None}
    node_level: list[Finding] = []
    gpus: list[dict[str, Any]] = []
    try:
        if node is None:
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
            findings = gpu_findings(reading.facts, reading.error_reason, threshold, bursts)
            bus = reading.facts["pci_bus_id"]
            gpus.append(
                {
                    "index": reading.index,
                    "uuid": reading.facts["uuid"],
                    "pci_bus_id": bus,
                    "verdict": verdict_of(findings),
                    "action": action_of(findings),
                    "reasons": [f.reason for f in findings],
                    "messages": [f.message for f in findings],
                    "xids": [xid_entry(e) for e in events if bus and e.pci_bus_id == bus],
                }
            )
    # Xids of GPUs NVML does not name (off the bus, or NVML down) are the node's
    named = {g["pci_bus_id"] for g in gpus if g["pci_bus_id"]}
    node_level.extend(xid_findings(None, [b for b in bursts if b.pci_bus_id not in named]))
    if kernel_log_error:
        node_level.append(Finding("kernel_log_unreadable", f"Xids not read: {kernel_log_error}"))
    action = worst_action([action_of(node_level)] + [g["action"] for g in gpus])
    return {
        "verdict": worst([verdict_of(node_level)] + [g["verdict"] for g in gpus]),
        "action": action,
        "playbook": ACTION_PLAYBOOK.get(action, ""),
        "reasons": [f.reason for f in node_level],
        "messages": [f.message for f in node_level],
        "gpus": gpus,
        "xids": [xid_entry(e) for e in events if e.pci_bus_id not in named],
        # False while a burst may still get its containment Xid: the agent waits before it acts
        "settled": all(b.settled for b in bursts),
        **system,
    }
