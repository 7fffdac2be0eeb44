"""What the gpu_settings module and the boot-time apply of role gpu_tuning share: reading a GPU's settings
and their allowed ranges, applying one setting through NVML, and describing what changed.

No Ansible import: the boot-time script (roles/gpu_tuning/files/gpu_tuning_apply.py) runs on nodes without
Ansible, with this file and the module_utils it imports installed next to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ansible.module_utils.gpu_inventory import normalise_bus_id, temperature_threshold, watts
from ansible.module_utils.nvml_session import describe_error, is_unsupported, optional

SETTINGS = ("power_limit_w", "persistence_mode", "target_temperature_c")


@dataclass
class GpuState:
    index: int
    handle: Any
    uuid: str
    pci_bus_id: str | None
    current: dict[str, Any]
    ranges: dict[str, tuple[Any, Any] | None]
    desired: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.pci_bus_id})"

    def changes(self) -> dict[str, tuple[Any, Any]]:
        return {
            name: (self.current[name], value)
            for name, value in self.desired.items()
            if self.current[name] != value
        }


def read_gpu(nvml: ModuleType, index: int) -> GpuState:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    constraints = optional(nvml, "nvmlDeviceGetPowerManagementLimitConstraints", handle)
    persistence = optional(nvml, "nvmlDeviceGetPersistenceMode", handle)

    target_min = temperature_threshold(nvml, handle, "NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN")
    target_max = temperature_threshold(nvml, handle, "NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX")
    return GpuState(
        index=index,
        handle=handle,
        uuid=nvml.nvmlDeviceGetUUID(handle),
        pci_bus_id=normalise_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId),
        current={
            "power_limit_w": watts(optional(nvml, "nvmlDeviceGetPowerManagementLimit", handle)),
            "persistence_mode": None if persistence is None else bool(persistence),
            "target_temperature_c": temperature_threshold(
                nvml, handle, "NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR"
            ),
        },
        ranges={
            "power_limit_w": None if constraints is None else (watts(constraints[0]), watts(constraints[1])),
            "persistence_mode": None,
            "target_temperature_c": None
            if target_min is None or target_max is None
            else (target_min, target_max),
        },
    )


def desire(
    gpus: list[GpuState], requested: dict[str, Any]
) -> tuple[list[tuple[GpuState, str, str]], list[tuple[GpuState, str]]]:
    """Set each GPU's desired values to ``requested`` (the SETTINGS keys), as the gpu_settings module does
    before it changes anything. Returns (the (GPU, setting, message) of each value outside the GPU's range,
    which fail the module; the (GPU, setting) pairs the GPU does not support, which fail it or are skipped
    with a warning)."""
    problems: list[tuple[GpuState, str, str]] = []
    unsupported: list[tuple[GpuState, str]] = []
    for gpu in gpus:
        for name, value in requested.items():
            if gpu.current[name] is None:
                unsupported.append((gpu, name))
                continue
            allowed = gpu.ranges[name]
            if allowed is not None and not allowed[0] <= value <= allowed[1]:
                message = (
                    f"{gpu.label}: {name} {value}{unit(name)} is outside the allowed range "
                    f"{allowed[0]}-{allowed[1]}{unit(name)}"
                )
                problems.append((gpu, name, message))
                continue
            gpu.desired[name] = value
    return problems, unsupported


def pending_settings(
    nvml: ModuleType, requested: dict[str, Any], indices: list[int] | None
) -> list[dict[str, Any]]:
    """What the gpu_settings module, given ``requested`` and ``gpus: indices`` (None: all), would do on this
    node besides finding everything in place, read in an open NVML session by the same rules it applies
    (read_gpu, desire, GpuState.changes): one entry per GPU and setting, ``action`` one of ``change`` (with
    ``before`` and ``after``), ``unsupported`` (it fails or warns), ``out_of_range`` (it fails), ``absent``
    or ``unreadable`` (no such GPU, or NVML cannot read it: it fails). Empty: it would change nothing."""
    count = nvml.nvmlDeviceGetCount()
    wanted = list(range(count)) if indices is None else list(dict.fromkeys(indices))
    pending: list[dict[str, Any]] = []

    def entry(gpu: int, name: str | None, action: str, message: str, **values: Any) -> None:
        pending.append({"gpu": gpu, "setting": name, "action": action, "message": message, **values})

    gpus: list[GpuState] = []
    for index in wanted:
        if not 0 <= index < count:
            entry(index, None, "absent", f"No GPU {index} on this node ({count} GPUs)")
            continue
        try:
            gpus.append(read_gpu(nvml, index))
        except nvml.NVMLError as exc:
            entry(index, None, "unreadable", describe_error(exc, f"Reading GPU {index}"))
    problems, unsupported = desire(gpus, requested)
    for gpu, name in unsupported:
        entry(gpu.index, name, "unsupported", f"{gpu.label} does not support {name}")
    for gpu, name, message in problems:
        entry(gpu.index, name, "out_of_range", message)
    for gpu in gpus:
        for name, (before, after) in gpu.changes().items():
            entry(
                gpu.index,
                name,
                "change",
                f"{gpu.label}: {name} {before} -> {after}{unit(name)}",
                before=before,
                after=after,
            )
    return pending


def apply(nvml: ModuleType, gpu: GpuState, name: str, value: Any) -> None:
    if name == "power_limit_w":
        nvml.nvmlDeviceSetPowerManagementLimit(gpu.handle, int(value) * 1000)
    elif name == "persistence_mode":
        mode = nvml.NVML_FEATURE_ENABLED if value else nvml.NVML_FEATURE_DISABLED
        nvml.nvmlDeviceSetPersistenceMode(gpu.handle, mode)
    else:
        nvml.nvmlDeviceSetTemperatureThreshold(
            gpu.handle, nvml.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR, value
        )


def unit(name: str) -> str:
    return {"power_limit_w": " W", "target_temperature_c": " C"}.get(name, "")


def summarise(gpus: list[GpuState], applied: dict[int, dict[str, tuple[Any, Any]]]) -> str:
    by_change: dict[str, list[str]] = {}
    for gpu in gpus:
        for name, (before, after) in applied.get(gpu.index, {}).items():
            key = f"{name} {before} -> {after}{unit(name)}"
            by_change.setdefault(key, []).append(str(gpu.index))
    if not by_change:
        return "all requested settings already in place"
    return "; ".join(
        f"{change} on GPU{'s' if len(idx) > 1 else ''} {', '.join(idx)}" for change, idx in by_change.items()
    )


def apply_saved_settings(nvml: ModuleType, settings: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The boot-time apply: put ``settings`` (gpu_tuning's JSON: the SETTINGS keys, null for "leave it",
    and ``gpus``, empty for all) back on the GPUs, changing only what differs. A setting a GPU does not
    support is skipped. Returns (what was done or skipped, failures); goes on after a failure."""
    requested = {name: settings[name] for name in SETTINGS if settings.get(name) is not None}
    count = nvml.nvmlDeviceGetCount()
    indices = list(dict.fromkeys(settings.get("gpus") or range(count)))
    done: list[str] = []
    failures: list[str] = []
    for index in indices:
        if not 0 <= index < count:
            failures.append(f"GPU {index}: not present ({count} GPUs)")
            continue
        try:
            gpu = read_gpu(nvml, index)
        except nvml.NVMLError as exc:
            failures.append(describe_error(exc, f"Reading GPU {index}"))
            continue
        for name, value in requested.items():
            if gpu.current[name] is None:
                done.append(f"{gpu.label}: {name} not supported by this GPU, skipped")
            else:
                gpu.desired[name] = value
        for name, (before, after) in gpu.changes().items():
            try:
                apply(nvml, gpu, name, after)
            except nvml.NVMLError as exc:
                if is_unsupported(exc):
                    done.append(f"{gpu.label}: {name} not supported by this GPU, skipped")
                else:
                    failures.append(describe_error(exc, f"Setting {name}={after} on {gpu.label}"))
                continue
            done.append(f"{gpu.label}: {name} {before} -> {after}{unit(name)}")
    return done, failures
