"""The real Kubernetes control plane for unit tests: etcd, kube-apiserver and, for the tests that need
controllers, kube-controller-manager, run as local processes on 127.0.0.1.

The binaries are the production pin's, built from their upstream Go modules by tests/lab/gobuild/build.py
(cached in ~/.cache/llm-lab/go; `make unit` builds them first; otherwise the first test that needs one builds
it, once for all xdist workers). The rest comes from the real kubeadm, from one kubeadm configuration whose
certificatesDir is the cluster's temporary directory:

- the PKI and the service-account keys: `kubeadm init phase certs all`;
- the kubeconfigs: `kubeadm init phase kubeconfig super-admin` (system:masters: a bare API server has no
  kubeadm:cluster-admins binding for admin.conf's group) and `controller-manager`;
- the command lines: the static Pod manifests `kubeadm init phase etcd local` and `init phase control-plane`
  write (--dry-run, into the temporary directory), run as they are but for the free ports and the loopback
  addresses set through the configuration's extraArgs. So the API server has kubeadm's
  --authorization-mode=Node,RBAC, its --enable-admission-plugins, its service-account flags.

No kubelet, scheduler or kube-proxy: a test that needs Nodes registers them through the API as a kubelet does
(`ControlPlane.register_node`), and one that needs pods on them runs `Kubelets`, which writes through the API
what those Nodes' kubelets would for their pods (no container runs). Processes die with the test process that
started them (PR_SET_PDEATHSIG), and `ControlPlane.stop` ends them and removes their directory.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import http.client
import itertools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests") not in sys.path:  # pytest puts it there (pyproject.toml); a script run does not
    sys.path.append(str(ROOT / "tests"))
# What the unit tests need from kube-controller-manager (ControlPlane.start_controllers), and which:
# - serviceaccount-token-controller: test_gpu_health_agent.py's agent token is the role's Secret of type
#   kubernetes.io/service-account-token, which the token controller fills in;
# - serviceaccount-controller: a namespace's `default` ServiceAccount, without which the API server's
#   ServiceAccount admission refuses every pod of the namespace (test_oncall_playbooks.py's and
#   test_driver_gpu_clients.py's pods);
# - daemonset-controller: test_driver_gpu_clients.py's GPU DaemonSets leave a node that loses the GPU label
#   and come back with it;
# - disruption-controller: the PodDisruptionBudgets' status the eviction API judges by
#   (test_oncall_playbooks.py's drains).
# Nothing else runs: no namespace deletion, no garbage collection, no node lifecycle, no ReplicaSets.
CONTROLLERS = (
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "daemonset-controller",
    "disruption-controller",
)
# kubeadm replaces a loopback advertise address with a host interface's (and fails where it finds none:
# "unable to select an IP from lo network interface"), so the cluster advertises a documentation address
# (RFC 5737) that nothing routes to; every process binds, and is reached, on 127.0.0.1
ADVERTISE = "198.51.100.10"
NODE_NAME = "unit-control-plane"


class KubeError(RuntimeError):
    pass


@cache
def component_dir(name: str) -> Path:
    """The directory of a component's binaries (build.py's `build`: xdist workers asking at once wait for
    one build)."""
    from lab.gobuild import build

    try:
        return build.build(build.BY_NAME[name])
    except (build.BuildError, OSError) as exc:
        raise KubeError(f"tests/lab/gobuild/build.py {name}: {exc}") from exc


def binary(name: str) -> Path:
    """A real Kubernetes binary (kubeadm, kubectl, kube-apiserver, ...) or etcd's (etcd, etcdctl)."""
    component = "etcd" if name.startswith("etcd") else "kubernetes"
    path = component_dir(component) / name
    if not path.is_file():
        raise KubeError(f"{path}: not built by tests/lab/gobuild/build.py {component}")
    return path


