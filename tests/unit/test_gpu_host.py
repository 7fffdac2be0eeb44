"""module_utils.gpu_host: GPU users and NVSwitches from fake /proc and /sys trees (no NVML involved)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
from ansible.module_utils import gpu_host


def add_process(
    proc: Path,
    pid: int,
    comm: str | None,
    fds: dict[int, str],
    uids: str = "0\t0\t0\t0",
    cgroup: str | None = None,
) -> Path:
    directory = proc / str(pid)
    (directory / "fd").mkdir(parents=True)
    if comm is not None:
        (directory / "comm").write_text(comm + "\n")
    if cgroup is not None:
        (directory / "cgroup").write_text(cgroup)
    (directory / "status").write_text(f"Name:\t{comm}\nUmask:\t0022\nUid:\t{uids}\nGid:\t0\t0\t0\t0\n")
    for fd, target in fds.items():
        os.symlink(target, directory / "fd" / str(fd))
    return directory


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "self").mkdir()  # non-numeric entries are not processes
    (root / "meminfo").write_text("MemTotal: 1 kB\n")
    return root


def test_processes_holding_gpu_devices(proc: Path) -> None:
    add_process(
        proc, 4242, "python3", {0: "/dev/pts/0", 5: "/dev/nvidiactl", 6: "/dev/nvidia0", 7: "/dev/nvidia0"}
    )
    add_process(proc, 17, "nvidia-persiste", {3: "/dev/nvidia-caps/nvidia-cap1"})
    add_process(proc, 900, "nv-fabricmanage", {3: "/dev/nvidia-nvswitch0"}, uids="0\t0\t0\t0")
    add_process(proc, 31, "bash", {0: "/dev/pts/0", 1: "pipe:[1234]", 2: "/dev/null"})
    add_process(proc, 1000, "vllm", {9: "/dev/nvidia-uvm"}, uids="1000\t4000123\t4000123\t4000123")
    result = gpu_host.device_processes(str(proc))
    assert [p["pid"] for p in result] == [17, 900, 1000, 4242]  # numeric order, bash left out
    by_pid = {p["pid"]: p for p in result}
    assert by_pid[4242] == {
        "pid": 4242,
        "name": "python3",
        "user": "root",
        "devices": ["/dev/nvidia0", "/dev/nvidiactl"],
        "driver_daemon": False,
        "unit": None,
        "pod_uid": None,
    }
    assert by_pid[17]["driver_daemon"] and by_pid[900]["driver_daemon"]
    assert not by_pid[1000]["driver_daemon"]
    # the effective uid, as ps shows it; a uid without a name comes back as the number
    assert by_pid[1000]["user"] == "4000123"


UID = "2b7f3c1e-5d2a-4c7b-9f0e-1a2b3c4d5e6f"
SYSTEMD_UID = UID.replace("-", "_")  # the systemd cgroup driver's slice names carry the uid with underscores


@pytest.mark.parametrize(
    ("cgroup", "unit", "pod_uid"),
    [
        # cgroup v2 (Ubuntu 22.04): a systemd service, an ssh session, the kubelet's systemd driver
        ("0::/system.slice/gpu-health-agent.service\n", "gpu-health-agent.service", None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", "session-3.scope", None),
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-0a1b2c.scope\n",
            None,
            UID,
        ),
        (f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-0a1b2c.scope\n", None, UID),
        # cgroup v1: the name=systemd line says the unit; the kubelet's cgroupfs driver names pod<uid>
        (
            "12:memory:/system.slice/gpu-health-agent.service\n"
            "1:name=systemd:/system.slice/gpu-health-agent.service\n",
            "gpu-health-agent.service",
            None,
        ),
        (
            f"5:cpu,cpuacct:/kubepods/burstable/pod{UID}/0a1b2c\n1:name=systemd:/kubepods/burstable/pod{UID}/0a1b2c\n",
            None,
            UID,
        ),
        # a node in a container (the lab: the container's own cgroup first), hybrid v1/v2
        (
            "1:name=systemd:/machine.slice/libpod-77.scope/system.slice/gpu-health-agent.service\n0::/\n",
            "gpu-health-agent.service",
            None,
        ),
        ("0::/\n", None, None),
        ("", None, None),
    ],
)
def test_the_unit_or_pod_a_process_runs_in(
    proc: Path, cgroup: str, unit: str | None, pod_uid: str | None
) -> None:
    """From /proc/PID/cgroup: the systemd unit (service or scope) or the Kubernetes pod the process runs in,
    so driver work can tell the cluster's own GPU clients from a workload and name either."""
    add_process(proc, 42, "x", {3: "/dev/nvidiactl"}, cgroup=cgroup)
    (found,) = gpu_host.device_processes(str(proc))
    assert (found["unit"], found["pod_uid"]) == (unit, pod_uid)


