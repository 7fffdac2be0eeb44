"""What the kernel shows about the GPUs without NVML: the processes holding /dev/nvidia* (with the systemd
unit or Kubernetes pod each runs in) and the NVSwitches on the PCI bus. Both are read from /proc and /sys,
so they work before the driver is installed and during a driver/library version mismatch (when NVML cannot
start). The roots are parameters for the unit tests.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Collection
from typing import Any

PROC_ROOT = "/proc"
PCI_DEVICES_DIR = "/sys/bus/pci/devices"
GPU_DEVICE_PREFIX = "/dev/nvidia"  # /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-caps/...
NVIDIA_PCI_VENDOR = "0x10de"
NVSWITCH_PCI_CLASS = "0x0680"  # "bridge, other": on an NVIDIA device, an NVSwitch
# The driver's own daemons hold the devices but are no GPU workload. /proc/PID/comm keeps 15 characters.
DRIVER_DAEMON_COMMS = ("nvidia-persiste", "nv-fabricmanage")
# A Kubernetes pod's cgroup, as the kubelet names it: the systemd driver's slice
# (kubepods[-<qos>]-pod<uid with _ for ->.slice) or the cgroupfs driver's directory (pod<uid>).
POD_CGROUP = re.compile(
    r"^(?:kubepods-(?:besteffort-|burstable-)?)?pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}"
    r"[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$"
)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _effective_user(proc_dir: str) -> str | None:
    status = _read(os.path.join(proc_dir, "status")) or ""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) < 3 or not fields[2].isdigit():
                return None
            uid = int(fields[2])  # real, effective, saved, filesystem: the effective one, as ps shows
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                return str(uid)
    return None


def _held_devices(proc_dir: str) -> list[str]:
    fd_dir = os.path.join(proc_dir, "fd")
    try:
        fds = os.listdir(fd_dir)
    except OSError:  # gone, or not ours to read
        return []
    devices = set()
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:  # closed meanwhile
            continue
        if target.startswith(GPU_DEVICE_PREFIX):
            devices.add(target)
    return sorted(devices)


def _cgroup_path(proc_dir: str) -> str:
    """The process's cgroup path: cgroup v1's name=systemd hierarchy (the one systemd names units in),
    else cgroup v2's unified one; "" when unreadable."""
    lines = (_read(os.path.join(proc_dir, "cgroup")) or "").splitlines()
    paths = dict(line.split(":", 2)[1:] for line in lines if line.count(":") >= 2)
    return paths.get("name=systemd") or paths.get("") or ""


def unit_and_pod(proc_dir: str) -> tuple[str | None, str | None]:
    """(systemd unit, Kubernetes pod uid) the process runs in, from /proc/PID/cgroup: the pod when a path
    component is a pod's cgroup (the unit is then the container's scope, left out), else the innermost
    .service or .scope component (a node in a container has the container's own scope above its units)."""
    components = [c for c in _cgroup_path(proc_dir).split("/") if c]
    for component in components:
        match = POD_CGROUP.match(component)
        if match:
            return None, match["uid"].replace("_", "-")
    units = [c for c in components if c.endswith((".service", ".scope"))]
    return (units[-1] if units else None), None


def device_processes(
    proc_root: str | None = None, exclude_pids: Collection[int] = ()
) -> list[dict[str, Any]]:
    """Every process with an open file descriptor on /dev/nvidia*, by pid: pid, name (comm), user
    (effective), devices (sorted), driver_daemon (nvidia-persistenced or nv-fabricmanager), and the systemd
    unit or Kubernetes pod uid it runs in (unit_and_pod; None when not known). Processes that exit during
    the scan are left out. Other users' processes need root to be seen."""
    proc_root = proc_root or PROC_ROOT
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return []
    processes = []
    for entry in sorted((e for e in entries if e.isdigit()), key=int):
        pid = int(entry)
        if pid in exclude_pids:
            continue
        proc_dir = os.path.join(proc_root, entry)
        devices = _held_devices(proc_dir)
        if not devices:
            continue
        comm = _read(os.path.join(proc_dir, "comm"))
        if comm is None:  # exited during the scan
            continue
        name = comm.strip()
        unit, pod_uid = unit_and_pod(proc_dir)
        processes.append(
            {
                "pid": pid,
                "name": name,
                "user": _effective_user(proc_dir),
                "devices": devices,
                "driver_daemon": name.startswith(DRIVER_DAEMON_COMMS),
                "unit": unit,
                "pod_uid": pod_uid,
            }
        )
    return processes


