"""kube-proxy stand-in, run inside the kubelet stand-in while a kube-proxy Pod runs on the node.

* ``/proxyMode`` (and ``/metrics``) on ``metricsBindAddress`` (default 127.0.0.1:10249) and ``/healthz``
  on ``healthzBindAddress`` (default 0.0.0.0:10256), answering from the kube-proxy ConfigMap's
  ``config.conf`` as the real kube-proxy does (``mode: ""`` is iptables on Linux).
* In IPVS mode it programs the virtual servers a real kube-proxy would (one per Service ClusterIP and
  port, real servers from the EndpointSlices/Endpoints) into the lab's IPVS table stand-in,
  ``/run/lab-ipvs/table.json``, because the lab kernel has no ip_vs. The lab image's ``ipvsadm``
  lists that table when the kernel has no IPVS (tests/lab/image/ipvsadm-standin).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .nodeclient import ApiError, Client
from .yamlio import YAMLError, load_all

IPVS_TABLE = os.environ.get("LAB_IPVS_TABLE", "/run/lab-ipvs/table.json")
SYNC_EVERY_S = 5.0


def _split(address: str, default: str) -> tuple[str, int]:
    address = address or default
    host, _, port = address.rpartition(":")
    return (host or "0.0.0.0").strip("[]"), int(port)


class _Handler(BaseHTTPRequestHandler):
    proxy: KubeProxy

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/proxyMode":
            self._send(200, self.proxy.mode, "text/plain; charset=utf-8")
        elif path in ("/healthz", "/livez"):
            stamp = datetime.now(UTC).isoformat()
            body = json.dumps({"lastUpdated": stamp, "currentTime": stamp, "nodeEligible": True})
            self._send(200, body, "application/json")
        elif path == "/metrics":
            self._send(
                200,
                f"kubeproxy_sync_proxy_rules_last_timestamp_seconds {self.proxy.last_sync:.3f}\n"
                f'kube_proxy_mode_info{{mode="{self.proxy.mode}"}} 1\n',
                "text/plain; version=0.0.4",
            )
        else:
            self._send(404, "404 page not found\n", "text/plain; charset=utf-8")

    def _send(self, code: int, body: str, content_type: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


class KubeProxy:
    def __init__(self, client: Client, node_name: str) -> None:
        self.client = client
        self.node_name = node_name
        self.pod_uid: str | None = None
        self.mode = "iptables"
        self.config: dict[str, Any] = {}
        self.servers: list[ThreadingHTTPServer] = []
        self.last_sync = 0.0
        self.last_table: list[dict[str, Any]] | None = None
        self.api = client

    def sync(self, pod_uid: str | None) -> None:
        if pod_uid != self.pod_uid:
            self._stop()
            self.pod_uid = pod_uid
            if pod_uid:
                self._start()
        if self.pod_uid and time.monotonic() - self.last_sync >= SYNC_EVERY_S:
            self._sync_rules()

    def _service_account_client(self) -> Client:
        """kube-proxy runs as ServiceAccount kube-system/kube-proxy (kubeadm binds it to system:node-proxier);
        the kubelet asks for its token with a TokenRequest, as for any Pod's projected token."""
        try:
            answer = self.client.create(
                "/api/v1/namespaces/kube-system/serviceaccounts/kube-proxy/token",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 86400},
                },
            )
            token = answer["status"]["token"]
        except (ApiError, KeyError, TypeError) as err:
            print(
                f"kube-proxy-standin: no ServiceAccount token ({err}); using the kubelet's credentials",
                flush=True,
            )
            return self.client
        return Client(self.client.server, self.client.ca_pem, token=token)

    def _start(self) -> None:
        self.api = self._service_account_client()
        try:
            cm = self.client.get("/api/v1/namespaces/kube-system/configmaps/kube-proxy")
            docs = load_all(cm.get("data", {}).get("config.conf", ""))
            self.config = docs[0] if docs and isinstance(docs[0], dict) else {}
        except (ApiError, YAMLError) as err:
            print(f"kube-proxy-standin: cannot read the kube-proxy ConfigMap: {err}", flush=True)
            self.config = {}
        self.mode = self.config.get("mode") or "iptables"
        handler = type("Handler", (_Handler,), {"proxy": self})
        addresses = {
            _split(self.config.get("metricsBindAddress", ""), "127.0.0.1:10249"),
            _split(self.config.get("healthzBindAddress", ""), "0.0.0.0:10256"),
        }
        for host, port in addresses:
            try:
                server = ThreadingHTTPServer((host, port), handler)
            except OSError as err:
                print(f"kube-proxy-standin: cannot listen on {host}:{port}: {err}", flush=True)
                continue
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers.append(server)
        print(f"kube-proxy-standin: started, mode {self.mode}", flush=True)

    def _stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
        self.servers = []

    def _sync_rules(self) -> None:
        self.last_sync = time.time()
        if self.mode != "ipvs":
            return
        try:
            services = self.api.get("/api/v1/services").get("items", [])
            endpoints = self._endpoints()
        except ApiError as err:
            print(f"kube-proxy-standin: sync: {err}", flush=True)
            return
        scheduler = (self.config.get("ipvs") or {}).get("scheduler") or "rr"
        table = []
        for svc in services:
            spec = svc.get("spec", {})
            ip = spec.get("clusterIP")
            if not ip or ip == "None":
                continue
            key = (svc["metadata"].get("namespace"), svc["metadata"]["name"])
            for port in spec.get("ports", []):
                real = [
                    {"address": addr, "port": target, "forward": "Masq", "weight": 1}
                    for addr, target, name in endpoints.get(key, [])
                    if name == port.get("name", "") or len(spec.get("ports", [])) == 1
                ]
                table.append(
                    {
                        "protocol": port.get("protocol", "TCP"),
                        "address": ip,
                        "port": port["port"],
                        "scheduler": scheduler,
                        "real_servers": real,
                    }
                )
        table.sort(key=lambda v: (v["protocol"], v["address"], v["port"]))
        if table != self.last_table:
            write_table(table)
            self.last_table = table

    def _endpoints(self) -> dict[tuple[str, str], list[tuple[str, int, str]]]:
        """(namespace, service) -> [(address, port, port name)] from EndpointSlices, else Endpoints."""
        result: dict[tuple[str, str], list[tuple[str, int, str]]] = {}
        try:
            slices = self.api.get("/apis/discovery.k8s.io/v1/endpointslices").get("items", [])
            for sl in slices:
                svc = (sl.get("metadata", {}).get("labels") or {}).get("kubernetes.io/service-name")
                if not svc:
                    continue
                key = (sl["metadata"].get("namespace"), svc)
                for ep in sl.get("endpoints") or []:
                    if (ep.get("conditions") or {}).get("ready") is False:
                        continue
                    for addr in ep.get("addresses", []):
                        for port in sl.get("ports") or []:
                            result.setdefault(key, []).append((addr, port.get("port"), port.get("name", "")))
            return result
        except ApiError as err:
            if err.status != 404:
                raise
        for ep in self.api.get("/api/v1/endpoints").get("items", []):
            key = (ep["metadata"].get("namespace"), ep["metadata"]["name"])
            for subset in ep.get("subsets") or []:
                for addr in subset.get("addresses") or []:
                    for port in subset.get("ports") or []:
                        result.setdefault(key, []).append(
                            (addr["ip"], port.get("port"), port.get("name", ""))
                        )
        return result


def write_table(table: list[dict[str, Any]]) -> None:
    directory = os.path.dirname(IPVS_TABLE)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".table-", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"virtual_servers": table}, f, indent=2)
    os.chmod(tmp, 0o644)
    os.replace(tmp, IPVS_TABLE)
