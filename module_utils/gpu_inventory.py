"""Read the node's GPUs through NVML into plain dicts (the ``ansible_facts.nvidia`` layout).

A value the GPU, driver or bindings do not support is None. An error reading one GPU (a lost GPU, for
example) is recorded on that GPU's entry and does not stop the others from being read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ansible.module_utils.nvml_session import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    UNSUPPORTED_CODES,
    describe_error,
    error_code,
    optional,
)

MIB = 1024 * 1024
# NVML's field id of the GPU recovery action (nvmlDeviceGetFieldValues), from drivers R565 on; nvidia-ml-py
# 12.535 has no name for it, so it is named here (module_utils/gpu_xid.py maps its values to actions).
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVLINK_MAX_LINKS_FALLBACK = 18

# nvidia-smi topo -m level names for nvmlDeviceGetTopologyCommonAncestor's levels.
TOPOLOGY_LEVEL_NAMES = {
    0: "PIX",  # NVML_TOPOLOGY_INTERNAL: both on one board
    10: "PIX",  # NVML_TOPOLOGY_SINGLE: one PCIe switch
    20: "PXB",  # NVML_TOPOLOGY_MULTIPLE: several PCIe switches, no host bridge
    30: "PHB",  # NVML_TOPOLOGY_HOSTBRIDGE
    40: "NODE",  # NVML_TOPOLOGY_NODE: same NUMA node, across host bridges
    50: "SYS",  # NVML_TOPOLOGY_SYSTEM: across NUMA nodes (SMP interconnect)
}
NVLINK_DEVICE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch", 0xFF: "unknown"}


@dataclass
class GpuReading:
    """One GPU as read: its facts entry, its NVML handle (None if unobtainable), and why reading failed."""

    index: int
    handle: Any
    facts: dict[str, Any]
    error_reason: str | None = None  # "gpu_lost" or "nvml_error"
    error_message: str | None = None


@dataclass
class NodeReading:
    system: dict[str, Any]
    gpus: list[GpuReading] = field(default_factory=list)


def cuda_version_text(version: int | None) -> str | None:
    """12020 -> '12.2' (what nvidia-smi prints as CUDA Version)."""
    if version is None:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def watts(milliwatts: int | None) -> float | int | None:
    """NVML reports milliwatts; whole watts come back as int, others as float."""
    if milliwatts is None:
        return None
    if milliwatts % 1000 == 0:
        return milliwatts // 1000
    return round(milliwatts / 1000, 3)


def normalise_bus_id(bus_id: str | None) -> str | None:
    """'0000:17:00.0' and '00000000:17:00.0' name the same device: compare on the 8-digit domain form."""
    if not bus_id:
        return None
    text = str(bus_id).strip().upper()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    return f"{int(domain, 16):08X}:{rest}" if all(c in "0123456789ABCDEF" for c in domain) else text


def empty_gpu_facts(index: int) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": None,
        "name": None,
        "serial": None,
        "pci_bus_id": None,
        "memory_total_mib": None,
        "memory_used_mib": None,
        "persistence_mode": None,
        "power": {
            "limit_w": None,
            "default_limit_w": None,
            "min_limit_w": None,
            "max_limit_w": None,
            "enforced_limit_w": None,
            "draw_w": None,
        },
        "temperature": {
            "gpu_c": None,
            "slowdown_c": None,
            "shutdown_c": None,
            "gpu_max_c": None,
            "target_c": None,
        },
        "ecc": {
            "enabled": None,
            "pending_enabled": None,
            "volatile_corrected": None,
            "volatile_uncorrected": None,
            "aggregate_corrected": None,
            "aggregate_uncorrected": None,
        },
        "remapped_rows": None,
        "retired_pages": None,
        "recovery_action": None,
        "nvlinks": [],
        "processes": [],
        "error": None,
    }


def read_system(nvml: ModuleType) -> dict[str, Any]:
    return {
        "driver_version": optional(nvml, "nvmlSystemGetDriverVersion"),
        "cuda_driver_version": cuda_version_text(optional(nvml, "nvmlSystemGetCudaDriverVersion")),
        "nvml_version": optional(nvml, "nvmlSystemGetNVMLVersion"),
        "gpu_count": nvml.nvmlDeviceGetCount(),
    }


def _read_power(nvml: ModuleType, handle: Any) -> dict[str, Any]:
    constraints = optional(nvml, "nvmlDeviceGetPowerManagementLimitConstraints", handle) or [None, None]
    return {
        "limit_w": watts(optional(nvml, "nvmlDeviceGetPowerManagementLimit", handle)),
        "default_limit_w": watts(optional(nvml, "nvmlDeviceGetPowerManagementDefaultLimit", handle)),
        "min_limit_w": watts(constraints[0]),
        "max_limit_w": watts(constraints[1]),
        "enforced_limit_w": watts(optional(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)),
        "draw_w": watts(optional(nvml, "nvmlDeviceGetPowerUsage", handle)),
    }


def temperature_threshold(nvml: ModuleType, handle: Any, constant_name: str) -> int | None:
    """A temperature threshold, or None where this pynvml lacks the constant or the GPU the value."""
    constant = getattr(nvml, constant_name, None)
    if constant is None:
        return None
    return optional(nvml, "nvmlDeviceGetTemperatureThreshold", handle, constant)


def _read_temperature(nvml: ModuleType, handle: Any) -> dict[str, Any]:
    def threshold(name: str) -> int | None:
        return temperature_threshold(nvml, handle, name)

    return {
        "gpu_c": optional(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU),
        "slowdown_c": threshold("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
        "shutdown_c": threshold("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
        "gpu_max_c": threshold("NVML_TEMPERATURE_THRESHOLD_GPU_MAX"),
        "target_c": threshold("NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR"),
    }


def _read_ecc(nvml: ModuleType, handle: Any) -> dict[str, Any]:
    mode = optional(nvml, "nvmlDeviceGetEccMode", handle)

    def count(error_type: int, counter_type: int) -> int | None:
        return optional(nvml, "nvmlDeviceGetTotalEccErrors", handle, error_type, counter_type)

    corrected, uncorrected = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    return {
        "enabled": None if mode is None else bool(mode[0]),
        "pending_enabled": None if mode is None else bool(mode[1]),
        "volatile_corrected": count(corrected, nvml.NVML_VOLATILE_ECC),
        "volatile_uncorrected": count(uncorrected, nvml.NVML_VOLATILE_ECC),
        "aggregate_corrected": count(corrected, nvml.NVML_AGGREGATE_ECC),
        "aggregate_uncorrected": count(uncorrected, nvml.NVML_AGGREGATE_ECC),
    }


def _read_remapped_rows(nvml: ModuleType, handle: Any) -> dict[str, Any] | None:
    rows = optional(nvml, "nvmlDeviceGetRemappedRows", handle)
    if rows is None:
        return None
    correctable, uncorrectable, pending, failure = rows
    histogram = optional(nvml, "nvmlDeviceGetRowRemapperHistogram", handle)
    return {
        "correctable": int(correctable),
        "uncorrectable": int(uncorrectable),
        "pending": bool(pending),
        "failure": bool(failure),
        # banks by the spare rows they have left (max, high, partial, low, none)
        "histogram": None
        if histogram is None
        else {key: int(getattr(histogram, key)) for key in ("max", "high", "partial", "low", "none")},
    }


def read_recovery_action(nvml: ModuleType, handle: Any) -> int | None:
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvmlDeviceGpuRecoveryAction_t), or None where the driver does not
    report it: the field came with R565; a 535 driver answers the field with an error, and nvidia-ml-py
    12.535 has no name for it (module_utils/gpu_xid.py)."""
    fn = getattr(nvml, "nvmlDeviceGetFieldValues", None)
    if fn is None:
        return None
    try:
        (value,) = fn(handle, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    except nvml.NVMLError as exc:
        if error_code(exc) in UNSUPPORTED_CODES or error_code(exc) == NVML_ERROR_INVALID_ARGUMENT:
            return None
        raise
    if int(value.nvmlReturn) != 0:
        return None
    return int(value.value.uiVal)


def _read_retired_pages(nvml: ModuleType, handle: Any) -> dict[str, Any] | None:
    single = optional(
        nvml,
        "nvmlDeviceGetRetiredPages",
        handle,
        nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    )
    double = optional(
        nvml, "nvmlDeviceGetRetiredPages", handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    )
    pending = optional(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    if single is None and double is None and pending is None:
        return None  # GPUs that remap rows (A100 and later) do not retire pages
    return {
        "single_bit_ecc": None if single is None else len(single),
        "double_bit_ecc": None if double is None else len(double),
        "pending": None if pending is None else bool(pending),
    }


def _read_nvlinks(nvml: ModuleType, handle: Any, gpu_index_by_bus: dict[str, int]) -> list[dict[str, Any]]:
    links = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS_FALLBACK))):
        try:
            state = optional(nvml, "nvmlDeviceGetNvLinkState", handle, link)
        except nvml.NVMLError as exc:
            if error_code(exc) == NVML_ERROR_INVALID_ARGUMENT:
                continue  # beyond this GPU's links
            raise
        if state is None:
            continue
        remote = optional(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        remote_bus = normalise_bus_id(remote.busId) if remote is not None else None
        device_type = optional(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        remote_gpu_index = gpu_index_by_bus.get(remote_bus) if remote_bus else None
        remote_type: str | None
        if device_type is not None:
            remote_type = NVLINK_DEVICE_TYPES.get(int(device_type), "unknown")
        else:
            remote_type = "gpu" if remote_gpu_index is not None else None
        links.append(
            {
                "link": link,
                "active": bool(state),
                "remote_pci_bus_id": remote_bus,
                "remote_device_type": remote_type,
                "remote_gpu_index": remote_gpu_index,
            }
        )
    return links


def _read_processes(nvml: ModuleType, handle: Any) -> list[dict[str, Any]]:
    procs = optional(nvml, "nvmlDeviceGetComputeRunningProcesses", handle) or []
    result = []
    for proc in procs:
        used = getattr(proc, "usedGpuMemory", None)
        result.append({"pid": int(proc.pid), "used_memory_mib": None if used is None else int(used) // MIB})
    return result


def read_gpu_facts(
    nvml: ModuleType, index: int, handle: Any, gpu_index_by_bus: dict[str, int]
) -> dict[str, Any]:
    """Every fact of one GPU; NVML errors other than 'unsupported' propagate."""
    facts = empty_gpu_facts(index)
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    memory = optional(nvml, "nvmlDeviceGetMemoryInfo", handle)
    persistence = optional(nvml, "nvmlDeviceGetPersistenceMode", handle)
    facts.update(
        {
            "uuid": nvml.nvmlDeviceGetUUID(handle),
            "name": nvml.nvmlDeviceGetName(handle),
            "serial": optional(nvml, "nvmlDeviceGetSerial", handle),
            "pci_bus_id": normalise_bus_id(pci.busId),
            "memory_total_mib": None if memory is None else int(memory.total) // MIB,
            "memory_used_mib": None if memory is None else int(memory.used) // MIB,
            "persistence_mode": None if persistence is None else bool(persistence),
            "power": _read_power(nvml, handle),
            "temperature": _read_temperature(nvml, handle),
            "ecc": _read_ecc(nvml, handle),
            "remapped_rows": _read_remapped_rows(nvml, handle),
            "retired_pages": _read_retired_pages(nvml, handle),
            "recovery_action": read_recovery_action(nvml, handle),
            "nvlinks": _read_nvlinks(nvml, handle, gpu_index_by_bus),
            "processes": _read_processes(nvml, handle),
        }
    )
    return facts


def _failed(index: int, handle: Any, exc: BaseException) -> GpuReading:
    facts = empty_gpu_facts(index)
    message = describe_error(exc, f"GPU {index}")
    facts["error"] = message
    reason = "gpu_lost" if error_code(exc) == NVML_ERROR_GPU_IS_LOST else "nvml_error"
    return GpuReading(index, handle, facts, reason, message)


def read_node(nvml: ModuleType, with_details: bool = True) -> NodeReading:
    """Read the system facts and every GPU. ``with_details=False`` reads identity only (index, uuid, bus)."""
    node = NodeReading(system=read_system(nvml))
    handles: list[tuple[int, Any, BaseException | None]] = []
    gpu_index_by_bus: dict[str, int] = {}
    for index in range(node.system["gpu_count"]):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            bus = normalise_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except nvml.NVMLError as exc:
            handles.append((index, None, exc))
            continue
        if bus:
            gpu_index_by_bus[bus] = index
        handles.append((index, handle, None))
    for index, handle, error in handles:
        if error is not None:
            node.gpus.append(_failed(index, handle, error))
            continue
        try:
            if with_details:
                facts = read_gpu_facts(nvml, index, handle, gpu_index_by_bus)
            else:
                facts = empty_gpu_facts(index)
                facts["uuid"] = nvml.nvmlDeviceGetUUID(handle)
                facts["pci_bus_id"] = normalise_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except nvml.NVMLError as exc:
            node.gpus.append(_failed(index, handle, exc))
            continue
        node.gpus.append(GpuReading(index, handle, facts))
    return node


def nvlink_count(a: dict[str, Any], b: dict[str, Any]) -> int:
    """Active NVLinks joining two GPUs, as ``nvidia-smi topo -m`` counts them (NV<n>).

    Direct links (bridges) are counted from ``a``'s side. When both GPUs reach a common NVSwitch, the
    pair gets the smaller of their active switch-link counts: on an HGX A100 board that is 12 (NV12).
    """
    direct = sum(1 for link in a["nvlinks"] if link["active"] and link["remote_gpu_index"] == b["index"])

    def switch_links(gpu: dict[str, Any]) -> tuple[int, set[str]]:
        active = [
            link for link in gpu["nvlinks"] if link["active"] and link.get("remote_device_type") == "switch"
        ]
        return len(active), {link["remote_pci_bus_id"] for link in active if link["remote_pci_bus_id"]}

    count_a, switches_a = switch_links(a)
    count_b, switches_b = switch_links(b)
    via_switch = min(count_a, count_b) if switches_a & switches_b else 0
    return direct + via_switch


def topology_matrix(nvml: ModuleType, gpus: list[GpuReading]) -> list[list[str | None]]:
    """``topology[i][j]`` as ``nvidia-smi topo -m`` names it; None where it cannot be determined."""
    matrix: list[list[str | None]] = []
    for a in gpus:
        row: list[str | None] = []
        for b in gpus:
            if a.index == b.index:
                row.append("X")
                continue
            if a.error_reason or b.error_reason:
                row.append(None)
                continue
            links = nvlink_count(a.facts, b.facts)
            if links:
                row.append(f"NV{links}")
                continue
            try:
                level = optional(nvml, "nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
            except nvml.NVMLError:
                level = None
            row.append(None if level is None else TOPOLOGY_LEVEL_NAMES.get(int(level)))
        matrix.append(row)
    return matrix
