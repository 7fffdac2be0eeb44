#!/usr/bin/python3
"""lab-kube-fault: real Kubernetes faults on a lab node (scripts/lab-fault NODE kube ARGS..., docs/lab.md).

Installed on every node by `make lab-up` (tests/lab/labctl.py) as /usr/local/sbin/lab-kube-fault. Each fault
is what breaks on a server, done to the real components; nothing is simulated, so what the product sees comes
from the real kubelet, API server and controllers:

    not-ready                      the kubelet stopped (systemctl stop): the node controller marks the Node
                                   Ready=Unknown after its grace period (50 s by default in 1.36)
    device-plugin-unregistered     the device plugin hangs (SIGSTOP) and the kubelet restarts: the kubelet's
                                   device manager starts empty, the plugin never registers again, the
                                   Node's nvidia.com/gpu drops to 0 while the plugin's pod stays Running (a
                                   new plugin pod registers again)
    crashloop --pod NAME [--namespace NS]
                                   the pod's containers are killed (SIGKILL) each time they start: the real
                                   kubelet restarts them with its back-off, CrashLoopBackOff
    static-pod-broken --component kube-scheduler
                                   the static pod's manifest replaced with one whose image does not exist
                                   (kept aside): the kubelet recreates the pod, which cannot pull its image
    clear [FAULT]                  undo one fault, or every fault
    show                           the faults in place

Runs as root on the node's python3 (3.10), standard library only; crictl talks to containerd.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

STATE = Path("/run/lab-kube-fault")
MANIFESTS = Path("/etc/kubernetes/manifests")
CRASHLOOP_UNIT = "lab-kube-fault-crashloop"


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        said = result.stderr.strip() or result.stdout.strip()
        raise SystemExit(f"lab-kube-fault: {' '.join(argv)}: {said}")
    return result


def record(name: str, detail: str) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / name).write_text(detail + "\n")


def recorded() -> dict[str, str]:
    if not STATE.is_dir():
        return {}
    return {path.name: path.read_text().strip() for path in sorted(STATE.iterdir()) if path.is_file()}


def not_ready(_: argparse.Namespace) -> str:
    run("systemctl", "stop", "kubelet")
    record("not-ready", "kubelet stopped")
    return "kubelet stopped: the Node goes Ready=Unknown after the node controller's grace period"


def clear_not_ready() -> None:
    run("systemctl", "start", "kubelet")


def plugin_pids() -> list[str]:
    """Host pids of the node's NVIDIA device plugin containers (their main process)."""
    containers = run("crictl", "ps", "-q", "--name", "nvidia-device-plugin").stdout.split()
    pids = []
    for container in containers:
        info = json.loads(run("crictl", "inspect", container).stdout)
        pids.append(str(info["info"]["pid"]))
    return pids


def device_plugin_unregistered(_: argparse.Namespace) -> str:
    # The failure a node meets when its kubelet restarts while the device plugin hangs: the kubelet's device
    # manager starts empty and waits for plugins to register again, the hung plugin never does. Done for real:
    # the plugin's process frozen (SIGSTOP; its pod stays Running), then the kubelet restarted.
    pids = plugin_pids()
    if not pids:
        raise SystemExit("lab-kube-fault: no NVIDIA device plugin container runs on this node")
    run("kill", "-STOP", *pids)
    run("systemctl", "restart", "kubelet")
    record("device-plugin-unregistered", " ".join(pids))
    return f"device plugin (pid {', '.join(pids)}) frozen and the kubelet restarted: it never registers again"


def clear_device_plugin_unregistered() -> None:
    # the frozen plugin resumes; as on a server, only a new plugin pod registers for sure
    # (playbooks/remediate/restart-device-plugin.yml)
    for pid in recorded().get("device-plugin-unregistered", "").split():
        run("kill", "-CONT", pid, check=False)


def pod_sandboxes(pod: str, namespace: str) -> list[str]:
    listed = run("crictl", "pods", "--name", f"^{pod}$", "--namespace", namespace, "-q")
    return listed.stdout.split()


def crashloop(args: argparse.Namespace) -> str:
    if not pod_sandboxes(args.pod, args.namespace):
        raise SystemExit(f"lab-kube-fault: no pod {args.namespace}/{args.pod} runs on this node")
    # a transient unit keeps killing the pod's running containers; the kubelet's back-off does the rest
    loop = (
        f"while true; do for s in $(crictl pods --name '^{args.pod}$' --namespace '{args.namespace}' -q); do "
        "for c in $(crictl ps -q --pod $s --state running); do crictl stop --timeout 0 $c >/dev/null 2>&1; "
        "done; done; sleep 1; done"
    )
    run("systemctl", "stop", CRASHLOOP_UNIT, check=False)
    run("systemctl", "reset-failed", CRASHLOOP_UNIT, check=False)
    run("systemd-run", "--unit", CRASHLOOP_UNIT, "--collect", "sh", "-c", loop)
    record("crashloop", f"{args.namespace}/{args.pod}")
    return f"{args.namespace}/{args.pod}: its containers are killed whenever they run (CrashLoopBackOff)"


def clear_crashloop() -> None:
    run("systemctl", "stop", CRASHLOOP_UNIT, check=False)


def static_pod_broken(args: argparse.Namespace) -> str:
    manifest = MANIFESTS / f"{args.component}.yaml"
    kept = STATE / f"{args.component}.yaml"
    if not manifest.is_file():
        raise SystemExit(f"lab-kube-fault: no static pod manifest {manifest}")
    STATE.mkdir(parents=True, exist_ok=True)
    if not kept.is_file():
        shutil.copy2(manifest, kept)
    text = manifest.read_text()
    broken = text.replace("image: registry.k8s.io/", "image: registry.k8s.io/lab-broken-", 1)
    if broken == text:
        raise SystemExit(f"lab-kube-fault: {manifest} names no registry.k8s.io image")
    manifest.write_text(broken)
    record("static-pod-broken", args.component)
    return f"{manifest}: its image now does not exist (the original kept in {kept})"


def clear_static_pod_broken() -> None:
    for kept in STATE.glob("*.yaml"):
        shutil.copy2(kept, MANIFESTS / kept.name)
        kept.unlink()


CLEAR = {
    "not-ready": clear_not_ready,
    "device-plugin-unregistered": clear_device_plugin_unregistered,
    "crashloop": clear_crashloop,
    "static-pod-broken": clear_static_pod_broken,
}


def clear(args: argparse.Namespace) -> str:
    names = [args.fault] if args.fault else list(recorded())
    for name in names:
        CLEAR[name]()
        (STATE / name).unlink(missing_ok=True)
    return "cleared: " + (", ".join(names) if names else "nothing was in place")


def show(_: argparse.Namespace) -> str:
    return json.dumps(recorded(), indent=2)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lab-kube-fault", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("not-ready").set_defaults(func=not_ready)
    sub.add_parser("device-plugin-unregistered").set_defaults(func=device_plugin_unregistered)
    loop = sub.add_parser("crashloop")
    loop.add_argument("--pod", required=True)
    loop.add_argument("--namespace", default="default")
    loop.set_defaults(func=crashloop)
    broken = sub.add_parser("static-pod-broken")
    broken.add_argument(
        "--component",
        required=True,
        choices=["kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"],
    )
    broken.set_defaults(func=static_pod_broken)
    undo = sub.add_parser("clear")
    undo.add_argument("fault", nargs="?", choices=sorted(CLEAR))
    undo.set_defaults(func=clear)
    sub.add_parser("show").set_defaults(func=show)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("lab-kube-fault: run as root")
    print(args.func(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