def test_no_cgroup_file_names_neither(proc: Path) -> None:
    add_process(proc, 43, "x", {3: "/dev/nvidiactl"})
    (found,) = gpu_host.device_processes(str(proc))
    assert (found["unit"], found["pod_uid"]) == (None, None)


def test_effective_user_is_named(proc: Path) -> None:
    me = pwd.getpwuid(os.getuid())
    add_process(proc, 5, "x", {3: "/dev/nvidia1"}, uids=f"0\t{me.pw_uid}\t0\t0")
    assert gpu_host.device_processes(str(proc))[0]["user"] == me.pw_name


def test_processes_gone_or_unreadable_are_skipped(proc: Path) -> None:
    add_process(proc, 7, None, {3: "/dev/nvidia0"})  # exited between the fd scan and reading comm
    unreadable = proc / "8"
    unreadable.mkdir()
    (unreadable / "fd").write_text("")  # listdir fails like EACCES on another user's fds
    (unreadable / "comm").write_text("secret\n")
    add_process(proc, 9, "kept", {3: "/dev/nvidia0"})
    assert [p["pid"] for p in gpu_host.device_processes(str(proc))] == [9]


def test_excluded_pids_and_missing_proc(proc: Path, tmp_path: Path) -> None:
    add_process(proc, 11, "me", {3: "/dev/nvidiactl"})
    assert gpu_host.device_processes(str(proc), exclude_pids={11}) == []
    assert gpu_host.device_processes(str(tmp_path / "nowhere")) == []


def add_pci(sys_devices: Path, address: str, vendor: str | None, device_class: str | None) -> None:
    directory = sys_devices / address
    directory.mkdir(parents=True)
    if vendor is not None:
        (directory / "vendor").write_text(vendor + "\n")
    if device_class is not None:
        (directory / "class").write_text(device_class + "\n")


def test_nvswitches_on_the_pci_bus(tmp_path: Path) -> None:
    devices = tmp_path / "sys" / "bus" / "pci" / "devices"
    add_pci(devices, "0000:07:00.0", "0x10de", "0x068000")  # NVSwitch (links down: the bus shows it anyway)
    add_pci(devices, "0000:06:00.0", "0x10de", "0x068000")
    add_pci(devices, "0000:17:00.0", "0x10de", "0x030200")  # A100: a 3D controller
    add_pci(devices, "0000:00:1f.0", "0x8086", "0x068000")  # someone else's "other bridge"
    add_pci(devices, "0000:31:00.0", "0x10de", "0x060400")  # NVIDIA PCIe bridge, not an NVSwitch
    add_pci(devices, "0000:32:00.0", "0x10de", None)  # class unreadable
    assert gpu_host.nvswitch_pci_devices(str(devices)) == ["0000:06:00.0", "0000:07:00.0"]


def test_no_nvswitches(tmp_path: Path) -> None:
    devices = tmp_path / "devices"
    add_pci(devices, "0000:17:00.0", "0x10de", "0x030200")
    assert gpu_host.nvswitch_pci_devices(str(devices)) == []
    assert gpu_host.nvswitch_pci_devices(str(tmp_path / "no-sysfs")) == []