def nvswitch_pci_devices(pci_devices_dir: str | None = None) -> list[str]:
    """PCI addresses (as in /sys/bus/pci/devices) of NVIDIA devices of class 0x0680: the NVSwitches.
    Needs no driver: the PCI core lists them, with their links up or not."""
    pci_devices_dir = pci_devices_dir or PCI_DEVICES_DIR
    try:
        names = os.listdir(pci_devices_dir)
    except OSError:
        return []
    switches = []
    for name in sorted(names):
        vendor = _read(os.path.join(pci_devices_dir, name, "vendor"))
        device_class = _read(os.path.join(pci_devices_dir, name, "class"))
        if vendor is None or device_class is None:
            continue
        if vendor.strip() == NVIDIA_PCI_VENDOR and device_class.strip().startswith(NVSWITCH_PCI_CLASS):
            switches.append(name)
    return switches


def _visible_devices(proc_dir: str) -> str | None:
    """NVIDIA_VISIBLE_DEVICES of the process (what the device plugin gave its container), None if unset."""
    try:
        with open(os.path.join(proc_dir, "environ"), "rb") as f:
            environ = f.read()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(b"NVIDIA_VISIBLE_DEVICES="):
            return entry.split(b"=", 1)[1].decode("utf-8", "replace")
    return None


def gpu_pods(proc_root: str | None = None) -> dict[str, dict[str, Any]]:
    """The Kubernetes pods on this node that use GPUs, by pod uid: ``visible`` (the GPUs of their
    containers' NVIDIA_VISIBLE_DEVICES, as the device plugin set it: UUIDs, indexes or ``all``), ``devices``
    (the /dev/nvidia<minor> their processes hold open) and ``pids``. A pod that was given a GPU but has not
    opened it yet is found by the first; one using a GPU it was not given (a privileged container) by the
    second. Needs root to read other users' processes."""
    proc_root = proc_root or PROC_ROOT
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return {}
    pods: dict[str, dict[str, Any]] = {}
    for entry in sorted((e for e in entries if e.isdigit()), key=int):
        proc_dir = os.path.join(proc_root, entry)
        _, pod_uid = unit_and_pod(proc_dir)
        if pod_uid is None:
            continue
        visible = _visible_devices(proc_dir)
        devices = [d for d in _held_devices(proc_dir) if re.fullmatch(r"/dev/nvidia\d+", d)]
        if not visible and not devices:
            continue
        pod = pods.setdefault(pod_uid, {"visible": [], "devices": [], "pids": []})
        for item in (visible or "").split(","):
            if item.strip() and item.strip() not in pod["visible"]:
                pod["visible"].append(item.strip())
        pod["devices"] = sorted(set(pod["devices"]) | set(devices))
        pod["pids"].append(int(entry))
    return pods


def pod_uses_gpu(pod: dict[str, Any], index: int, uuid: str, minor: int) -> bool:
    """Whether a pod of gpu_pods() uses the GPU (its NVML index, UUID and device minor number)."""
    visible = {v.lower() for v in pod.get("visible", [])}
    by_env = "all" in visible or str(index) in visible or uuid.lower() in visible
    by_env = by_env or any(uuid.lower().startswith(v) for v in visible if v.startswith("gpu-"))
    return by_env or f"/dev/nvidia{minor}" in pod.get("devices", [])
