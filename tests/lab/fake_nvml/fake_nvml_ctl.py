#!/usr/bin/env python3
"""fake-nvml: create and change the simulated GPUs behind the lab's fake ``pynvml``.

Installed on every lab node as ``/usr/local/sbin/fake-nvml`` (with ``pynvml.py`` in
``/usr/local/lib/fake-nvml/``). Standard library only; it writes the JSON state file that the fake
``pynvml`` reads (``$FAKE_NVML_STATE``, default ``/var/lib/fake-nvml/state.json``).

GPUs are addressed by their index at ``init`` time (their slot): it stays the same after
``gpu --remove``, whereas NVML renumbers the GPUs that are left, as the real driver does.

Machine shapes are generated, not hand-written:

* ``a100-pcie-40gb-x4``: 4 x "NVIDIA A100-PCIE-40GB", 250 W default, 150-250 W range. GPUs 0-1 and
  2-3 are joined by three NVLink bridges each. A PCIe A100 has 12 third-generation NVLinks and a
  bridge carries 4 of them, so with the 3 bridges NVIDIA sells for A100 PCIe all 12 links of each GPU
  go to its partner and ``nvidia-smi topo -m`` shows NV12 within a pair. GPUs 0-1 sit on CPU socket 0,
  2-3 on socket 1 (PCIe NODE within a socket, SYS across).
* ``a100-sxm4-40gb-x8``: an HGX A100 board, 8 x "NVIDIA A100-SXM4-40GB", 400 W default, 100-400 W.
  Each GPU's 12 NVLinks go two each to the board's 6 NVSwitches, so every pair is NV12. PCIe: pairs
  behind one switch (PXB), four GPUs per socket (NODE), SYS across sockets.

UUIDs and serial numbers are derived from the host name (stable across ``init``); PCI bus ids come
from the shape, as identical servers have identical PCI layouts. The loaded kernel module is driver 535.183.06
unless told otherwise; the CUDA and NVML versions NVML reports follow its branch (CUDA_BY_BRANCH: 535 reports
CUDA 12.2, 580 CUDA 13.0), at ``init``, at ``reset`` (a reboot: the installed library's version) and at
``kernel-version`` (the module loaded by the lab's modprobe, the nvidia-dkms stand-in's hook).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

STATE_ENV = "FAKE_NVML_STATE"
LIBRARY_ENV = "FAKE_NVML_LIBRARY"
KMSG_ENV = "FAKE_NVML_KMSG"
DEFAULT_STATE = "/var/lib/fake-nvml/state.json"
# The lab's kernel log: the lab nodes share this machine's kernel, so the fake driver never writes to
# /dev/kmsg; it writes /dev/kmsg's record format to this file, which the product reads where the lab
# inventory points it (gpu_health_agent_kernel_log; docs/lab.md "GPU faults").
DEFAULT_KMSG = "/var/lib/fake-nvml/kmsg"
DEFAULT_LIBRARY = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
DEFAULT_DRIVER_VERSION = "535.183.06"
# What a driver of each branch reports through NVML: nvmlSystemGetCudaDriverVersion, the newest CUDA it runs
# (major * 1000 + minor * 10, what nvidia-smi prints as "CUDA Version"), whose major also leads the NVML
# version (nvmlSystemGetNVMLVersion: "12.535.183.06" for driver 535.183.06). From NVIDIA's release notes: R535
# supports CUDA 12.2, R550 12.4, R580 13.0 (roles/vllm_serving/vars/main.yml, vllm_serving_driver_max_cuda,
# has the same; tests/unit/test_fake_nvml_ctl.py holds the two equal). The branches the lab's mirror carries
# a driver of; the real library exists only for real branches, so a version of another is refused.
CUDA_BY_BRANCH: dict[str, int] = {"535": 12020, "550": 12040, "580": 13000}
STATE_SCHEMA = 1

MIB = 1024 * 1024

# NVML topology levels (nvmlGpuTopologyLevel_t)
TOPOLOGY_MULTIPLE = 20  # PXB
TOPOLOGY_NODE = 40  # NODE
TOPOLOGY_SYSTEM = 50  # SYS


class CtlError(Exception):
    """Bad input or state; printed as one line, exit status 1."""


@dataclass(frozen=True)
class Shape:
    name: str
    gpu_name: str
    pci_buses: tuple[int, ...]
    pci_device_id: int
    pci_subsystem_id: int
    memory_mib: int
    default_limit_w: int
    min_limit_w: int
    max_limit_w: int
    idle_draw_w: float
    vbios_version: str
    links_per_gpu: int
    # "bridge-pairs": all links of GPU 2k go to GPU 2k+1. "nvswitch": links spread over the switches.
    nvlink_layout: str
    nvswitch_buses: tuple[int, ...]
    gpus_per_socket: int
    gpus_per_pcie_switch: int

    @property
    def gpu_count(self) -> int:
        return len(self.pci_buses)


SHAPES: dict[str, Shape] = {
    shape.name: shape
    for shape in (
        Shape(
            name="a100-pcie-40gb-x4",
            gpu_name="NVIDIA A100-PCIE-40GB",
            pci_buses=(0x17, 0x31, 0xB1, 0xCA),
            pci_device_id=0x20F110DE,
            pci_subsystem_id=0x145F10DE,
            memory_mib=40960,
            default_limit_w=250,
            min_limit_w=150,
            max_limit_w=250,
            idle_draw_w=36.0,
            vbios_version="92.00.25.00.08",
            links_per_gpu=12,
            nvlink_layout="bridge-pairs",
            nvswitch_buses=(),
            gpus_per_socket=2,
            gpus_per_pcie_switch=1,
        ),
        Shape(
            name="a100-sxm4-40gb-x8",
            gpu_name="NVIDIA A100-SXM4-40GB",
            pci_buses=(0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD),
            pci_device_id=0x20B010DE,
            pci_subsystem_id=0x134F10DE,
            memory_mib=40960,
            default_limit_w=400,
            min_limit_w=100,
            max_limit_w=400,
            idle_draw_w=58.0,
            vbios_version="92.00.36.00.02",
            links_per_gpu=12,
            nvlink_layout="nvswitch",
            nvswitch_buses=(0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9),
            gpus_per_socket=4,
            gpus_per_pcie_switch=2,
        ),
    )
}


# ---------------------------------------------------------------------------------------------------
# State generation
# ---------------------------------------------------------------------------------------------------
def _digest(host: str, slot: int, what: str) -> bytes:
    return hashlib.sha256(f"fake-nvml/{host}/{slot}/{what}".encode()).digest()


def _pci(bus: int, device_id: int = 0, subsystem_id: int = 0) -> dict[str, int]:
    return {
        "domain": 0,
        "bus": bus,
        "device": 0,
        "pci_device_id": device_id,
        "pci_subsystem_id": subsystem_id,
    }


def _gpu_links(shape: Shape, slot: int) -> list[dict[str, Any]]:
    links = []
    for link in range(shape.links_per_gpu):
        if shape.nvlink_layout == "bridge-pairs":
            peer = slot ^ 1
            remote: dict[str, Any] = {
                "remote_type": "gpu",
                "remote_slot": peer,
                "remote_link": link,
                "remote_pci": _pci(shape.pci_buses[peer], shape.pci_device_id, shape.pci_subsystem_id),
            }
        else:
            switch_bus = shape.nvswitch_buses[link // 2]
            remote = {"remote_type": "switch", "remote_pci": _pci(switch_bus, 0x1AF110DE, 0x000010DE)}
        links.append({"link": link, "active": True, "version": 3, **remote})
    return links


def _pcie_level(shape: Shape, a: int, b: int) -> int:
    if a // shape.gpus_per_socket != b // shape.gpus_per_socket:
        return TOPOLOGY_SYSTEM
    if shape.gpus_per_pcie_switch > 1 and a // shape.gpus_per_pcie_switch == b // shape.gpus_per_pcie_switch:
        return TOPOLOGY_MULTIPLE
    return TOPOLOGY_NODE


def build_gpu(shape: Shape, host: str, slot: int) -> dict[str, Any]:
    digest = _digest(host, slot, "gpu")
    limit_mw = shape.default_limit_w * 1000
    return {
        "slot": slot,
        "present": True,
        "lost": False,
        "name": shape.gpu_name,
        "uuid": "GPU-" + str(uuid.UUID(bytes=digest[:16])),
        "serial": str(1320000000000 + int.from_bytes(digest[16:22], "big") % 10**9),
        "minor_number": slot,
        "brand": 14,  # NVML_BRAND_NVIDIA
        "architecture": 7,  # NVML_DEVICE_ARCH_AMPERE
        "compute_capability": [8, 0],
        "vbios_version": shape.vbios_version,
        "compute_mode": 0,
        "pci": _pci(shape.pci_buses[slot], shape.pci_device_id, shape.pci_subsystem_id),
        "memory": {"total": shape.memory_mib * MIB, "used": 0, "reserved": 0},
        "persistence_mode": 0,
        "power": {
            "limit_mw": limit_mw,
            "enforced_mw": limit_mw,
            "default_mw": limit_mw,
            "min_mw": shape.min_limit_w * 1000,
            "max_mw": shape.max_limit_w * 1000,
            "draw_mw": int(shape.idle_draw_w * 1000) + digest[22] * 10,
        },
        "temperature": {
            "gpu": 30 + digest[23] % 6,
            "shutdown": 92,
            "slowdown": 89,
            "gpu_max": 85,
            "mem_max": 95,
            # Passively cooled data-centre GPUs have no GPU target temperature: NVML says Not Supported.
            "target": None,
            "target_min": None,
            "target_max": None,
        },
        "ecc": {
            "current": 1,
            "pending": 1,
            "volatile": {"corrected": 0, "uncorrected": 0},
            "aggregate": {"corrected": 0, "uncorrected": 0},
        },
        # A100 repairs memory by row remapping; page retirement is not supported (NVML: Not Supported).
        # The histogram counts DRAM banks by the spare rows they have left (nvidia-smi -q: "Bank Remap
        # Availability Histogram"; an A100 40GB reports 640 banks at Max).
        "remapped_rows": {
            "correctable": 0,
            "uncorrectable": 0,
            "pending": 0,
            "failure": 0,
            "histogram": {"max": 640, "high": 0, "partial": 0, "low": 0, "none": 0},
        },
        "retired_pages": None,
        # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: reported by R565 and later drivers only; None = this 535
        # driver does not report it (fake-nvml recovery-action simulates a newer one).
        "recovery_action": None,
        "nvlinks": _gpu_links(shape, slot),
        "processes": [],
    }


def driver_reports(version: str) -> dict[str, Any]:
    """What NVML reports of a loaded driver VERSION besides the version itself, as state keys: the CUDA
    version of its branch and the NVML version ("<CUDA major>.<driver version>"). A branch not in
    CUDA_BY_BRANCH is refused rather than given another branch's CUDA (the fake reported a 535 driver's
    CUDA 12.2 for any driver before, where a 580 reports 13.0)."""
    branch = version.split(".", 1)[0]
    cuda = CUDA_BY_BRANCH.get(branch)
    if cuda is None:
        raise CtlError(
            f"driver version {version!r} is of branch {branch!r}, which the fake NVML does not know: no CUDA "
            f"version to report for it (known branches: {', '.join(sorted(CUDA_BY_BRANCH))}; CUDA_BY_BRANCH "
            "in fake_nvml_ctl.py)"
        )
    return {"nvml_version": f"{cuda // 1000}.{version}", "cuda_driver_version": cuda}


def build_state(
    shape_name: str, host: str, kernel_module_version: str = DEFAULT_DRIVER_VERSION
) -> dict[str, Any]:
    """The state of a freshly booted machine of the given shape, its kernel module kernel_module_version
    (the CUDA and NVML versions of that driver's branch)."""
    shape = SHAPES.get(shape_name)
    if shape is None:
        raise CtlError(f"unknown shape {shape_name!r}; choose one of: {', '.join(sorted(SHAPES))}")
    n = shape.gpu_count
    return {
        "schema": STATE_SCHEMA,
        "shape": shape.name,
        "host": host,
        "kernel_module_version": kernel_module_version,
        **driver_reports(kernel_module_version),
        "nvswitches": [_pci(bus, 0x1AF110DE, 0x000010DE) for bus in shape.nvswitch_buses],
        "pcie_topology": [[0 if a == b else _pcie_level(shape, a, b) for b in range(n)] for a in range(n)],
        "missing_functions": [],
        "gpus": [build_gpu(shape, host, slot) for slot in range(n)],
        # the driver's event queue (nvmlEventSetWait) and the kernel log's last record number
        "events": [],
        "event_seq": 0,
        "kmsg_seq": 0,
    }


# ---------------------------------------------------------------------------------------------------
# State file access: exclusive lock, write a temp file, atomic rename (same protocol as pynvml.py)
# ---------------------------------------------------------------------------------------------------
def state_path() -> str:
    return os.environ.get(STATE_ENV, DEFAULT_STATE)


def library_path() -> str:
    return os.environ.get(LIBRARY_ENV, DEFAULT_LIBRARY)


def kmsg_path() -> str:
    return os.environ.get(KMSG_ENV, DEFAULT_KMSG)


def library_version() -> str | None:
    try:
        with open(library_path(), encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition("=")
                if sep and key.strip() == "version":
                    return value.strip()
    except OSError:
        return None
    return ""


def _write(path: str, state: dict[str, Any]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".state-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: str, must_exist: bool = True) -> Iterator[dict[str, Any]]:
    """Yield the state (or {} when absent and allowed) under the lock; write it back on success."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError as exc:
        raise CtlError(f"cannot lock {path}: {exc.strerror} (run as root)") from exc
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        state = read_state(path) if must_exist or os.path.exists(path) else {}
        yield state
        try:
            _write(path, state)
        except PermissionError as exc:
            raise CtlError(f"cannot write {path}: {exc.strerror} (run as root)") from exc
    finally:
        os.close(lock_fd)


def read_state(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError as exc:
        raise CtlError(f"no GPU state at {path}; create it with: fake-nvml init --shape SHAPE") from exc
    except (OSError, ValueError) as exc:
        raise CtlError(f"cannot read GPU state {path}: {exc}") from exc
    if not isinstance(state, dict) or state.get("schema") != STATE_SCHEMA:
        raise CtlError(
            f"{path} is not a fake-nvml state file (schema {STATE_SCHEMA}); re-create it with init --force"
        )
    return state


def gpu_by_slot(state: dict[str, Any], slot: int) -> dict[str, Any]:
    for gpu in state["gpus"]:
        if gpu["slot"] == slot:
            return gpu
    raise CtlError(f"no GPU {slot}: this {state['shape']} machine has GPUs 0-{len(state['gpus']) - 1}")


# ---------------------------------------------------------------------------------------------------
# Subcommands
# ---------------------------------------------------------------------------------------------------
def cmd_init(args: argparse.Namespace) -> str:
    path = state_path()
    host = args.host or socket.gethostname()
    new_state = build_state(args.shape, host, args.kernel_version)
    with locked(path, must_exist=False) as state:
        if state and not args.force:
            raise CtlError(f"{path} already exists (shape {state.get('shape')}); use --force to replace it")
        state.clear()
        state.update(new_state)
    return f"initialised {path}: {args.shape} for host {host}, kernel module {args.kernel_version}"


def cmd_reset(args: argparse.Namespace) -> str:
    """A reboot: no faults, default settings, and the kernel module matches the library again."""
    path = state_path()
    with locked(path) as state:
        kernel = library_version() or state.get("kernel_module_version", DEFAULT_DRIVER_VERSION)
        # first, so a library of a branch NVML has no table entry for is refused before anything changes
        fresh = build_state(state["shape"], state["host"], kernel)
        _stop_all_holders(state)  # a reboot ends every process
        # the kernel log starts empty; its record numbers go on, as a new boot's seem new
        fresh["kmsg_seq"], fresh["event_seq"] = state.get("kmsg_seq", 0), state.get("event_seq", 0)
        state.clear()
        state.update(fresh)
        if os.path.exists(kmsg_path()):
            with open(kmsg_path(), "w", encoding="utf-8"):
                pass
    return f"reset {path}: {state['shape']} for host {state['host']}, kernel module {kernel}"


def cmd_load(args: argparse.Namespace) -> str:
    """Replace the state with one saved by `show --json` (tests save and restore a node this way)."""
    path = state_path()
    source = sys.stdin if args.file == "-" else None
    try:
        if source is not None:
            text = source.read()
        else:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
        saved = json.loads(text)
    except (OSError, ValueError) as exc:
        raise CtlError(f"cannot read a saved state from {args.file}: {exc}") from exc
    if not isinstance(saved, dict) or saved.get("schema") != STATE_SCHEMA or "gpus" not in saved:
        raise CtlError(f"{args.file} is not a fake-nvml state (from `fake-nvml show --json`)")
    with locked(path, must_exist=False) as state:
        state.clear()
        state.update(saved)
    return f"loaded {args.file} into {path}"


def _watts(mw: int) -> str:
    return f"{mw / 1000:g}"


def render(state: dict[str, Any], path: str) -> str:
    lib = library_version()
    lib_text = "absent (driver not installed)" if lib is None else lib
    lines = [
        f"state {path}: shape {state['shape']}, host {state['host']}",
        f"kernel module {state['kernel_module_version']}, library {lib_text} ({library_path()}), "
        f"CUDA driver {state['cuda_driver_version']}",
    ]
    if lib is not None and lib != state["kernel_module_version"]:
        lines.append("NVML init fails: Driver/library version mismatch")
    for gpu in state["gpus"]:
        power, temp, ecc, rows = gpu["power"], gpu["temperature"], gpu["ecc"], gpu["remapped_rows"]
        links = gpu["nvlinks"]
        flags = [flag for flag, on in (("LOST", gpu["lost"]), ("REMOVED", not gpu["present"])) if on]
        lines.append(
            f"GPU {gpu['slot']} {gpu['pci']['bus']:02X}:00.0 {gpu['name']} {gpu['uuid']}"
            + (f" [{' '.join(flags)}]" if flags else "")
        )
        lines.append(
            f"    power {_watts(power['limit_mw'])} W (default {_watts(power['default_mw'])}, "
            f"range {_watts(power['min_mw'])}-{_watts(power['max_mw'])}, draw {_watts(power['draw_mw'])}); "
            f"temp {temp['gpu']} C (slowdown {temp['slowdown']}); "
            f"persistence {'on' if gpu['persistence_mode'] else 'off'}"
        )
        lines.append(
            f"    ECC {'on' if ecc['current'] else 'off'}: volatile corrected {ecc['volatile']['corrected']} "
            f"uncorrected {ecc['volatile']['uncorrected']}, "
            f"aggregate corrected {ecc['aggregate']['corrected']} "
            f"uncorrected {ecc['aggregate']['uncorrected']}; remapped rows correctable {rows['correctable']} "
            f"uncorrectable {rows['uncorrectable']} pending {rows['pending']} failure {rows['failure']}"
        )
        if gpu.get("recovery_action") is not None:
            lines.append(f"    recovery action {RECOVERY_ACTION_TEXT.get(gpu['recovery_action'], '?')}")
        down = [str(link["link"]) for link in links if not link["active"]]
        lines.append(
            f"    NVLinks {len(links) - len(down)}/{len(links)} up"
            + (f" (down: {','.join(down)})" if down else "")
            + f"; processes {len(gpu['processes'])}"
        )
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> str:
    path = state_path()
    state = read_state(path)
    return json.dumps(state, indent=2, sort_keys=True) if args.json else render(state, path)


def _mutate(describe: Callable[[dict[str, Any]], str]) -> str:
    path = state_path()
    try:
        with locked(path) as state:
            message = describe(state)
        _flush_kernel_log()  # after the state it describes is written
    finally:
        _pending_records.clear()
    return message


def cmd_ecc(args: argparse.Namespace) -> str:
    if args.count < 0:
        raise CtlError("COUNT must be >= 0")

    def change(state: dict[str, Any]) -> str:
        ecc = gpu_by_slot(state, args.gpu)["ecc"]
        kind = "uncorrected" if args.uncorrectable is not None else "corrected"
        # A new error counts in both; --aggregate records one from before the last driver reload.
        counters = ["aggregate"] if args.aggregate else ["volatile", "aggregate"]
        for counter in counters:
            ecc[counter][kind] += args.count
        return f"GPU {args.gpu}: +{args.count} {kind} ECC errors ({' and '.join(counters)})"

    return _mutate(change)


def cmd_remap(args: argparse.Namespace) -> str:
    def change(state: dict[str, Any]) -> str:
        rows = gpu_by_slot(state, args.gpu)["remapped_rows"]
        if rows is None:
            raise CtlError(f"GPU {args.gpu} does not remap rows")
        done = []
        if args.pending:
            rows["pending"] = 1
            done.append("remap pending")
        if args.failure:
            rows["failure"] = 1
            histogram = rows.get("histogram")
            if histogram and histogram["max"] > 0:
                histogram["max"] -= 1  # the bank that ran out of spare rows
                histogram["none"] += 1
            done.append("remap failure")
        if args.uncorrectable is not None:
            rows["uncorrectable"] = args.uncorrectable
            done.append(f"{args.uncorrectable} rows remapped for uncorrectable errors")
        if args.correctable is not None:
            rows["correctable"] = args.correctable
            done.append(f"{args.correctable} rows remapped for correctable errors")
        if args.clear:
            rows.update({"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0})
            if rows.get("histogram"):
                banks = sum(rows["histogram"].values())
                rows["histogram"] = {"max": banks, "high": 0, "partial": 0, "low": 0, "none": 0}
            done.append("cleared")
        return f"GPU {args.gpu}: " + ", ".join(done)

    return _mutate(change)


def cmd_link(args: argparse.Namespace) -> str:
    def change(state: dict[str, Any]) -> str:
        gpu = gpu_by_slot(state, args.gpu)
        links = {link["link"]: link for link in gpu["nvlinks"]}
        if args.link not in links:
            raise CtlError(f"GPU {args.gpu} has NVLinks 0-{len(links) - 1}, not {args.link}")
        link = links[args.link]
        link["active"] = args.up
        text = f"GPU {args.gpu} link {args.link} {'up' if args.up else 'down'}"
        # A bridge link has two ends: the partner GPU sees the same link state.
        if link.get("remote_type") == "gpu":
            peer = gpu_by_slot(state, link["remote_slot"])
            for peer_link in peer["nvlinks"]:
                if peer_link["link"] == link["remote_link"] and peer_link.get("remote_slot") == args.gpu:
                    peer_link["active"] = args.up
                    text += f" (and GPU {peer['slot']} link {peer_link['link']})"
        return text

    return _mutate(change)


def cmd_gpu(args: argparse.Namespace) -> str:
    def change(state: dict[str, Any]) -> str:
        gpu = gpu_by_slot(state, args.gpu)
        if args.lost:
            gpu["lost"] = True
            return f"GPU {args.gpu} is lost (NVML_ERROR_GPU_IS_LOST)"
        if args.remove:
            gpu["present"] = False
            return f"GPU {args.gpu} removed from the bus (NVML no longer enumerates it)"
        gpu["lost"] = False
        gpu["present"] = True
        return f"GPU {args.gpu} restored"

    return _mutate(change)


def cmd_power(args: argparse.Namespace) -> str:
    def change(state: dict[str, Any]) -> str:
        power = gpu_by_slot(state, args.gpu)["power"]
        mw = round(args.limit_w * 1000)
        if not power["min_mw"] <= mw <= power["max_mw"]:
            raise CtlError(
                f"GPU {args.gpu}: {args.limit_w:g} W is outside "
                f"{_watts(power['min_mw'])}-{_watts(power['max_mw'])} W"
            )
        power["limit_mw"] = mw
        power["enforced_mw"] = mw
        return f"GPU {args.gpu}: power limit {args.limit_w:g} W"

    return _mutate(change)


def cmd_temp(args: argparse.Namespace) -> str:
    if not 0 <= args.celsius <= 150:
        raise CtlError("--celsius must be between 0 and 150")

    def change(state: dict[str, Any]) -> str:
        gpu_by_slot(state, args.gpu)["temperature"]["gpu"] = args.celsius
        return f"GPU {args.gpu}: {args.celsius} C"

    return _mutate(change)


def cmd_kernel_version(args: argparse.Namespace) -> str:
    version = args.version.strip()
    if not version or any(c.isspace() for c in version):
        raise CtlError(f"invalid version {args.version!r}")
    # the driver now loaded reports its own branch's CUDA and NVML versions (a 580 module: CUDA 13.0)
    reports = driver_reports(version)

    def change(state: dict[str, Any]) -> str:
        state["kernel_module_version"] = version
        state.update(reports)
        lib = library_version()
        note = (
            ""
            if lib is None or lib == version
            else f" (library is {lib}: NVML init now fails with a mismatch)"
        )
        return f"loaded kernel module version {version}{note}"

    return _mutate(change)


HOLDER_DIR = "/run/fake-nvml/holders"  # tmpfs: gone at reboot, like the processes


def _spawn_holder(index: int, name: str) -> tuple[int, bool]:
    """A process that keeps /dev/nvidia<index> open, as a CUDA process holds its GPU's device node, so
    gpu_facts' device_processes (read from /proc/PID/fd) sees it. Its comm is `name` (exec'd through a
    symlink of that name to sleep). The device node is an empty file where the lab has none."""
    device = f"/dev/nvidia{index}"
    created = not os.path.exists(device)
    if created:
        with open(device, "a", encoding="utf-8"):
            pass
    os.makedirs(HOLDER_DIR, exist_ok=True)
    program = os.path.join(HOLDER_DIR, name[:15])
    if not os.path.islink(program):
        os.symlink("/bin/sleep", program)
    with open(device, encoding="utf-8") as held:
        proc = subprocess.Popen(
            [program, "infinity"],
            stdin=held,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid, created


def _stop_holder(proc: dict[str, Any]) -> None:
    if not proc.get("holder"):
        return
    device = proc.get("created_device")
    if device and os.path.isfile(device) and os.path.getsize(device) == 0:
        os.unlink(device)  # the empty stand-in it made; a real device node is never a regular file
    pid = int(proc["pid"])
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
            comm = f.read().strip()
    except OSError:
        return  # already gone
    if comm == str(proc.get("name", ""))[:15]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def _stop_all_holders(state: dict[str, Any]) -> None:
    for gpu in state.get("gpus", []):
        for proc in gpu.get("processes", []):
            _stop_holder(proc)


def cmd_process(args: argparse.Namespace) -> str:
    def change(state: dict[str, Any]) -> str:
        gpu = gpu_by_slot(state, args.gpu)
        procs = gpu["processes"]
        if args.add:
            if args.hold:
                if args.pid is not None:
                    raise CtlError("--hold starts its own process: leave out --pid")
                args.pid, created = _spawn_holder(args.gpu, args.name)
            if args.pid is None:
                raise CtlError("--add needs --pid (or --hold)")
            if args.pid <= 0:
                raise CtlError("--pid must be a positive process id")
            procs[:] = [p for p in procs if p["pid"] != args.pid]
            entry = {"pid": args.pid, "name": args.name, "used_memory": args.used_mib * MIB}
            if args.hold:
                entry["holder"] = True
                if created:
                    entry["created_device"] = f"/dev/nvidia{args.gpu}"
            procs.append(entry)
            held = f", holding /dev/nvidia{args.gpu} open" if args.hold else ""
            return f"GPU {args.gpu}: process {args.pid} ({args.name}) using {args.used_mib} MiB{held}"
        before = len(procs)
        gone = [p for p in procs if args.pid is None or p["pid"] == args.pid]
        for proc in gone:
            _stop_holder(proc)
        procs[:] = [p for p in procs if p not in gone]
        return f"GPU {args.gpu}: cleared {before - len(procs)} process(es)"

    return _mutate(change)


# ---------------------------------------------------------------------------------------------------
# Xids: the kernel-log record the driver prints, the NVML event it raises, what the fault does to the GPU
# ---------------------------------------------------------------------------------------------------
# The text after "pid=..., name=..., " that the 535 driver prints for the Xids the tests inject (from
# kernel logs of real A100 nodes; any other Xid gets its catalog mnemonic).
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1e_6c000000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    45: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
    "subpartition 0.",
    63: "Row Remapper: New row (0x0000000000a4b5c0) marked for remapping, reset gpu to activate.",
    64: "Row Remapper Error: (0x0000000000a4b5c0) - All reserved rows for bank are remapped",
    74: "NVLink: fatal error detected on link 0(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
}
# Xids that hardware raises with no process behind them: pid and name are unknown in the record
HARDWARE_XIDS = {48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154}
# The recovery action an R565+ driver sets for an Xid (nvmlDeviceGpuRecoveryAction_t), where it reports one
XID_RECOVERY_ACTION = {48: 1, 64: 1, 74: 4, 79: 2, 94: 0, 95: 1}
RECOVERY_ACTION_NAMES = {
    "none": 0,
    "reset": 1,
    "reboot": 2,
    "drain_p2p": 3,
    "drain_and_reset": 4,
}
# As Xid 154's message names them (the catalog: "None", "Drain P2P", "Drain and Reset", ...)
RECOVERY_ACTION_TEXT = {
    0: "None",
    1: "GPU Reset Required",
    2: "Node Reboot Required",
    3: "Drain P2P",
    4: "Drain and Reset",
}
EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
EVENT_DOUBLE_BIT_ECC = 0x2
EVENTS_KEPT = 256


_pending_records: list[str] = []  # records of the change under way, written once its state is


def _kernel_log(
    state: dict[str, Any], gpu: dict[str, Any], xid: int, who: tuple[str, str] | None, text: str
) -> None:
    """The driver's record for the lab's kernel log, in /dev/kmsg's format (``who``: pid and name, which the
    driver prints for the Xids of a channel, not for Xid 154); written after the state it describes, as
    the driver counts an error before it logs it."""
    state["kmsg_seq"] = int(state.get("kmsg_seq", 0)) + 1
    usec = int(time.monotonic() * 1_000_000)  # /dev/kmsg's clock: microseconds since boot
    pci = gpu["pci"]
    bus = f"{pci['domain']:04x}:{pci['bus']:02x}:{pci['device']:02x}"
    process = f"pid={who[0]}, name={who[1]}, " if who else ""
    _pending_records.append(f"4,{state['kmsg_seq']},{usec},-;NVRM: Xid (PCI:{bus}): {xid}, {process}{text}\n")


def _flush_kernel_log() -> None:
    if not _pending_records:
        return
    path = kmsg_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, "".join(_pending_records).encode())
    finally:
        os.close(fd)
        _pending_records.clear()


def _event(state: dict[str, Any], gpu: dict[str, Any], event_type: int, data: int) -> None:
    state["event_seq"] = int(state.get("event_seq", 0)) + 1
    events = state.setdefault("events", [])
    events.append({"seq": state["event_seq"], "slot": gpu["slot"], "type": event_type, "data": data})
    del events[:-EVENTS_KEPT]


def _set_recovery_action(state: dict[str, Any], gpu: dict[str, Any], value: int | None) -> None:
    """A driver that reports the recovery action logs Xid 154 when it changes."""
    before = gpu.get("recovery_action")
    gpu["recovery_action"] = value
    if value is None or (before if before is not None else 0) == value:
        return
    old = before if before is not None else 0
    text = (
        f"GPU recovery action changed from 0x{old:x} ({RECOVERY_ACTION_TEXT[old]}) to 0x{value:x} "
        f"({RECOVERY_ACTION_TEXT[value]})"
    )
    _kernel_log(state, gpu, 154, None, text)
    _event(state, gpu, EVENT_XID, 154)


def _xid_effect(state: dict[str, Any], gpu: dict[str, Any], xid: int) -> None:
    ecc, rows = gpu["ecc"], gpu["remapped_rows"]
    if xid in (48, 94, 95, 171):  # an uncorrectable error: counted since the driver loaded and for life
        for counter in ("volatile", "aggregate"):
            ecc[counter]["uncorrected"] += 1
        _event(state, gpu, EVENT_DOUBLE_BIT_ECC, 0)
    if xid in (63, 94, 95) and rows is not None:  # on A100 the failing row is marked for remapping
        rows["pending"] = 1
    if xid == 64 and rows is not None:
        rows["failure"] = 1
        histogram = rows.get("histogram")
        if histogram and histogram["max"] > 0:
            histogram["max"] -= 1
            histogram["none"] += 1
    if xid == 79:
        gpu["lost"] = True
    if xid == 74:  # the first active link goes down, at both ends of a bridge
        for link in gpu["nvlinks"]:
            if link["active"]:
                link["active"] = False
                if link.get("remote_type") == "gpu":
                    for peer_link in gpu_by_slot(state, link["remote_slot"])["nvlinks"]:
                        if peer_link["link"] == link["remote_link"]:
                            peer_link["active"] = False
                break
    if gpu.get("recovery_action") is not None and xid in XID_RECOVERY_ACTION:
        _set_recovery_action(state, gpu, max(gpu["recovery_action"], XID_RECOVERY_ACTION[xid]))


def cmd_xid(args: argparse.Namespace) -> str:
    if not all(1 <= xid <= 1023 for xid in args.xid):
        raise CtlError("--xid must be 1..1023")

    def change(state: dict[str, Any]) -> str:
        gpu = gpu_by_slot(state, args.gpu)
        procs = gpu.get("processes") or []
        for xid in args.xid:  # several: one burst, logged together as the driver's interrupt handler does
            if args.pid is not None:
                pid, name = str(args.pid), args.name or "python3"
            elif xid in HARDWARE_XIDS or not procs:
                pid, name = "'<unknown>'", "<unknown>"
            else:
                pid, name = str(procs[0]["pid"]), str(procs[0].get("name", "python3"))
            text = args.text or XID_TEXT.get(xid, f"Xid {xid}")
            _kernel_log(state, gpu, xid, (pid, name), text)
            _event(state, gpu, EVENT_XID, xid)
            if not args.log_only:
                _xid_effect(state, gpu, xid)
        shown = ", ".join(map(str, args.xid))
        return f"GPU {args.gpu}: Xid {shown} logged to {kmsg_path()}" + (
            "" if args.log_only else " (and the fault's effect on the GPU)"
        )

    return _mutate(change)


def cmd_recovery_action(args: argparse.Namespace) -> str:
    def change(state: dict[str, Any]) -> str:
        gpu = gpu_by_slot(state, args.gpu)
        if args.action == "unsupported":
            gpu["recovery_action"] = None
            return f"GPU {args.gpu}: the driver does not report a recovery action (as 535)"
        _set_recovery_action(state, gpu, RECOVERY_ACTION_NAMES[args.action])
        return f"GPU {args.gpu}: recovery action {args.action} (as an R565+ driver reports it)"

    return _mutate(change)


def cmd_gpu_reset(args: argparse.Namespace) -> str:
    """What a GPU reset (nvidia-smi -r) does to the GPU: volatile ECC counters back to 0, a pending row remap
    applied, links retrained, recovery action none. The failure flag and the lifetime counters stay."""

    def change(state: dict[str, Any]) -> str:
        if args.uuid:
            found = [g for g in state["gpus"] if g["uuid"] == args.uuid]
            if not found:
                raise CtlError(f"no GPU {args.uuid}")
            gpu = found[0]
        else:
            gpu = gpu_by_slot(state, args.gpu)
        if gpu["lost"] or not gpu.get("present", True):
            raise CtlError(f"GPU {gpu['slot']} is off the bus: a GPU reset cannot reach it, reboot the node")
        gpu["ecc"]["volatile"] = {"corrected": 0, "uncorrected": 0}
        rows = gpu["remapped_rows"]
        if rows is not None and rows["pending"]:
            rows["pending"] = 0
            rows["uncorrectable"] += 1
        if gpu.get("retired_pages"):
            gpu["retired_pages"]["pending"] = 0
        for link in gpu["nvlinks"]:
            link["active"] = True
            if link.get("remote_type") == "gpu":
                for peer_link in gpu_by_slot(state, link["remote_slot"])["nvlinks"]:
                    if peer_link["link"] == link["remote_link"]:
                        peer_link["active"] = True
        if gpu.get("recovery_action") is not None:
            gpu["recovery_action"] = 0
        return f"GPU {gpu['slot']} ({gpu['uuid']}) reset"

    return _mutate(change)


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------
def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fake-nvml",
        description="Create, show and break the lab's simulated NVIDIA GPUs (state file: "
        f"${STATE_ENV}, default {DEFAULT_STATE}). --gpu N is the GPU's index at init.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("init", help="write the state of a freshly booted machine")
    p.add_argument("--shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--host", help="host name the UUIDs derive from (default: this host's name)")
    p.add_argument(
        "--kernel-version",
        default=DEFAULT_DRIVER_VERSION,
        help="loaded kernel module version (a branch of CUDA_BY_BRANCH: its CUDA and NVML versions follow)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing state")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("show", help="print the GPUs and their faults")
    p.add_argument("--json", action="store_true", help="print the raw state")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("load", help="replace the state with one saved by show --json")
    p.add_argument("file", help="saved state file, or - for standard input")
    p.set_defaults(func=cmd_load)

    p = sub.add_parser("reset", help="clear every fault and setting (a reboot of the node)")
    p.set_defaults(func=cmd_reset)

    p = sub.add_parser("ecc", help="add ECC errors")
    p.add_argument("--gpu", type=int, required=True)
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--uncorrectable", type=_non_negative, metavar="COUNT")
    kind.add_argument("--corrected", type=_non_negative, metavar="COUNT")
    p.add_argument("--aggregate", action="store_true", help="only the lifetime counter (an old error)")
    p.set_defaults(func=cmd_ecc)

    p = sub.add_parser("remap", help="row remapping faults")
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--pending", action="store_true", help="a remap waits for a GPU reset")
    p.add_argument("--failure", action="store_true", help="a remap failed: the GPU needs replacing")
    p.add_argument(
        "--uncorrectable", type=_non_negative, metavar="K", help="rows remapped for uncorrectable errors"
    )
    p.add_argument(
        "--correctable", type=_non_negative, metavar="K", help="rows remapped for correctable errors"
    )
    p.add_argument("--clear", action="store_true", help="zero every remap counter and flag")
    p.set_defaults(func=cmd_remap)

    p = sub.add_parser("link", help="take an NVLink down or up")
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--link", type=int, required=True)
    state = p.add_mutually_exclusive_group(required=True)
    state.add_argument("--down", action="store_false", dest="up")
    state.add_argument("--up", action="store_true", dest="up")
    p.set_defaults(func=cmd_link)

    p = sub.add_parser("gpu", help="lose, remove or restore a GPU")
    p.add_argument("--gpu", type=int, required=True)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--lost", action="store_true", help="NVML_ERROR_GPU_IS_LOST (fell off the bus, Xid 79)")
    what.add_argument("--remove", action="store_true", help="no longer enumerated (GPU count drops)")
    what.add_argument("--restore", action="store_true")
    p.set_defaults(func=cmd_gpu)

    p = sub.add_parser("power", help="set a power limit behind Ansible's back (drift)")
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--limit-w", type=float, required=True)
    p.set_defaults(func=cmd_power)

    p = sub.add_parser("temp", help="set the GPU temperature")
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--celsius", type=int, required=True)
    p.set_defaults(func=cmd_temp)

    p = sub.add_parser(
        "kernel-version",
        help="set the loaded kernel module version (a driver/library mismatch, or the driver modprobe loads);"
        " the CUDA and NVML versions follow its branch",
    )
    p.add_argument("version")
    p.set_defaults(func=cmd_kernel_version)

    p = sub.add_parser("process", help="add or clear a compute process")
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--pid", type=int)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true")
    action.add_argument("--clear", action="store_true", help="remove --pid, or every process without it")
    p.add_argument("--name", default="python3", help="process name (with --add)")
    p.add_argument(
        "--hold",
        action="store_true",
        help="with --add: start a real process (comm --name) holding /dev/nvidia<GPU> open, as gpu_facts'"
        " device_processes and the driver role's workload check see a CUDA process; --clear/reset stop it",
    )
    p.add_argument("--used-mib", type=_non_negative, default=1024, help="GPU memory it uses (with --add)")
    p.set_defaults(func=cmd_process)

    p = sub.add_parser(
        "xid",
        help="the driver reports an Xid: its kernel-log record (/dev/kmsg format, in $FAKE_NVML_KMSG), the"
        " NVML event, and what the fault does to the GPU (94/95/48: an uncorrectable error, 63: a row remap"
        " pending, 64: a remap failure, 79: off the bus, 74: an NVLink down; others: nothing)",
    )
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument(
        "--xid", type=int, required=True, action="append", help="an Xid; repeated: one burst (48, 63, 94)"
    )
    p.add_argument("--pid", type=int, help="process the record names (default: the GPU's first, or unknown)")
    p.add_argument("--name", help="its name (with --pid)")
    p.add_argument("--text", help="the message after pid= and name= (default: the driver's for that Xid)")
    p.add_argument("--log-only", action="store_true", help="the record and the event, the GPU left as it is")
    p.set_defaults(func=cmd_xid)

    p = sub.add_parser(
        "recovery-action",
        help="the recovery action an R565+ driver reports (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, Xid 154"
        " logged when it changes); unsupported: a 535 driver, which does not report it (the default)",
    )
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--action", required=True, choices=[*RECOVERY_ACTION_NAMES, "unsupported"])
    p.set_defaults(func=cmd_recovery_action)

    p = sub.add_parser("gpu-reset", help="what a GPU reset (nvidia-smi -r) does to one GPU")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--gpu", type=int)
    target.add_argument("--uuid")
    p.set_defaults(func=cmd_gpu_reset)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "ecc":
        args.count = args.uncorrectable if args.uncorrectable is not None else args.corrected
    if args.command == "remap" and not (
        args.pending
        or args.failure
        or args.clear
        or args.uncorrectable is not None
        or args.correctable is not None
    ):
        parser.error(
            "remap needs at least one of --pending, --failure, --uncorrectable K, --correctable K, --clear"
        )
    try:
        print(args.func(args))
    except CtlError as exc:
        print(f"fake-nvml: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
