"""kubelet stand-in for the lab: ``python3 -m kube_standin.kubelet`` (installed as /usr/bin/kubelet).

Started by the ``kubelet`` package's systemd unit with kubeadm's drop-in flags. Like KWOK it runs no
containers; it does what the rest of the cluster observes of a kubelet:

* registers its Node (labels kubernetes.io/hostname, os, arch; capacity cpu, memory, pods, ephemeral
  storage from the host; InternalIP = the node's address) and keeps it Ready: node status every
  ``nodeStatusUpdateFrequency`` (10 s) and a Lease in kube-node-lease renewed every 10 s;
* marks the Pods bound to it Running and Ready with container statuses (restart counts), and finishes the
  deletion of Pods marked for deletion; mirror Pods for the static Pod manifests;
* ``nvidia.com/gpu``: capacity/allocatable = the GPUs present and not lost in the node's fake NVML state
  (/var/lib/fake-nvml/state.json, read as the fake pynvml reads it), only while a device-plugin Pod (an
  image containing ``k8s-device-plugin``) runs Ready on this node, as a real kubelet learns of GPUs only
  from a registered device plugin;
* runs the kube-proxy stand-in (kubeproxy.py) while a kube-proxy Pod runs on this node;
* keeps, for each device-plugin or dcgm-exporter Pod running Ready here, a process named like the real
  binary holding /dev/nvidiactl open in the Pod's cgroup (gpuclients.py), as those keep the GPUs open on
  a real node.

Faults (``kube-standin-fault``, docs/lab.md) come from /run/kube-standin/faults.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .gpuclients import GpuClientProcesses
from .nodeclient import ApiError, Client
from .yamlio import load_yaml_file

VERSION = os.environ.get("KUBE_STANDIN_VERSION", "v1.36.3")
FAULTS_FILE = os.environ.get("KUBE_STANDIN_FAULTS", "/run/kube-standin/faults.json")
NVML_STATE = os.environ.get("FAKE_NVML_STATE", "/var/lib/fake-nvml/state.json")
GPU_RESOURCE = "nvidia.com/gpu"
DEVICE_PLUGIN_IMAGE = "k8s-device-plugin"
KUBE_PROXY_IMAGE = "kube-proxy"
POD_TICK_S = 2.0
BACKOFF_CAP_S = 300.0


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def log(message: str) -> None:
    print(f"kubelet-standin: {message}", file=sys.stderr, flush=True)


def read_faults() -> dict[str, Any]:
    try:
        with open(FAULTS_FILE, encoding="utf-8") as f:
            faults = json.load(f)
        return faults if isinstance(faults, dict) else {}
    except (OSError, ValueError):
        return {}


def healthy_gpus() -> int:
    """GPUs the driver enumerates and that have not fallen off the bus (present and not lost)."""
    try:
        with open(NVML_STATE, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return 0
    return sum(1 for g in state.get("gpus", []) if g.get("present", True) and not g.get("lost"))


def host_capacity(max_pods: int) -> dict[str, str]:
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    st = os.statvfs("/")
    return {
        "cpu": str(os.cpu_count() or 1),
        "ephemeral-storage": f"{st.f_blocks * st.f_frsize // 1024}Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": f"{mem_kib}Ki",
        "pods": str(max_pods),
    }


def read_text(path: str, default: str = "") -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return default


def os_image() -> str:
    for line in read_text("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return "Linux"


def runtime_version() -> str:
    import subprocess

    try:
        out = subprocess.run(["containerd", "--version"], capture_output=True, text=True, timeout=5).stdout
        parts = out.split()
        if len(parts) >= 3:
            return f"containerd://{parts[2].lstrip('v')}"
    except (OSError, subprocess.SubprocessError):
        pass
    return "containerd://unknown"


def image_matches(pod: dict[str, Any], needle: str) -> bool:
    return any(needle in c.get("image", "") for c in pod.get("spec", {}).get("containers", []))


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


class Kubelet:
    def __init__(self, args: argparse.Namespace) -> None:
        self.client = Client.from_kubeconfig(args.kubeconfig)
        self.config: dict[str, Any] = load_yaml_file(args.config) or {}
        self.node_name = (args.hostname_override or socket.gethostname()).lower()
        self.node_ip = args.node_ip or self._route_ip()
        self.labels = {
            "beta.kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": self.node_name,
            "kubernetes.io/os": "linux",
        }
        for item in filter(None, (args.node_labels or "").split(",")):
            key, _, value = item.partition("=")
            self.labels[key] = value
        self.register_taints = []
        for item in filter(None, (args.register_with_taints or "").split(",")):
            kv, _, effect = item.partition(":")
            key, _, value = kv.partition("=")
            self.register_taints.append(
                {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}
            )
        self.register_taints += self.config.get("registerWithTaints") or []
        self.max_pods = int(self.config.get("maxPods") or 110)
        self.status_every = 10.0
        self.started = now()
        self.runtime = runtime_version()
        self.gpu_registered = False
        # device-plugin-unregistered: uids of the plugin Pods that lost their registration (None: no fault)
        self.plugin_lost_uids: set[str] | None = None
        self.pod_state: dict[str, dict[str, Any]] = {}  # uid -> container ids, restarts, backoff
        self.last_status = 0.0
        self.last_ready: bool | None = None
        self.proxy: Any = None
        self.gpu_clients = GpuClientProcesses()
        self.stop = threading.Event()

    def _route_ip(self) -> str:
        host = self.client.server.removeprefix("https://").rsplit(":", 1)[0].strip("[]")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((host, 1))
                return s.getsockname()[0]
            except OSError:
                return "127.0.0.1"

    # -- node ------------------------------------------------------------------------------------
    def register(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": self.labels,
                "annotations": {
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                },
            },
            "spec": {"taints": self.register_taints} if self.register_taints else {},
        }
        try:
            self.client.create("/api/v1/nodes", body)
            log(f"Successfully registered node {self.node_name}")
        except ApiError as err:
            if err.status != 409:
                raise
            # an existing Node (kubelet restart, re-join after reset): reconcile the labels the kubelet owns
            self.client.merge_patch(f"/api/v1/nodes/{self.node_name}", {"metadata": {"labels": self.labels}})

    def gpu_resources(self, pods: list[dict[str, Any]], faults: dict[str, Any]) -> dict[str, str] | None:
        plugins = [pod for pod in pods if image_matches(pod, DEVICE_PLUGIN_IMAGE)]
        # As a real plugin whose registration with the kubelet was lost (its socket gone after a kubelet
        # restart, say): the plugin Pods running when the fault came keep running and offer nothing; a new
        # plugin Pod (the DaemonSet's replacement of a deleted one) registers again.
        if faults.get("device_plugin_unregistered"):
            if self.plugin_lost_uids is None:
                self.plugin_lost_uids = {str(pod["metadata"].get("uid")) for pod in plugins}
        else:
            self.plugin_lost_uids = None
        lost = self.plugin_lost_uids or set()
        plugin_ready = any(
            str(pod["metadata"].get("uid")) not in lost and self.pod_ready(pod, faults) for pod in plugins
        )
        if plugin_ready:
            self.gpu_registered = True
            return {"capacity": str(healthy_gpus()), "allocatable": str(healthy_gpus())}
        if self.gpu_registered:
            # the plugin's socket went away: the kubelet keeps the capacity and offers none of it
            return {"capacity": None, "allocatable": "0"}
        return None

    def node_status(self, pods: list[dict[str, Any]], faults: dict[str, Any]) -> dict[str, Any]:
        capacity = host_capacity(self.max_pods)
        allocatable = dict(capacity)
        gpu = self.gpu_resources(pods, faults)
        if gpu is not None:
            if gpu["capacity"] is not None:
                capacity[GPU_RESOURCE] = gpu["capacity"]
            allocatable[GPU_RESOURCE] = gpu["allocatable"]
        ready = not faults.get("not_ready")
        stamp = now()
        condition = (
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
            }
            if ready
            else {
                "type": "Ready",
                "status": "False",
                "reason": "KubeletNotReady",
                "message": "container runtime network not ready: NetworkReady=false "
                "reason:NetworkPluginNotReady "
                "message:Network plugin returns error: cni plugin not initialized (lab fault)",
            }
        )
        if ready != self.last_ready:
            self.ready_since = stamp
            self.last_ready = ready
        conditions = [
            {
                "type": t,
                "status": "False",
                "reason": r,
                "message": m,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": self.started,
            }
            for t, r, m in (
                ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            )
        ]
        conditions.append(condition | {"lastHeartbeatTime": stamp, "lastTransitionTime": self.ready_since})
        return {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": self.node_ip},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": int(self.config.get("port") or 10250)}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": read_text("/proc/sys/kernel/random/boot_id"),
                "containerRuntimeVersion": self.runtime,
                "kernelVersion": platform.release(),
                "kubeProxyVersion": "",
                "kubeletVersion": VERSION,
                "machineID": read_text("/etc/machine-id"),
                "operatingSystem": "linux",
                "osImage": os_image(),
                "systemUUID": read_text("/sys/class/dmi/id/product_uuid", read_text("/etc/machine-id")),
            },
        }

    def post_status(self, pods: list[dict[str, Any]], faults: dict[str, Any]) -> None:
        status = self.node_status(pods, faults)
        try:
            self.client.merge_patch(f"/api/v1/nodes/{self.node_name}/status", {"status": status})
        except ApiError as err:
            if (
                err.status == 404
            ):  # the Node was deleted (kubectl delete node): register again, as kubelet does
                self.register()
                self.client.merge_patch(f"/api/v1/nodes/{self.node_name}/status", {"status": status})
            else:
                raise

    def renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node_name}"
        spec = {"holderIdentity": self.node_name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
        try:
            self.client.merge_patch(path, {"spec": spec})
        except ApiError as err:
            if err.status != 404:
                raise
            self.client.ensure(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.node_name, "namespace": "kube-node-lease"},
                    "spec": spec,
                },
            )

    # -- pods ------------------------------------------------------------------------------------
    def crashlooping(self, pod: dict[str, Any], faults: dict[str, Any]) -> bool:
        meta = pod.get("metadata", {})
        for rule in faults.get("crashloop", []):
            if rule.get("namespace") and rule["namespace"] != meta.get("namespace"):
                continue
            if rule.get("pod") and rule["pod"] == meta.get("name"):
                return True
            if rule.get("selector") and selector_matches(rule["selector"], meta.get("labels") or {}):
                return True
        return False

    def pod_ready(self, pod: dict[str, Any], faults: dict[str, Any]) -> bool:
        if pod.get("metadata", {}).get("deletionTimestamp") or self.crashlooping(pod, faults):
            return False
        status = pod.get("status", {})
        return status.get("phase") == "Running" and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
        )

    def list_pods(self) -> list[dict[str, Any]]:
        answer = self.client.get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={self.node_name}"})
        return [p for p in answer.get("items", []) if p.get("spec", {}).get("nodeName") == self.node_name]

    def container_id(self, uid: str, name: str, restarts: int) -> str:
        return "containerd://" + hashlib.sha256(f"{uid}/{name}/{restarts}".encode()).hexdigest()

    def desired_status(self, pod: dict[str, Any], faults: dict[str, Any]) -> dict[str, Any]:
        meta, spec, old = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
        uid = meta.get("uid", meta["name"])
        state = self.pod_state.setdefault(
            uid, {"restarts": 0, "started": now(), "next_crash": 0.0, "backoff": 10.0}
        )
        crash = self.crashlooping(pod, faults)
        t = time.monotonic()
        if crash and t >= state["next_crash"]:
            if state["next_crash"]:
                state["restarts"] += 1
            state["next_crash"] = t + state["backoff"]
            state["backoff"] = min(state["backoff"] * 2, BACKOFF_CAP_S)
        if not crash:
            state["backoff"], state["next_crash"] = 10.0, 0.0
        host_network = spec.get("hostNetwork", False)
        statuses = []
        for container in spec.get("containers", []):
            name, image = container["name"], container.get("image", "")
            entry: dict[str, Any] = {
                "name": name,
                "image": image,
                "imageID": f"{image.split(':')[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
                "containerID": self.container_id(uid, name, state["restarts"]),
                "restartCount": state["restarts"],
                "started": not crash,
                "ready": not crash,
            }
            if crash:
                entry["state"] = {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {int(state['backoff'] / 2)}s restarting failed "
                        f"container={name} pod={meta['name']}_{meta.get('namespace')}({uid})",
                    }
                }
                entry["lastState"] = {
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "startedAt": state["started"],
                        "finishedAt": now(),
                        "containerID": entry["containerID"],
                    }
                }
            else:
                entry["state"] = {"running": {"startedAt": state["started"]}}
                if state["restarts"]:
                    entry["lastState"] = (old.get("containerStatuses") or [{}])[0].get("lastState", {})
            statuses.append(entry)
        ready = "False" if crash else "True"
        reason = (
            {
                "reason": "ContainersNotReady",
                "message": f"containers with unready status: [{' '.join(c['name'] for c in statuses)}]",
            }
            if crash
            else {}
        )
        started = old.get("startTime") or state["started"]
        conditions = [
            {"type": "PodReadyToStartContainers", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": ready, **reason},
            {"type": "ContainersReady", "status": ready, **reason},
            {"type": "PodScheduled", "status": "True"},
        ]
        previous = {c.get("type"): c for c in old.get("conditions", [])}
        for c in conditions:
            prev = previous.get(c["type"], {})
            same = prev.get("status") == c["status"]
            c["lastProbeTime"] = None
            c["lastTransitionTime"] = (
                prev.get("lastTransitionTime") if same and prev.get("lastTransitionTime") else now()
            )
        status = {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": self.node_ip,
            "hostIPs": [{"ip": self.node_ip}],
            "startTime": started,
            "containerStatuses": statuses,
            "qosClass": old.get("qosClass") or "BestEffort",
        }
        if host_network:
            status["podIP"], status["podIPs"] = self.node_ip, [{"ip": self.node_ip}]
        else:
            ip = self.pod_ip(uid)
            if ip:
                status["podIP"], status["podIPs"] = ip, [{"ip": ip}]
        return status

    def pod_ip(self, uid: str) -> str | None:
        """An address from the node's podCIDR (as a CNI would hand out), when the node has one."""
        cidr = getattr(self, "pod_cidr", None)
        if not cidr:
            return None
        import ipaddress

        net = ipaddress.ip_network(cidr, strict=False)
        offset = 2 + int(hashlib.sha256(uid.encode()).hexdigest(), 16) % max(1, net.num_addresses - 3)
        return str(net.network_address + offset)

    def sync_pods(self, pods: list[dict[str, Any]], faults: dict[str, Any]) -> None:
        for pod in pods:
            meta = pod["metadata"]
            path = f"/api/v1/namespaces/{meta.get('namespace', 'default')}/pods/{meta['name']}"
            if meta.get("deletionTimestamp"):
                # containers stopped: finish the graceful deletion, as the kubelet does
                try:
                    self.client.request(
                        "DELETE",
                        path,
                        {
                            "kind": "DeleteOptions",
                            "apiVersion": "v1",
                            "gracePeriodSeconds": 0,
                            "preconditions": {"uid": meta.get("uid")},
                        },
                    )
                except ApiError as err:
                    if err.status not in (404, 409):
                        log(f"deleting pod {meta['name']}: {err}")
                self.pod_state.pop(meta.get("uid", ""), None)
                continue
            desired = self.desired_status(pod, faults)
            if self._same(pod.get("status", {}), desired):
                continue
            try:
                self.client.merge_patch(f"{path}/status", {"status": desired})
            except ApiError as err:
                if err.status != 404:
                    log(f"pod status {meta['name']}: {err}")
        live = {p["metadata"].get("uid", p["metadata"]["name"]) for p in pods}
        for uid in list(self.pod_state):
            if uid not in live:
                del self.pod_state[uid]

    @staticmethod
    def _same(old: dict[str, Any], new: dict[str, Any]) -> bool:
        def key(s: dict[str, Any]) -> Any:
            return (
                s.get("phase"),
                s.get("podIP"),
                sorted((c.get("type"), c.get("status")) for c in s.get("conditions", [])),
                [
                    (c.get("name"), c.get("ready"), c.get("restartCount"), c.get("image"))
                    for c in s.get("containerStatuses") or []
                ],
            )

        return key(old) == key(new)

    # -- static pods -----------------------------------------------------------------------------
    def mirror_pods(self) -> None:
        directory = Path(self.config.get("staticPodPath") or "")
        if not self.config.get("staticPodPath") or not directory.is_dir():
            return
        for manifest in sorted(directory.glob("*.yaml")):
            try:
                pod = load_yaml_file(str(manifest))
            except Exception:
                continue
            if not isinstance(pod, dict) or pod.get("kind") != "Pod":
                continue
            meta = pod.setdefault("metadata", {})
            ns = meta.get("namespace") or "default"
            meta["name"] = f"{meta.get('name')}-{self.node_name}"
            meta["namespace"] = ns
            digest = hashlib.md5(manifest.read_bytes()).hexdigest()
            meta["annotations"] = {
                "kubernetes.io/config.hash": digest,
                "kubernetes.io/config.mirror": digest,
                "kubernetes.io/config.source": "file",
            }
            if getattr(self, "node_uid", ""):
                meta["ownerReferences"] = [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.node_name,
                        "uid": self.node_uid,
                        "controller": True,
                    }
                ]
            pod.setdefault("spec", {})["nodeName"] = self.node_name
            pod.pop("status", None)
            try:
                self.client.ensure(f"/api/v1/namespaces/{ns}/pods", pod)
            except ApiError as err:
                log(f"mirror pod {meta['name']}: {err}")

    # -- main loop -------------------------------------------------------------------------------
    def run(self) -> None:
        from . import kubeproxy

        self.ready_since = now()
        self.register()
        try:
            node = self.client.get(f"/api/v1/nodes/{self.node_name}")
            self.node_uid = node["metadata"].get("uid", "")
        except ApiError:
            self.node_uid = ""
        self.mirror_pods()
        self.proxy = kubeproxy.KubeProxy(self.client, self.node_name)
        from . import csr

        static = Path(self.config.get("staticPodPath") or "/etc/kubernetes/manifests")
        signer = csr.Signer(static / "kube-controller-manager.yaml", log)
        last_mirror = time.monotonic()
        last_lease = 0.0
        while not self.stop.is_set():
            faults = read_faults()
            try:
                node = self.client.get(f"/api/v1/nodes/{self.node_name}")
                self.pod_cidr = node.get("spec", {}).get("podCIDR")
                pods = self.list_pods()
                self.sync_pods(pods, faults)
                pods = self.list_pods()
                self.gpu_clients.sync(pods, lambda pod, faults=faults: self.pod_ready(pod, faults))
                heartbeat = not faults.get("stop_heartbeat")
                gpu_now = self.gpu_resources(pods, faults)
                changed = gpu_now != getattr(self, "_last_gpu", "unset") or bool(faults.get("not_ready")) != (
                    self.last_ready is False
                )
                self._last_gpu = gpu_now
                t = time.monotonic()
                if heartbeat and (changed or t - self.last_status >= self.status_every):
                    self.post_status(pods, faults)
                    self.last_status = t
                if heartbeat and t - last_lease >= 10:
                    self.renew_lease()
                    last_lease = t
                if t - last_mirror >= 20:
                    self.mirror_pods()
                    last_mirror = t
                signer.sync()
                proxy_pods = [
                    p for p in pods if image_matches(p, KUBE_PROXY_IMAGE) and self.pod_ready(p, faults)
                ]
                self.proxy.sync(proxy_pods[0]["metadata"].get("uid", "kube-proxy") if proxy_pods else None)
            except ApiError as err:
                log(f"API: {err}")
            self.stop.wait(POD_TICK_S)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubelet", description="kubelet (lab stand-in, see docs/lab.md)")
    parser.add_argument("--version", action="store_true")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--bootstrap-kubeconfig")
    parser.add_argument("--config")
    parser.add_argument("--container-runtime-endpoint")
    parser.add_argument("--pod-infra-container-image")
    parser.add_argument("--node-ip")
    parser.add_argument("--hostname-override")
    parser.add_argument("--node-labels")
    parser.add_argument("--register-with-taints")
    parser.add_argument("--cert-dir", default="/var/lib/kubelet/pki")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the unit passes its environment files' flags as one word each; split them like a shell would
    words = [w for arg in argv for w in shlex.split(arg)]
    args, unknown = build_parser().parse_known_args(words)
    if args.version:
        print(f"Kubernetes {VERSION}")
        return 0
    if unknown:
        log(f"flags the stand-in ignores: {' '.join(unknown)}")
    if not args.config or not Path(args.config).is_file():
        log(
            f'"command failed" err="failed to load kubelet config file, path: {args.config}, error: '
            f'open {args.config}: no such file or directory"'
        )
        return 1
    kubeconfig = args.kubeconfig
    if not kubeconfig or not Path(kubeconfig).is_file():
        boot = args.bootstrap_kubeconfig
        if not boot or not Path(boot).is_file():
            log(
                '"command failed" err="failed to run Kubelet: unable to load bootstrap '
                f"kubeconfig: stat {boot}: "
                'no such file or directory"'
            )
            return 1
        from . import csr

        node_name = (args.hostname_override or socket.gethostname()).lower()
        try:
            csr.bootstrap(boot, kubeconfig, node_name, log, args.cert_dir)
        except (ApiError, RuntimeError) as err:
            log(f'"command failed" err="failed to run Kubelet: TLS bootstrap: {err}"')
            return 1
    args.kubeconfig = kubeconfig
    kubelet = Kubelet(args)
    while True:
        try:
            kubelet.run()
            return 0
        except ApiError as err:
            log(f"cannot reach the API ({err}); retrying in 5s")
            time.sleep(5)


if __name__ == "__main__":
    sys.exit(main())