def kubernetes_version() -> str:
    """The production pin (its home: roles/kubernetes' kubernetes_version, as build.py reads it), v1.X.Y."""
    from lab.gobuild import build

    return build.BY_NAME["kubernetes"].pin()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the forked child only calls it


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: SIGKILL, as a SIGTERMed kube-apiserver whose etcd went too hangs in its graceful
    # shutdown (retrying etcd) and never exits
    _prctl(1, signal.SIGKILL)


def kubeadm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary("kubeadm")), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def _flags(manifest: Path) -> list[str]:
    """The command line of a static Pod manifest kubeadm wrote, without the program's name."""
    pod = yaml.safe_load(manifest.read_text())
    return list(pod["spec"]["containers"][0]["command"][1:])


def _extra(args: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in args.items()]


class Client:
    """A small JSON REST client of the API server, by client certificate or bearer token."""

    def __init__(self, port: int, ca: Path, cert: tuple[Path, Path] | None = None, token: str | None = None):
        self.port = port
        self.ctx = ssl.create_default_context(cafile=str(ca))
        if cert:
            self.ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        self.token = token

    def raw(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json"
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=30)
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = ctype
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def request(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json"
    ) -> tuple[int, Any]:
        code, raw = self.raw(method, path, body, ctype)
        try:
            return code, json.loads(raw)
        except ValueError:
            return code, raw.decode(errors="replace")

    def ok(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        code, out = self.request(method, path, body, ctype)
        if code >= 300:
            raise AssertionError(f"{method} {path} -> {code}: {out}")
        return out


class ControlPlane:
    """etcd + kube-apiserver of the pinned release on free ports of 127.0.0.1, in a directory of their own."""

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = Path(directory or tempfile.mkdtemp(prefix="real-kube-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pki = self.dir / "pki"
        self.port = free_port()
        self.etcd_ports = {name: free_port() for name in ("client", "peer", "metrics")}
        self.controller_manager_port = free_port()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        # each process's program, flags and readiness check, to start it again (start_component)
        self.commands: dict[str, tuple[Path, list[str], Any]] = {}
        self.config = self.dir / "kubeadm-config.yaml"
        self._write_config()

    # ------------------------------------------------------------------------------------ configuration

    def _write_config(self) -> None:
        etcd = f"https://127.0.0.1:{self.etcd_ports['client']}"
        peer = f"https://127.0.0.1:{self.etcd_ports['peer']}"
        kubeconfig = str(self.dir / "controller-manager.conf")
        documents = [
            {
                "apiVersion": "kubeadm.k8s.io/v1beta4",
                "kind": "InitConfiguration",
                "localAPIEndpoint": {"advertiseAddress": ADVERTISE, "bindPort": self.port},
                "nodeRegistration": {"name": NODE_NAME},
            },
            {
                "apiVersion": "kubeadm.k8s.io/v1beta4",
                "kind": "ClusterConfiguration",
                "kubernetesVersion": kubernetes_version(),
                "certificatesDir": str(self.pki),
                "controlPlaneEndpoint": f"127.0.0.1:{self.port}",
                "apiServer": {
                    "certSANs": ["127.0.0.1", "localhost"],
                    "extraArgs": _extra({"bind-address": "127.0.0.1", "etcd-servers": etcd}),
                },
                "controllerManager": {
                    "extraArgs": _extra(
                        {
                            "kubeconfig": kubeconfig,
                            "authentication-kubeconfig": kubeconfig,
                            "authorization-kubeconfig": kubeconfig,
                            "secure-port": str(self.controller_manager_port),
                        }
                    )
                },
                "etcd": {
                    "local": {
                        "dataDir": str(self.dir / "etcd"),
                        "serverCertSANs": ["127.0.0.1"],
                        "peerCertSANs": ["127.0.0.1"],
                        "extraArgs": _extra(
                            {
                                "listen-client-urls": etcd,
                                "advertise-client-urls": etcd,
                                "listen-peer-urls": peer,
                                "initial-advertise-peer-urls": peer,
                                "initial-cluster": f"{NODE_NAME}={peer}",
                                "listen-metrics-urls": f"http://127.0.0.1:{self.etcd_ports['metrics']}",
                            }
                        ),
                    }
                },
            },
        ]
        self.config.write_text(yaml.safe_dump_all(documents))

    def _kubeadm(self, *args: str) -> str:
        done = kubeadm(*args, "--config", str(self.config))
        if done.returncode != 0:
            raise KubeError(f"kubeadm {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def _manifest(self, phase: str, component: str) -> list[str]:
        """The flags of the static Pod kubeadm's `init phase PHASE` writes for COMPONENT."""
        manifests = self.dir / "manifests"
        manifests.mkdir(exist_ok=True)
        done = kubeadm(
            "init", "phase", *phase.split(), "--config", str(self.config), "--dry-run",
            env={**os.environ, "KUBEADM_INIT_DRYRUN_DIR": str(manifests)},
        )  # fmt: skip
        if done.returncode != 0:
            raise KubeError(f"kubeadm init phase {phase} --dry-run: {done.stderr.strip()}")
        return _flags(manifests / f"{component}.yaml")

    # ---------------------------------------------------------------------------------------- processes

    def _spawn(self, name: str, program: Path, flags: Sequence[str]) -> None:
        with open(self.dir / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                [str(program), *flags],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,  # the processes end with the test process, even killed
            )

    def _wait(self, name: str, ready: Any, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                break
            with contextlib.suppress(OSError, ssl.SSLError, http.client.HTTPException):
                if ready():
                    return
            time.sleep(0.2)
        raise KubeError(f"{name} did not become ready; its log ends:\n{self.log(name)[-4000:]}")

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def start(self) -> ControlPlane:
        try:
            self._kubeadm("init", "phase", "certs", "all")
            self._kubeadm("init", "phase", "kubeconfig", "super-admin", "--kubeconfig-dir", str(self.dir))
            self.admin_cert = self._client_files(self.dir / "super-admin.conf", "super-admin")
            health = f"http://127.0.0.1:{self.etcd_ports['metrics']}/health"

            def etcd_healthy() -> bool:
                with urllib.request.urlopen(health, timeout=5) as response:
                    return bool(json.loads(response.read()).get("health") == "true")

            self.commands["etcd"] = (binary("etcd"), self._manifest("etcd local", "etcd"), etcd_healthy)
            self.commands["kube-apiserver"] = (
                binary("kube-apiserver"),
                self._manifest("control-plane apiserver", "kube-apiserver"),
                lambda: self.admin.raw("GET", "/readyz")[0] == 200,
            )
            self.start_component("etcd")
            self.start_component("kube-apiserver")
        except BaseException:
            self.stop()
            raise
        return self

    def start_controllers(self, controllers: Sequence[str] = CONTROLLERS) -> None:
        """kube-controller-manager with kubeadm's flags but only CONTROLLERS (--controllers)."""
        if "kube-controller-manager" in self.processes:
            raise KubeError("kube-controller-manager runs already")
        self._kubeadm(
            "init", "phase", "kubeconfig", "controller-manager", "--kubeconfig-dir", str(self.dir)
        )  # fmt: skip
        # kubeadm points the controller manager at the advertise address; nothing listens there here
        conf = self.dir / "controller-manager.conf"
        kubeconfig = yaml.safe_load(conf.read_text())
        kubeconfig["clusters"][0]["cluster"]["server"] = self.url
        conf.write_text(yaml.safe_dump(kubeconfig))
        flags = [
            f for f in self._manifest("control-plane controller-manager", "kube-controller-manager")
            if not f.startswith("--controllers=")
        ]  # fmt: skip
        flags.append("--controllers=" + ",".join(controllers))
        self._spawn("kube-controller-manager", binary("kube-controller-manager"), flags)
        healthz = Client(self.controller_manager_port, self.pki / "ca.crt")
        healthz.ctx.check_hostname = False  # its serving certificate is self-signed
        healthz.ctx.verify_mode = ssl.CERT_NONE
        self._wait("kube-controller-manager", lambda: healthz.raw("GET", "/healthz")[0] == 200)

    def start_component(self, name: str) -> None:
        """Start etcd or kube-apiserver (again) with its flags and wait until it is ready."""
        program, flags, ready = self.commands[name]
        self._spawn(name, program, flags)
        self._wait(name, ready)

    def stop_component(self, name: str) -> None:
        """End etcd or kube-apiserver, as the kubelet does when its static Pod manifest is moved away."""
        process = self.processes.pop(name)
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        self.processes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------------------------------ clients

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def admin(self) -> Client:
        """system:masters (kubeadm's super-admin.conf)."""
        return Client(self.port, self.ca, cert=self.admin_cert)

    def client(self, token: str) -> Client:
        return Client(self.port, self.ca, token=token)

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """The real kubectl of the production pin as the super-admin, its discovery cache in the cluster's
        directory."""
        return subprocess.run(
            [
                str(binary("kubectl")),
                f"--kubeconfig={self.admin_kubeconfig}",
                f"--cache-dir={self.dir / 'kubectl-cache'}",
                *args,
            ],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def _client_files(self, kubeconfig: Path, name: str) -> tuple[Path, Path]:
        """The client certificate and key of a kubeconfig, as files (Python's ssl reads files)."""
        user = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
        crt, key = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        crt.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        key.chmod(0o600)
        return crt, key

    @property
    def admin_kubeconfig(self) -> Path:
        """kubeadm's super-admin.conf (system:masters), for kubectl and the kubernetes Python client."""
        return self.dir / "super-admin.conf"

    # ------------------------------------------------------------------------------------------- nodes

    def register_node(self, name: str, labels: dict[str, str], ip: str, gpus: int = 0) -> dict[str, Any]:
        """A Node as a kubelet registers it (POST), then its status (the status subresource): Ready, its
        addresses, capacity and allocatable with the device plugin's GPUs."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **labels,
                },
            },
        }
        self.admin.ok("POST", "/api/v1/nodes", node)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        resources = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        status = {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
        }
        self.admin.ok(
            "PATCH", f"/api/v1/nodes/{name}/status", {"status": status}, "application/merge-patch+json"
        )
        # The API server's TaintNodesByCondition admission taints a new Node not-ready (NoSchedule) and the
        # node lifecycle controller takes the taint off once the Node is Ready; that controller does not run
        # (with no kubelet renewing the Node's Lease it would turn every Node NotReady), so its work is done
        # here: a DaemonSet's pods do not tolerate the taint.
        node = self.admin.ok("GET", f"/api/v1/nodes/{name}")
        taints = node["spec"].get("taints") or []
        node["spec"]["taints"] = [t for t in taints if t.get("key") != "node.kubernetes.io/not-ready"] or None
        return self.admin.ok("PUT", f"/api/v1/nodes/{name}", node)


class Kubelets:
    """What the kubelets of Nodes registered through the API (ControlPlane.register_node) would write for
    their pods, written by a thread of the test process every INTERVAL seconds. No kubelet and no container
    runs; for the pods of NODES:

    - a pod bound to one of them and not reported yet: its status, Running with every container started and
      Ready (the status subresource, as the kubelet's status manager reports a pod whose containers started);
    - a pod deleted gracefully (deletionTimestamp set, by a delete or an eviction through the API): the final
      delete the kubelet sends once its containers stopped (grace period 0, the pod's UID as precondition),
      without which the API server keeps the pod terminating for ever;
    - a DaemonSet's pod not bound yet: the binding the scheduler makes (no scheduler runs) to the one node the
      DaemonSet controller names in the pod's required node affinity, when that node is one of NODES and its
      labels match the pod's nodeSelector: nothing else is the scheduler's choice there.

    Its writes are the super-admin's (the kubelets' own credentials and NodeRestriction are not exercised).
    """

    def __init__(self, plane: ControlPlane, nodes: Iterable[str], interval: float = 0.3) -> None:
        self.admin = plane.admin
        self.nodes = set(nodes)
        self.interval = interval
        self.errors: list[str] = []  # what the API answered that a kubelet would not have expected
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pod_ips = itertools.count(2)

    def __enter__(self) -> Kubelets:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kubelets", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=60)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except (OSError, AssertionError, http.client.HTTPException) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.interval)

    def sync(self) -> None:
        """One pass over every pod of the cluster."""
        nodes: dict[str, dict[str, Any]] | None = None  # read when a pod needs its node
        for pod in self.admin.ok("GET", "/api/v1/pods")["items"]:
            node_name = pod["spec"].get("nodeName") or _daemonset_node(pod)
            if node_name not in self.nodes:
                continue
            if nodes is None:
                nodes = {n["metadata"]["name"]: n for n in self.admin.ok("GET", "/api/v1/nodes")["items"]}
            node = nodes.get(node_name)
            if node is None:
                continue
            if not pod["spec"].get("nodeName"):
                self._bind(pod, node)
            elif pod["metadata"].get("deletionTimestamp"):
                self._finish_deletion(pod)
            elif (pod.get("status") or {}).get("phase") != "Running":
                self._report_running(pod, node)

    def _write(self, method: str, path: str, body: Any, ctype: str = "application/json") -> None:
        code, out = self.admin.request(method, path, body, ctype)
        if code >= 300 and code not in (404, 409):  # gone, or changed meanwhile: the next pass sees it
            self.errors.append(f"{method} {path} -> {code}: {out}")

    def _bind(self, pod: dict[str, Any], node: dict[str, Any]) -> None:
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (pod["spec"].get("nodeSelector") or {}).items()):
            return
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node["metadata"]["name"]},
        }
        self._write("POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", binding)

    def _finish_deletion(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        self._write("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", options)

    def _report_running(self, pod: dict[str, Any], node: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        host_ip = next(
            a["address"] for a in node["status"].get("addresses") or [] if a.get("type") == "InternalIP"
        )
        if spec.get("hostNetwork"):
            pod_ip = host_ip
        else:
            n = next(self._pod_ips)
            pod_ip = f"10.244.{n // 250}.{n % 250 + 2}"
        conditions = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")

        def digest(text: str) -> str:
            return hashlib.sha256(text.encode()).hexdigest()

        status = {
            "phase": "Running",
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": now,
            "conditions": [{"type": c, "status": "True", "lastTransitionTime": now} for c in conditions],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": f"{c['image'].rsplit(':', 1)[0]}@sha256:{digest(c['image'])}",
                    "containerID": f"containerd://{digest(meta['uid'] + c['name'])}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for c in spec["containers"]
            ],
        }
        self._write(
            "PATCH",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
            {"status": status},
            "application/merge-patch+json",
        )


def _daemonset_node(pod: dict[str, Any]) -> str | None:
    """The node a DaemonSet's pod is for: the DaemonSet controller's required affinity to one node's name."""
    if not any(
        ref.get("kind") == "DaemonSet" and ref.get("controller")
        for ref in pod["metadata"].get("ownerReferences") or []
    ):
        return None
    affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    names = {
        value
        for term in terms
        for field in term.get("matchFields") or []
        if field.get("key") == "metadata.name" and field.get("operator") == "In"
        for value in field.get("values") or []
    }
    return names.pop() if len(names) == 1 else None


@contextlib.contextmanager
def control_plane(directory: Path | None = None) -> Iterator[ControlPlane]:
    plane = ControlPlane(directory).start()
    try:
        yield plane
    finally:
        plane.stop()
