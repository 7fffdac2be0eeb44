"""The GPU clients' processes of the kubelet stand-in (docs/lab.md, "Lab Kubernetes").

On a real GPU node the device plugin and dcgm-exporter keep the GPUs open for as long as their pods run
(NVML initialised for good: /dev/nvidiactl and the GPUs' device nodes), so unloading the nvidia module
fails under them and a driver role that does not stop them cannot reload or reboot. The stand-in runs no
containers; for such a pod it runs one process that holds the control device open, named like the real
binary (its comm), in the pod's cgroup as the kubelet's systemd cgroup driver names it
(kubepods[-<qos>]-pod<uid with _>.slice / cri-containerd-<id>.scope, through `systemd-run --scope` where
systemd runs), so gpu_facts sees it and tells whose it is. The process ends when the pod leaves the node
(deleted, or its DaemonSet no longer selects the node). Its state is kept in HOLDER_DIR (tmpfs), so a
restarted kubelet finds the processes it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from typing import Any

# image substring -> the real binary's name (its comm keeps 15 characters)
GPU_CLIENT_IMAGES = {"k8s-device-plugin": "nvidia-device-plugin", "dcgm-exporter": "dcgm-exporter"}
CONTROL_DEVICE = "/dev/nvidiactl"
HOLDER_DIR = "/run/kube-standin/gpu-clients"


def client_binary(pod: dict[str, Any]) -> str | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for needle, binary in GPU_CLIENT_IMAGES.items():
            if needle in container.get("image", ""):
                return binary
    return None


def pod_slice(uid: str, qos_class: str | None) -> str:
    """The pod's slice as the kubelet's systemd cgroup driver names it."""
    qos = (qos_class or "BestEffort").lower()
    middle = "" if qos == "guaranteed" else f"-{qos}"
    return f"kubepods{middle}-pod{uid.replace('-', '_')}.slice"


class GpuClientProcesses:
    """One holder process per GPU client pod running on this node."""

    def __init__(
        self, holder_dir: str = HOLDER_DIR, device: str = CONTROL_DEVICE, use_systemd: bool | None = None
    ) -> None:
        self.holder_dir = holder_dir
        self.device = device
        self.use_systemd = os.path.isdir("/run/systemd/system") if use_systemd is None else use_systemd

    def _record_path(self, uid: str) -> str:
        return os.path.join(self.holder_dir, f"{uid}.json")

    def running(self) -> dict[str, dict[str, Any]]:
        """uid -> {pid, comm} of the holders still alive."""
        found = {}
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.holder_dir):
                if not name.endswith(".json"):
                    continue
                try:
                    with open(os.path.join(self.holder_dir, name), encoding="utf-8") as f:
                        record = json.load(f)
                except (OSError, ValueError):
                    continue
                if _alive(record):
                    found[name[: -len(".json")]] = record
                else:  # ended (a reboot empties the directory anyway)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.holder_dir, name))
        return found

    def sync(self, pods: Iterable[dict[str, Any]], ready: Any) -> None:
        """Holders for exactly the GPU client pods here that ``ready(pod)`` says run."""
        wanted = {}
        for pod in pods:
            binary = client_binary(pod)
            if binary and ready(pod):
                wanted[str(pod["metadata"].get("uid"))] = (pod, binary)
        alive = self.running()
        for uid in set(alive) - set(wanted):
            self.stop(uid, alive[uid])
        for uid, (pod, binary) in wanted.items():
            if uid not in alive:
                self.start(uid, binary, (pod.get("status") or {}).get("qosClass"))

    def start(self, uid: str, binary: str, qos_class: str | None) -> int:
        os.makedirs(os.path.join(self.holder_dir, "bin"), exist_ok=True)
        program = os.path.join(self.holder_dir, "bin", binary[:15])
        if not os.path.islink(program):
            os.symlink("/bin/sleep", program)
        if not os.path.exists(self.device):
            # the lab has no device nodes: an empty file stands in, as fake-nvml's holders use
            with open(self.device, "a", encoding="utf-8"):
                pass
        command = [program, "infinity"]
        if self.use_systemd:
            scope = f"cri-containerd-{uid.replace('-', '')}.scope"
            command = ["systemd-run", "--scope", "--quiet", f"--slice={pod_slice(uid, qos_class)}",
                       f"--unit={scope}", *command]  # fmt: skip
        with open(self.device, encoding="utf-8") as held:
            proc = subprocess.Popen(
                command,
                stdin=held,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        # systemd-run --scope execs the command itself: the pid is the holder's
        record = {"pid": proc.pid, "comm": binary[:15]}
        # Popen may return before the child has exec'd (its comm is still the kubelet's): wait for it
        deadline = time.monotonic() + 5
        while not _alive(record) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        with open(self._record_path(uid), "w", encoding="utf-8") as f:
            json.dump(record, f)
        return proc.pid

    def stop(self, uid: str, record: dict[str, Any]) -> None:
        pid = int(record["pid"])
        if _alive(record):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            # our child unless the kubelet restarted since (then init reaps it)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._record_path(uid))


def _alive(record: dict[str, Any]) -> bool:
    """The recorded process still runs under its name (a pid reused by another process, or one that exited
    and waits to be reaped, does not count)."""
    try:
        pid = int(record["pid"])
        with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
            comm = f.read().strip()
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, KeyError, IndexError):
        return False
    return comm == str(record.get("comm")) and state != "Z"
