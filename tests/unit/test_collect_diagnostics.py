"""playbooks/remediate/collect-diagnostics.yml run by ansible-playbook against the real kube-apiserver of the
production pin (real_kube.py), the serving pods and the gateway's Service as the API has them, and the nodes'
host networks as the serving NetworkPolicies leave them:

- every host is local (its own Python wrapper, the API tasks the admin kubeconfig of the test PKI);
- a node's host network is an HTTP proxy of its own (the node's `http_proxy`, set by its Python wrapper). It
  answers for the pods that run on that node (the policies admit a pod's own node, as the kubelet's probes
  need) and for the gateway's NodePort, and drops a request to another node's pod, as the policies do (on the
  lab: `connection refused`). So an endpoint is collected only when it is asked from its pod's own node.

What it proves: each serving pod's endpoints come from its own node and say so in index.json; a pod on a node
the inventory does not hold is named with why; the gateway's /health and /ready are asked on the nodePort of
the Service the API has (not a number of the playbook's), and are named with why when no such Service exists.
On the lab, with the real policies: tests/lab/test_remediation_on_lab.py."""

from __future__ import annotations

import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import real_kube
import yaml

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "serving"
NODE_IPS = {f"gpu-node-{i}": f"192.0.2.1{i}" for i in (1, 2, 3)}  # RFC 5737: nothing answers there
NODE_PORT = 31234  # not the role's default (30001): the playbook must read the Service
# name -> (node, pod IP, ports); pod IPs from RFC 2544's benchmark range: only the nodes' proxies serve them
PODS = {
    "llm-gateway-5c9d7-x2k4p": ("gpu-node-2", "198.18.2.10", {"http": 8000, "metrics": 9000}),
    "qwen2-7b-0": ("gpu-node-3", "198.18.3.10", {"http": 8000}),
    "qwen2-7b-1": ("gpu-node-1", "198.18.1.10", {"http": 8000}),
    "qwen2-7b-2": ("gpu-node-9", "198.18.9.10", {"http": 8000}),  # a node the inventory does not hold
}


class HostNetwork(http.server.ThreadingHTTPServer):
    """One node's host network, as an HTTP proxy: its own pods and every node's NodePort answer."""

    def __init__(self, node: str) -> None:
        super().__init__(("127.0.0.1", 0), Answer)
        self.node = node
        self.asked: list[str] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()


class Answer(http.server.BaseHTTPRequestHandler):
    server: HostNetwork

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.server.asked.append(self.path)
        pods = {ip: (name, node) for name, (node, ip, _) in PODS.items()}
        if url.hostname in pods:
            name, node = pods[url.hostname]
            if node != self.server.node:
                self.close_connection = True  # the NetworkPolicy's refusal: no answer
                return
            body = f"vllm:num_requests_waiting 0\n# {url.path} of {name}, asked on {node}\n"
        elif url.hostname in NODE_IPS.values() and url.port == NODE_PORT:
            body = json.dumps(
                {"status": "ok" if url.path == "/health" else "ready", "asked_on": self.server.node}
            )
        else:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class Site:
    def __init__(self, plane: real_kube.ControlPlane, tmp: Path) -> None:
        self.plane, self.tmp = plane, tmp
        self.networks = {node: HostNetwork(node) for node in NODE_IPS}
        hosts = {}
        for node, network in self.networks.items():
            python = tmp / f"{node}-python"
            python.write_text(
                "#!/bin/sh\n"
                "unset no_proxy NO_PROXY\n"
                f"export http_proxy=http://127.0.0.1:{network.server_address[1]}\n"
                f'exec {sys.executable} "$@"\n'
            )
            python.chmod(0o755)
            hosts[node] = {
                "ansible_connection": "local",
                "ansible_python_interpreter": str(python),
                "node_ip": NODE_IPS[node],
            }
        inventory = {
            "all": {
                "vars": {"ansible_become": False},
                "children": {
                    "k8s_cluster": {
                        "children": {
                            "control_plane": {"hosts": {"gpu-node-1": hosts["gpu-node-1"]}},
                            "workers": {"hosts": {n: hosts[n] for n in ("gpu-node-2", "gpu-node-3")}},
                        }
                    },
                    "gpu_nodes": {"children": {"control_plane": {}, "workers": {}}},
                },
            }
        }
        self.inventory = tmp / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump(inventory))

    def collect(self) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
        """One run; the files of the tarball it wrote (index.json parsed by the caller)."""
        out = self.tmp / "out"
        out.mkdir(exist_ok=True)
        for old in out.glob("*.tar.gz"):
            old.unlink()
        for network in self.networks.values():
            network.asked.clear()
        run = subprocess.run(
            [
                str(ROOT / ".venv" / "bin" / "ansible-playbook"),
                "-i",
                str(self.inventory),
                "playbooks/remediate/collect-diagnostics.yml",
                "-e",
                f"admin_kubeconfig={self.plane.admin_kubeconfig}",
                "-e",
                f"kubernetes_api_client_python={sys.executable}",
                "-e",
                f"diagnostics_dir={out}",
            ],
            cwd=ROOT,
            env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        files: dict[str, str] = {}
        for tarball in out.glob("diagnostics-*.tar.gz"):
            with tarfile.open(tarball) as tar:
                for member in tar.getmembers():
                    handle = tar.extractfile(member) if member.isfile() else None
                    if handle:
                        text = io.TextIOWrapper(handle, encoding="utf-8").read()
                        files[member.name.split("/", 1)[1]] = text
        return run, files


def pod(name: str) -> dict[str, Any]:
    node, _, ports = PODS[name]
    app = "llm-gateway" if "metrics" in ports else "vllm"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/name": app}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": app,
                    "image": f"registry.example/{app}:1",
                    "ports": [{"name": k, "containerPort": v} for k, v in ports.items()],
                }
            ],
        },
    }


