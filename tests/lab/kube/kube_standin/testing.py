"""Test support (stdlib + the openssl CLI): a throwaway PKI, an API stand-in on a free port, a small REST
client and a fake kubelet that registers Nodes and marks bound Pods Running + Ready through the same API calls
the lab's kubelet stand-in makes."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .store import now_iso

PACKAGE_PARENT = Path(__file__).resolve().parents[1]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass
class Pki:
    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    def cert(self, name: str) -> tuple[Path, Path]:
        return self.folder / f"{name}.crt", self.folder / f"{name}.key"


def make_pki(folder: Path, clients: dict[str, tuple[str, list[str]]]) -> Pki:
    """CA, server cert for 127.0.0.1/localhost, and client certs {file name: (CN, [O...])}."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = folder / "ca.key", folder / "ca.crt"
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca_crt),
        "-days",
        "2",
        "-subj",
        "/CN=kubernetes",
    )
    ext = folder / "server.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default\n"
        "extendedKeyUsage=serverAuth\n"
    )
    items: dict[str, tuple[str, list[str], Path | None]] = {"apiserver": ("kube-apiserver", [], ext)}
    for fname, (cn, orgs) in clients.items():
        cext = folder / f"{fname}.ext"
        cext.write_text("extendedKeyUsage=clientAuth\n")
        items[fname] = (cn, orgs, cext)
    for fname, (cn, orgs, extfile) in items.items():
        key, csr, crt = folder / f"{fname}.key", folder / f"{fname}.csr", folder / f"{fname}.crt"
        subj = "".join(f"/O={o}" for o in orgs) + f"/CN={cn}"
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", subj)
        cmd = [
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca_crt),
            "-CAkey",
            str(ca_key),
            "-CAcreateserial",
            "-out",
            str(crt),
            "-days",
            "2",
        ]
        if extfile:
            cmd += ["-extfile", str(extfile)]
        _openssl(*cmd)
    (folder / "sa.key").write_bytes(os.urandom(64))
    return Pki(folder)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ApiProcess:
    """`python3 -m kube_standin.apiserver` as the lab runs it, on 127.0.0.1:<free port>."""

    def __init__(
        self, pki: Pki, state_file: Path, python: str = sys.executable, extra_args: list[str] | None = None
    ) -> None:
        self.extra_args = list(extra_args or [])
        self.pki = pki
        self.port = free_port()
        self.state_file = state_file
        self.python = python
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = state_file.parent / "apiserver.log"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        crt, key = self.pki.cert("apiserver")
        env = dict(os.environ, PYTHONPATH=str(PACKAGE_PARENT))
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.python,
                    "-m",
                    "kube_standin.apiserver",
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--tls-cert",
                    str(crt),
                    "--tls-key",
                    str(key),
                    "--client-ca",
                    str(self.pki.ca),
                    "--state-file",
                    str(self.state_file),
                    "--service-account-key",
                    str(self.pki.folder / "sa.key"),
                    *self.extra_args,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if Client(self, None).get_raw("/healthz")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"API stand-in did not come up; log: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def kubeconfig(self, path: Path, client: str) -> Path:
        crt, key = self.pki.cert(client)
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "lab",
                    "clusters": [
                        {
                            "name": "lab",
                            "cluster": {"server": self.url, "certificate-authority": str(self.pki.ca)},
                        }
                    ],
                    "users": [
                        {"name": client, "user": {"client-certificate": str(crt), "client-key": str(key)}}
                    ],
                    "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": client}}],
                }
            )
        )
        return path


