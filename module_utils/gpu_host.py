"""What the kernel shows about the GPUs without NVML: the processes holding /dev/nvidia* and the NVSwitches
on the PCI bus. Both are read from /proc and /sys, so they work before the driver is installed and during a
driver/library version mismatch (when NVML cannot start). The roots are parameters for the unit tests.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Collection
from typing import Any

PROC_ROOT = "/proc"
PCI_DEVICES_DIR = "/sys/bus/pci/devices"
GPU_DEVICE_PREFIX = "/dev/nvidia"  # /dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-caps/...
NVIDIA_PCI_VENDOR = "0x10de"
NVSWITCH_PCI_CLASS = "0x0680"  # "bridge, other": on an NVIDIA device, an NVSwitch
# The driver's own daemons hold the devices but are no GPU workload. /proc/PID/comm keeps 15 characters.
DRIVER_DAEMON_COMMS = ("nvidia-persiste", "nv-fabricmanage")


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


def device_processes(
    proc_root: str | None = None, exclude_pids: Collection[int] = ()
) -> list[dict[str, Any]]:
    """Every process with an open file descriptor on /dev/nvidia*, by pid: pid, name (comm), user
    (effective), devices (sorted) and driver_daemon (nvidia-persistenced or nv-fabricmanager).
    Processes that exit during the scan are left out. Other users' processes need root to be seen."""
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
        processes.append(
            {
                "pid": pid,
                "name": name,
                "user": _effective_user(proc_dir),
                "devices": devices,
                "driver_daemon": name.startswith(DRIVER_DAEMON_COMMS),
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