GATEWAY_SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "llm-gateway", "namespace": NAMESPACE},
    "spec": {
        "type": "NodePort",
        "selector": {"app.kubernetes.io/name": "llm-gateway"},
        "ports": [{"name": "http", "port": 8000, "targetPort": "http", "nodePort": NODE_PORT}],
    },
}
SERVICES = f"/api/v1/namespaces/{NAMESPACE}/services"


@pytest.fixture(scope="module")
def site(
    kube_control_plane: real_kube.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    """The serving pods as the kubelets report them (bound, Running, their IPs) and the gateway's Service."""
    admin = kube_control_plane.admin
    # the namespace and its default ServiceAccount (no controller makes it here), unless a test made them
    for path, name in (
        ("/api/v1/namespaces", NAMESPACE),
        (f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", "default"),
    ):
        code, _ = admin.request("POST", path, {"metadata": {"name": name}})
        assert code in (201, 409), (path, code)
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    for name, (_, ip, _) in PODS.items():
        admin.ok("POST", pods, pod(name))
        status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        admin.ok("PATCH", f"{pods}/{name}/status", {"status": status}, "application/merge-patch+json")
    admin.ok("POST", SERVICES, GATEWAY_SERVICE)
    made = Site(kube_control_plane, tmp_path_factory.mktemp("diagnostics"))
    try:
        yield made
    finally:
        for network in made.networks.values():
            network.shutdown()
        for name in PODS:
            admin.request("DELETE", f"{pods}/{name}", {"gracePeriodSeconds": 0})
        admin.request("DELETE", f"{SERVICES}/llm-gateway")


def items(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {i["file"]: i for i in json.loads(files["index.json"])["items"]}


@pytest.fixture(scope="module")
def collected(site: Site) -> tuple[dict[str, str], dict[str, list[str]]]:
    """One run with every pod and the Service: the tarball's files, and what each node's network was asked."""
    run, files = site.collect()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return files, {node: list(network.asked) for node, network in site.networks.items()}


def test_each_pods_endpoints_are_asked_from_its_own_node(
    collected: tuple[dict[str, str], dict[str, list[str]]],
) -> None:
    files, asked = collected
    index = items(files)
    wanted = {"llm-gateway-5c9d7-x2k4p": ["dump_state", "metrics"]}
    for name, (node, _, _) in PODS.items():
        for endpoint in wanted.get(name, ["metrics", "health"]):
            item = index[f"{name}_{endpoint}.txt"]
            if node not in NODE_IPS:
                assert not item["ok"], item
                assert f"runs on node {node}, which is not in the inventory" in item["error"], item
                continue
            assert item["ok"] and item["node"] == node, item
            assert f"of {name}, asked on {node}" in files[f"http/{name}_{endpoint}.txt"]
    # every request for a pod went through its own node's host network, none through another's
    for node, urls in asked.items():
        for url in urls:
            host = urllib.parse.urlsplit(url).hostname
            owners = [n for n, ip, _ in PODS.values() if ip == host]
            assert owners in ([], [node]), f"{url} asked on {node}"


def test_the_gateways_nodeport_is_the_deployed_services(
    collected: tuple[dict[str, str], dict[str, list[str]]],
) -> None:
    """/health and /ready on the nodePort the Service has (the inventory sets no llm_gateway_node_port, and
    the role's default is another), on the control plane's address, as clients reach it."""
    files, _ = collected
    index = items(files)
    for path in ("health", "ready"):
        item = index[f"nodeport-{NODE_PORT}_{path}.txt"]
        assert item["ok"] and item["node"] == "gpu-node-1", item
        assert item["source"] == f"http://{NODE_IPS['gpu-node-1']}:{NODE_PORT}/{path}", item
        assert '"asked_on": "gpu-node-1"' in files[f"http/nodeport-{NODE_PORT}_{path}.txt"]


def test_no_nodeport_service_is_named_not_skipped(site: Site) -> None:
    admin = site.plane.admin
    admin.ok("DELETE", f"{SERVICES}/llm-gateway")
    try:
        run, files = site.collect()
    finally:
        admin.ok("POST", SERVICES, GATEWAY_SERVICE)
    assert run.returncode == 0, run.stdout[-3000:]
    index = items(files)
    for path in ("health", "ready"):
        item = index[f"nodeport_{path}.txt"]
        assert not item["ok"], item
        assert "no Service of type NodePort in namespace serving" in item["error"], item
        assert files[f"http/nodeport_{path}.txt"].startswith("ERROR: not collected:")