class Client:
    """Minimal JSON REST client (client certificate or bearer token)."""

    def __init__(self, api: ApiProcess, client: str | None, token: str | None = None) -> None:
        self.api = api
        self.ctx = ssl.create_default_context(cafile=str(api.pki.ca))
        if client:
            crt, key = api.pki.cert(client)
            self.ctx.load_cert_chain(str(crt), str(key))
        self.token = token

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        ctype: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        code, raw = self.get_raw(path, method, body, ctype, headers)
        try:
            return code, json.loads(raw)
        except ValueError:
            return code, raw.decode()

    def get_raw(
        self,
        path: str,
        method: str = "GET",
        body: Any = None,
        ctype: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.api.port, context=self.ctx, timeout=30)
        hdrs = {"Accept": "application/json", **(headers or {})}
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            hdrs["Content-Type"] = ctype
        try:
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def ok(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        code, out = self.request(method, path, body, ctype)
        if code >= 300:
            raise AssertionError(f"{method} {path} -> {code}: {out}")
        return out


class FakeKubelet:
    """Registers Nodes and keeps every Pod bound to them Running + Ready, as the kubelet stand-in does."""

    def __init__(self, client: Client, nodes: dict[str, dict[str, Any]]) -> None:
        self.client = client
        self.nodes = nodes  # name -> {"labels":..., "taints":..., "gpus": int, "ready": bool}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)
        self._next_ip = 10

    def register(self) -> None:
        for name, cfg in self.nodes.items():
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        **cfg.get("labels", {}),
                    },
                },
                "spec": {"taints": cfg.get("taints", [])} if cfg.get("taints") else {},
                "status": self._node_status(name, cfg),
            }
            code, _ = self.client.request("POST", "/api/v1/nodes", node)
            if code == 409:
                self.set_status(name)

    def _node_status(self, name: str, cfg: dict[str, Any]) -> dict[str, Any]:
        alloc = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": str(cfg.get("gpus", 0))}
        ready = cfg.get("ready", True)
        now = now_iso()
        # a kubelet that went silent an hour ago ("heartbeat": False) posted its last status then
        beat = (
            now
            if cfg.get("heartbeat", True)
            else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
        )
        return {
            "capacity": alloc,
            "allocatable": alloc,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": beat,
                    "lastTransitionTime": beat,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": cfg.get("ip", "10.89.42.11")},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.36.3",
                "osImage": "Ubuntu 22.04.5 LTS",
                "kernelVersion": "6.1.0",
                "containerRuntimeVersion": "containerd://2.1.9",
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeProxyVersion": "",
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
            },
        }

    def set_status(self, name: str) -> None:
        status = self._node_status(name, self.nodes[name])
        self.client.ok(
            "PATCH", f"/api/v1/nodes/{name}/status", {"status": status}, "application/merge-patch+json"
        )

    def sync_pods(self) -> None:
        pods = self.client.ok("GET", "/api/v1/pods")["items"]
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if node not in self.nodes or pod["metadata"].get("deletionTimestamp"):
                continue
            if pod.get("status", {}).get("phase") == "Running":
                continue
            now = now_iso()
            status = {
                "phase": "Running",
                "hostIP": self.nodes[node].get("ip", "10.89.42.11"),
                "podIP": f"10.244.{self._next_ip // 250}.{self._next_ip % 250 + 2}",
                "startTime": now,
                "conditions": [
                    {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                    for t in (
                        "PodReadyToStartContainers",
                        "Initialized",
                        "Ready",
                        "ContainersReady",
                        "PodScheduled",
                    )
                ],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "image": c["image"],
                        "imageID": "",
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "containerID": "containerd://x",
                        "state": {"running": {"startedAt": now}},
                    }
                    for c in pod["spec"]["containers"]
                ],
            }
            self._next_ip += 1
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            self.client.request(
                "PATCH",
                f"/api/v1/namespaces/{ns}/pods/{name}/status",
                {"status": status},
                "application/merge-patch+json",
            )

    def renew_leases(self) -> None:
        """The kubelet's heartbeat: its Lease in kube-node-lease, renewed (real kubelets: every 10 s)."""
        base = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        for name, cfg in self.nodes.items():
            if not cfg.get("heartbeat", True):
                continue
            code, lease = self.client.request("GET", f"{base}/{name}")
            if code == 404:
                body = {
                    "metadata": {"name": name},
                    "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": stamp},
                }
                self.client.request("POST", base, body)
            elif code == 200:
                lease["spec"]["renewTime"] = stamp
                self.client.request("PUT", f"{base}/{name}", lease)

    def _loop(self) -> None:
        last_renew = 0.0
        while not self._stop.wait(0.2):
            if time.time() - last_renew > 2:
                last_renew = time.time()
                with contextlib.suppress(OSError, AssertionError):
                    self.renew_leases()
            with contextlib.suppress(OSError, AssertionError):
                self.sync_pods()

    def start(self) -> None:
        self.register()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
