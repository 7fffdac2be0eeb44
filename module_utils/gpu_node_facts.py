"""The node's NVIDIA facts (ansible_facts.nvidia) as gpu_facts returns them, for every module that returns
them (gpu_facts; gpu_health with facts=true): one home for their shape."""

from __future__ import annotations

from typing import Any

from ansible.module_utils.gpu_inventory import NodeReading
from ansible.module_utils.nvml_session import NVML_VENV


def nvml_switch_links(gpus: list[dict[str, Any]]) -> int:
    """NVLinks whose far end is an NVSwitch, up or not (an HGX board's come up only once fabric manager
    runs), and, for drivers that report no far-end type, active links to no GPU of this node."""
    count = 0
    for gpu in gpus:
        for link in gpu["nvlinks"]:
            remote_type = link["remote_device_type"]
            untyped_to_no_gpu = link["active"] and link["remote_gpu_index"] is None and remote_type != "gpu"
            if remote_type == "switch" or untyped_to_no_gpu:
                count += 1
    return count


def nvswitch_facts(pci_devices: list[str], gpus: list[dict[str, Any]] | None) -> dict[str, Any]:
    links = None if gpus is None else nvml_switch_links(gpus)
    return {"present": bool(pci_devices) or bool(links), "pci_devices": pci_devices, "nvml_links": links}


def node_facts(
    node: NodeReading, topology: Any, holders: list[dict[str, Any]], switches: list[str]
) -> dict[str, Any]:
    """ansible_facts.nvidia of a node NVML answered for: its system facts, GPUs and topology (read in one
    NVML session), the processes holding /dev/nvidia* and the NVSwitches on the PCI bus (read before it)."""
    facts = dict(node.system)
    facts["gpus"] = [gpu.facts for gpu in node.gpus]
    facts["topology"] = topology
    facts["device_processes"] = holders
    facts["nvswitches"] = nvswitch_facts(switches, facts["gpus"])
    facts["nvml_venv"] = NVML_VENV
    return facts
