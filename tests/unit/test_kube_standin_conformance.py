"""Conformance of the lab's Kubernetes API stand-in (tests/lab/kube/kube_standin) with the real API.

One server per module (python3 -m kube_standin.apiserver on 127.0.0.1, a PKI made here with openssl), judged
by the REAL kubectl 1.36.3 (tests/lab/kube/fetch_kubectl.py), by kubernetes.core's modules through
ansible-playbook, and by raw REST calls. Each test's docstring names the documented behaviour of the real API
it mirrors (kubernetes.io/docs/reference/using-api/api-concepts/ = "API Concepts"; .../access-authn-authz/ =
"Access")."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lab.upstream_manifests import UpstreamError, manifest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "lab" / "kube"))

from kube_standin.testing import ApiProcess, Client, FakeKubelet, make_pki  # noqa: E402

NODES = {
    "gpu-node-1": {
        "gpus": 4,
        "ip": "10.89.42.11",
        "labels": {"node-role.kubernetes.io/control-plane": ""},
        "taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
    },
    "gpu-node-2": {"gpus": 4, "ip": "10.89.42.12", "labels": {"gpu": "a100"}},
    "gpu-node-3": {"gpus": 4, "ip": "10.89.42.13", "labels": {"gpu": "a100"}},
}
# a node whose kubelet went silent: registered by the fixture, checked and removed by test_silent_node_...
SILENT = {"gpu-node-9": {"gpus": 4, "ip": "10.89.42.19", "heartbeat": False}}


class Lab:
    def __init__(self, tmp: Path, kubectl_bin: str) -> None:
        self.tmp = tmp
        self.pki = make_pki(
            tmp / "pki",
            {
                "admin": ("kubernetes-admin", ["system:masters"]),
                "alice": ("alice", ["oncall"]),
            },
        )
        self.api = ApiProcess(
            self.pki, tmp / "state.json", extra_args=["--allocate-node-cidrs", "--cluster-cidr=10.244.0.0/16"]
        )
        self.api.start()
        self.admin = Client(self.api, "admin")
        self.alice = Client(self.api, "alice")
        self.kubeconfigs = {u: self.api.kubeconfig(tmp / f"{u}.conf", u) for u in ("admin", "alice")}
        self.kubectl_bin = kubectl_bin
        self.kubelet = FakeKubelet(self.admin, {**NODES, **SILENT})
        self.kubelet.start()

    def kubectl(
        self,
        *args: str,
        user: str = "admin",
        check: bool = True,
        stdin: str | None = None,
        timeout: float = 30,
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfigs[user])}
        cmd = [self.kubectl_bin, f"--cache-dir={self.tmp / 'kcache'}", *args]
        proc = subprocess.run(cmd, env=env, input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def wait(self, what: Callable[[], Any], timeout: float = 10) -> Any:
        deadline = time.time() + timeout
        while True:
            got = what()
            if got:
                return got
            if time.time() > deadline:
                raise AssertionError("condition not reached in time")
            time.sleep(0.1)

    def close(self) -> None:
        self.kubelet.stop()
        self.api.stop()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make the test PKI")
    from fetch_kubectl import fetch

    try:
        kubectl_bin = str(fetch())
    except (OSError, subprocess.CalledProcessError, SystemExit) as exc:
        pytest.skip(f"real kubectl 1.36.3 unavailable (fetch_kubectl.py: {exc})")
    lab = Lab(tmp_path_factory.mktemp("kube"), kubectl_bin)
    yield lab
    lab.close()


def _deploy(
    name: str, ns: str = "default", replicas: int = 2, image: str = "busybox:1.36", **spec: Any
) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": image}], **spec},
            },
        },
    }


# --------------------------------------------------------------------------- discovery, errors, REST
# semantics


def test_discovery_version_health(lab: Lab) -> None:
    """API Concepts "Discovery API" (legacy /api, /apis, /apis/G/V resource lists; clients fall back from
    aggregated discovery), "/version", health endpoints "/livez" "/readyz" (Kubernetes API health endpoints).
    """
    out = lab.kubectl("version", "-o", "json").stdout
    assert json.loads(out)["serverVersion"]["gitVersion"] == "v1.36.3"
    res = lab.kubectl("api-resources", "--no-headers").stdout
    assert any(line.split()[0] == "deployments" and "apps/v1" in line for line in res.splitlines())
    assert any(line.startswith("pods ") and " po " in line for line in res.splitlines())
    doc = lab.admin.ok("GET", "/api/v1")
    pods = [r for r in doc["resources"] if r["name"] in ("pods", "pods/eviction", "pods/status")]
    assert {r["name"]: r["kind"] for r in pods} == {
        "pods": "Pod",
        "pods/eviction": "Eviction",
        "pods/status": "Pod",
    }
    assert lab.alice.get_raw("/readyz")[0] == 200
    # kubectl asks for OpenAPI v2 as protobuf first: a JSON-only server answers 406, never 500
    assert (
        lab.admin.get_raw(
            "/openapi/v2", headers={"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"}
        )[0]
        == 406
    )
    assert lab.admin.request("GET", "/openapi/v3")[1]["paths"]["apis/apps/v1"]["serverRelativeURL"]


def test_silent_node_goes_unknown_and_tainted(lab: Lab) -> None:
    """Node controller ("Nodes": node heartbeats, --node-monitor-grace-period): a node whose kubelet stopped
    renewing its Lease and Ready heartbeat gets Ready=Unknown (NodeStatusUnknown) and the
    node.kubernetes.io/unreachable NoSchedule/NoExecute taints ("Taints and Tolerations": taint-based
    evictions); kubectl shows it NotReady; nothing new is scheduled there."""

    def node() -> dict[str, Any]:
        return lab.admin.ok("GET", "/api/v1/nodes/gpu-node-9")

    lab.wait(lambda: len(node()["spec"].get("taints", [])) == 2)
    ready = next(c for c in node()["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("Unknown", "NodeStatusUnknown")
    taints = {(t["key"], t["effect"]) for t in node()["spec"]["taints"]}
    assert taints == {
        ("node.kubernetes.io/unreachable", "NoSchedule"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
    }
    assert "gpu-node-9   NotReady" in lab.kubectl("get", "nodes").stdout
    live = lab.admin.ok("GET", "/api/v1/nodes/gpu-node-2")
    assert next(c for c in live["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
    lab.kubectl("delete", "node", "gpu-node-9")
    del lab.kubelet.nodes["gpu-node-9"]


def test_error_status_shapes(lab: Lab) -> None:
    """API conventions "Response Status Kind": NotFound 404, AlreadyExists 409, Invalid 422 with
    details.causes; API Concepts "Resource versions": an update with a stale metadata.resourceVersion is a 409
    Conflict; a namespaced object in a namespace that does not exist is NotFound, a list there is empty."""
    code, body = lab.admin.request("GET", "/api/v1/namespaces/default/configmaps/nope")
    assert (code, body["kind"], body["reason"], body["details"]["name"]) == (
        404,
        "Status",
        "NotFound",
        "nope",
    )
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1"}, "data": {"a": "1"}}
    first = lab.admin.ok("POST", "/api/v1/namespaces/default/configmaps", cm)
    assert first["metadata"]["uid"] and first["metadata"]["creationTimestamp"]
    code, body = lab.admin.request("POST", "/api/v1/namespaces/default/configmaps", cm)
    assert (code, body["reason"]) == (409, "AlreadyExists")
    code, body = lab.admin.request(
        "POST", "/api/v1/namespaces/default/configmaps", {**cm, "metadata": {"name": "Bad_Name"}}
    )
    assert (code, body["reason"], body["details"]["causes"][0]["field"]) == (422, "Invalid", "metadata.name")
    updated = lab.admin.ok("PUT", "/api/v1/namespaces/default/configmaps/c1", {**first, "data": {"a": "2"}})
    assert int(updated["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    code, body = lab.admin.request(
        "PUT", "/api/v1/namespaces/default/configmaps/c1", {**first, "data": {"a": "3"}}
    )
    assert (code, body["reason"]) == (409, "Conflict") and "the object has been modified" in body["message"]
    code, body = lab.admin.request("POST", "/api/v1/namespaces/ghost/configmaps", cm)
    assert (code, body["reason"], body["details"]["kind"]) == (404, "NotFound", "namespaces")
    assert lab.admin.ok("GET", "/api/v1/namespaces/ghost/configmaps")["items"] == []
    # a no-op update does not bump resourceVersion (API Concepts "Resource versions")
    again = lab.admin.ok("PUT", "/api/v1/namespaces/default/configmaps/c1", updated)
    assert again["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]


def test_patch_types_status_and_generation(lab: Lab) -> None:
    """API Concepts "Patch" / "Update a container image using kubectl patch" (JSON patch, merge patch,
    strategic merge patch merging containers/env by their patchMergeKey `name`), "Subresources" (status only
    through /status; the main endpoint ignores status), object metadata.generation bumped on spec changes
    only."""
    base = "/apis/apps/v1/namespaces/default/deployments"
    dep = _deploy("patchy", replicas=0)
    dep["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    created = lab.admin.ok("POST", base, dep)
    assert created["metadata"]["generation"] == 1
    smp = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "main", "env": [{"name": "B", "value": "2"}]},
                        {"name": "side", "image": "pause:3.10"},
                    ]
                }
            }
        }
    }
    out = lab.admin.ok("PATCH", f"{base}/patchy", smp, "application/strategic-merge-patch+json")
    ctrs = out["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in ctrs] == ["main", "side"]
    assert ctrs[0]["image"] == "busybox:1.36" and [e["name"] for e in ctrs[0]["env"]] == ["A", "B"]
    assert out["metadata"]["generation"] == 2
    out = lab.admin.ok(
        "PATCH", f"{base}/patchy", {"metadata": {"labels": {"x": "y"}}}, "application/merge-patch+json"
    )
    assert out["metadata"]["generation"] == 2 and out["metadata"]["labels"] == {"x": "y"}
    out = lab.admin.ok(
        "PATCH",
        f"{base}/patchy",
        [
            {"op": "replace", "path": "/spec/replicas", "value": 0},
            {"op": "remove", "path": "/spec/template/spec/containers/1"},
        ],
        "application/json-patch+json",
    )
    assert len(out["spec"]["template"]["spec"]["containers"]) == 1
    out = lab.admin.ok("PATCH", f"{base}/patchy", {"status": {"replicas": 7}}, "application/merge-patch+json")
    assert out.get("status", {}).get("replicas") != 7
    out = lab.admin.ok(
        "PATCH",
        f"{base}/patchy/status",
        {"status": {"observedGeneration": 99}},
        "application/merge-patch+json",
    )
    assert out["status"]["observedGeneration"] == 99
    lab.admin.ok("DELETE", f"{base}/patchy")


def test_label_and_field_selectors(lab: Lab) -> None:
    """Concepts "Labels and Selectors" (equality- and set-based) and "Field Selectors" (metadata.name,
    spec.nodeName, status.phase, spec.unschedulable; an unsupported field is a 400 BadRequest)."""
    for name, tier in (("sel-a", "web"), ("sel-b", "db"), ("sel-c", "web")):
        lab.admin.ok(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            {"metadata": {"name": name, "labels": {"tier": tier, "sel": "1"}}},
        )

    def names(query: str) -> list[str]:
        items = lab.admin.ok("GET", f"/api/v1/namespaces/default/configmaps?{query}")["items"]
        return sorted(i["metadata"]["name"] for i in items)

    assert names("labelSelector=tier%3Dweb") == ["sel-a", "sel-c"]
    assert names("labelSelector=sel,tier+notin+(web)") == ["sel-b"]
    assert names("fieldSelector=metadata.name%3Dsel-b") == ["sel-b"]
    lab.kubectl("cordon", "gpu-node-3")
    nodes = lab.admin.ok("GET", "/api/v1/nodes?fieldSelector=spec.unschedulable%3Dfalse")["items"]
    lab.kubectl("uncordon", "gpu-node-3")
    assert {"gpu-node-1", "gpu-node-2"} <= {n["metadata"]["name"] for n in nodes}
    assert "gpu-node-3" not in {n["metadata"]["name"] for n in nodes}
    code, body = lab.admin.request("GET", "/api/v1/namespaces/default/configmaps?fieldSelector=data.a%3D1")
    assert (code, body["reason"]) == (400, "BadRequest")
    # deletecollection (API Concepts "Collections"): DELETE on the collection with a selector
    out = lab.admin.ok("DELETE", "/api/v1/namespaces/default/configmaps?labelSelector=tier%3Dweb")
    assert sorted(i["metadata"]["name"] for i in out["items"]) == ["sel-a", "sel-c"]
    assert names("labelSelector=sel") == ["sel-b"]


# --------------------------------------------------------------------------- kubectl


def test_kubectl_get_describe_tables(lab: Lab) -> None:
    """kubectl get asks for server-side printed Tables (API Concepts "Receiving resources as Tables");
    describe reads the typed object; -o json gets the objects themselves."""
    out = lab.kubectl("get", "nodes").stdout
    assert out.split("\n")[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines()[1:]}
    assert rows["gpu-node-1"] == ["Ready", "control-plane"] and rows["gpu-node-2"] == ["Ready", "<none>"]
    items = json.loads(lab.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert {n["status"]["allocatable"]["nvidia.com/gpu"] for n in items} == {"4"}
    desc = lab.kubectl("describe", "node", "gpu-node-2").stdout
    assert "nvidia.com/gpu:  4" in desc and "Ready" in desc
    # node IPAM (kube-controller-manager --allocate-node-cidrs --cluster-cidr): one /24 per node
    cidrs = [n["spec"].get("podCIDR") for n in items]
    assert len(set(cidrs)) == len(cidrs) and all(
        c.startswith("10.244.") and c.endswith(".0/24") for c in cidrs
    )


def test_kubectl_create_apply_server_side_delete(lab: Lab) -> None:
    """kubectl create (typed objects sent as protobuf, decoded), client-side apply (last-applied annotation,
    second run "unchanged"), server-side apply (API Concepts "Server-Side Apply": fieldManager required, no-op
    apply keeps resourceVersion, a field the manager stops applying is removed), delete."""
    lab.kubectl("create", "namespace", "apply-test")
    manifest = textwrap.dedent("""\
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: app, namespace: apply-test}
        data: {a: "1", b: "2"}
        """)
    assert "configmap/app created" in lab.kubectl("apply", "-f", "-", stdin=manifest).stdout
    assert "configmap/app unchanged" in lab.kubectl("apply", "-f", "-", stdin=manifest).stdout
    assert (
        "configmap/app configured"
        in lab.kubectl("apply", "-f", "-", stdin=manifest.replace('"2"', '"3"')).stdout
    )
    ssa = manifest.replace("name: app", "name: ssa")
    assert "serverside-applied" in lab.kubectl("apply", "--server-side", "-f", "-", stdin=ssa).stdout
    rv1 = lab.admin.ok("GET", "/api/v1/namespaces/apply-test/configmaps/ssa")["metadata"]["resourceVersion"]
    lab.kubectl("apply", "--server-side", "-f", "-", stdin=ssa)
    cm = lab.admin.ok("GET", "/api/v1/namespaces/apply-test/configmaps/ssa")
    assert cm["metadata"]["resourceVersion"] == rv1
    lab.kubectl("apply", "--server-side", "-f", "-", stdin=ssa.replace(', b: "2"', ""))
    assert lab.admin.ok("GET", "/api/v1/namespaces/apply-test/configmaps/ssa")["data"] == {"a": "1"}
    code, body = lab.admin.request(
        "PATCH", "/api/v1/namespaces/apply-test/configmaps/ssa", {"data": {}}, "application/apply-patch+yaml"
    )
    assert code == 400 and "fieldManager" in body["message"]
    assert 'configmap "app" deleted' in lab.kubectl("delete", "configmap", "app", "-n", "apply-test").stdout
    assert lab.kubectl("get", "configmap", "app", "-n", "apply-test", check=False).returncode == 1


def test_deployment_rollout_and_wait(lab: Lab) -> None:
    """Deployments (ReplicaSet per pod template, rolling update, status replicas/updated/ready/available,
    observedGeneration) as `kubectl rollout status` reads them; `kubectl wait --for=condition=Ready` on a Pod
    and --for=delete use watches (API Concepts "Efficient detection of changes")."""
    lab.kubectl("create", "deployment", "web", "--image=nginx:1.27", "--replicas=2")
    lab.kubectl("rollout", "status", "deployment/web", "--timeout=20s")
    lab.kubectl("wait", "--for=condition=Ready", "pod", "-l", "app=web", "--timeout=20s")
    lab.kubectl("set", "image", "deployment/web", "nginx=nginx:1.28")
    lab.kubectl("rollout", "status", "deployment/web", "--timeout=20s")
    rss = lab.admin.ok("GET", "/apis/apps/v1/namespaces/default/replicasets?labelSelector=app%3Dweb")["items"]
    assert sorted(rs["spec"]["replicas"] for rs in rss) == [0, 2]
    pods = lab.admin.ok("GET", "/api/v1/namespaces/default/pods?labelSelector=app%3Dweb")["items"]
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {"nginx:1.28"} and len(pods) == 2
    dep = lab.admin.ok("GET", "/apis/apps/v1/namespaces/default/deployments/web")
    assert dep["status"]["observedGeneration"] == dep["metadata"]["generation"] == 2
    assert dep["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
    # garbage collection by ownerReferences (background propagation), awaited with kubectl wait --for=delete
    lab.kubectl("delete", "deployment", "web")
    lab.kubectl("wait", "--for=delete", "pod", "-l", "app=web", "--timeout=20s")
    assert (
        lab.admin.ok("GET", "/apis/apps/v1/namespaces/default/replicasets?labelSelector=app%3Dweb")["items"]
        == []
    )


def test_service_endpoints(lab: Lab) -> None:
    """Concepts "Service" and "EndpointSlices": the controllers list the ready pods behind a Service's
    selector (named target ports resolved from the pods); default/kubernetes points at the API server."""
    lab.kubectl("create", "deployment", "svcd", "--image=nginx:1.27", "--replicas=2", "--port=80")
    lab.kubectl("expose", "deployment", "svcd", "--port=8080", "--target-port=80")
    lab.kubectl("rollout", "status", "deployment/svcd", "--timeout=20s")

    def ready_ips() -> list[str]:
        eps = lab.admin.ok(
            "GET",
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
            "?labelSelector=kubernetes.io/service-name%3Dsvcd",
        )["items"]
        return [a for s in eps for e in s["endpoints"] if e["conditions"]["ready"] for a in e["addresses"]]

    ips = lab.wait(lambda: len(ready_ips()) == 2 and ready_ips())
    pods = lab.admin.ok("GET", "/api/v1/namespaces/default/pods?labelSelector=app%3Dsvcd")["items"]
    assert sorted(ips) == sorted(p["status"]["podIP"] for p in pods)
    ep = lab.admin.ok("GET", "/api/v1/namespaces/default/endpoints/svcd")
    assert ep["subsets"][0]["ports"] == [{"port": 80, "protocol": "TCP"}]
    api_ep = lab.admin.ok("GET", "/api/v1/namespaces/default/endpoints/kubernetes")
    assert api_ep["subsets"][0]["ports"][0]["port"] == lab.api.port
    lab.kubectl("delete", "deployment,service", "svcd")


def test_cascading_deletion(lab: Lab) -> None:
    """Concepts "Garbage Collection" / "Use Cascading Deletion": foreground deletion keeps the owner (with the
    foregroundDeletion finalizer) until its dependents are gone; orphan deletion leaves the dependents, their
    ownerReferences removed."""
    for name in ("fg", "orphan"):
        lab.admin.ok("POST", "/apis/apps/v1/namespaces/default/deployments", _deploy(name, replicas=1))
        lab.kubectl("rollout", "status", f"deployment/{name}", "--timeout=20s")
    lab.kubectl("delete", "deployment", "fg", "--cascade=foreground", "--timeout=20s")
    assert lab.admin.request("GET", "/apis/apps/v1/namespaces/default/deployments/fg")[0] == 404
    assert lab.admin.ok("GET", "/api/v1/namespaces/default/pods?labelSelector=app%3Dfg")["items"] == []
    lab.kubectl("delete", "deployment", "orphan", "--cascade=orphan")
    rss = lab.admin.ok("GET", "/apis/apps/v1/namespaces/default/replicasets?labelSelector=app%3Dorphan")[
        "items"
    ]
    assert len(rss) == 1 and not rss[0]["metadata"].get("ownerReferences")
    time.sleep(1.5)  # a garbage collector pass or more
    assert (
        len(lab.admin.ok("GET", "/api/v1/namespaces/default/pods?labelSelector=app%3Dorphan")["items"]) == 1
    )
    lab.kubectl("delete", "replicaset", "-l", "app=orphan")


def test_watch_stream(lab: Lab) -> None:
    """API Concepts "Efficient detection of changes": ?watch=1 from a resourceVersion streams ADDED / MODIFIED
    / DELETED events, newline-delimited JSON, ending at timeoutSeconds."""
    rv = lab.admin.ok("GET", "/api/v1/namespaces/default/configmaps")["metadata"]["resourceVersion"]
    lab.admin.ok("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "w1"}})
    lab.admin.ok(
        "PATCH",
        "/api/v1/namespaces/default/configmaps/w1",
        {"data": {"k": "v"}},
        "application/merge-patch+json",
    )
    lab.admin.ok("DELETE", "/api/v1/namespaces/default/configmaps/w1")
    code, raw = lab.admin.get_raw(
        f"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}"
        "&timeoutSeconds=1&fieldSelector=metadata.name%3Dw1"
    )
    events = [json.loads(line) for line in raw.decode().splitlines()]
    assert code == 200 and [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[1]["object"]["kind"] == "ConfigMap" and events[1]["object"]["data"] == {"k": "v"}


def test_statefulset_and_daemonset_placement(lab: Lab) -> None:
    """StatefulSets: ordered pods NAME-0..N-1 (OrderedReady); DaemonSets: one pod per eligible node, honouring
    nodeSelector and taints (the control-plane NoSchedule taint needs a toleration) (Concepts, Workloads)."""
    sts = _deploy("db", replicas=3)
    sts["kind"] = "StatefulSet"
    sts["spec"]["serviceName"] = "db"
    lab.admin.ok("POST", "/apis/apps/v1/namespaces/default/statefulsets", sts)
    lab.kubectl("rollout", "status", "statefulset/db", "--timeout=20s")
    pods = lab.admin.ok("GET", "/api/v1/namespaces/default/pods?labelSelector=app%3Ddb")["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["db-0", "db-1", "db-2"]
    for name, extra in (
        ("ds-plain", {}),
        (
            "ds-all",
            {
                "tolerations": [
                    {
                        "key": "node-role.kubernetes.io/control-plane",
                        "operator": "Exists",
                        "effect": "NoSchedule",
                    }
                ]
            },
        ),
        ("ds-sel", {"nodeSelector": {"kubernetes.io/hostname": "gpu-node-3"}}),
    ):
        ds = _deploy(name, **extra)
        ds["kind"] = "DaemonSet"
        del ds["spec"]["replicas"]
        lab.admin.ok("POST", "/apis/apps/v1/namespaces/default/daemonsets", ds)
    for name, want in (
        ("ds-plain", {"gpu-node-2", "gpu-node-3"}),
        ("ds-all", set(NODES)),
        ("ds-sel", {"gpu-node-3"}),
    ):
        lab.kubectl("rollout", "status", f"daemonset/{name}", "--timeout=20s")
        pods = lab.admin.ok("GET", f"/api/v1/namespaces/default/pods?labelSelector=app%3D{name}")["items"]
        assert {p["spec"]["nodeName"] for p in pods} == want, name
        ds = lab.admin.ok("GET", f"/apis/apps/v1/namespaces/default/daemonsets/{name}")["status"]
        assert ds["desiredNumberScheduled"] == ds["numberReady"] == ds["updatedNumberScheduled"] == len(want)
        lab.kubectl("delete", "daemonset", name)
    lab.kubectl("delete", "statefulset", "db")


def test_scheduler_counts_gpus(lab: Lab) -> None:
    """kube-scheduler "Resource Management for Pods and Containers" / device plugins: extended resources such
    as nvidia.com/gpu are requested in limits and never overcommitted; an unschedulable Pod stays Pending with
    PodScheduled=False reason Unschedulable and a FailedScheduling event."""
    lab.kubectl("create", "namespace", "gpu")
    for i in range(3):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"train-{i}", "namespace": "gpu"},
            "spec": {
                "containers": [
                    {"name": "t", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": 4}}}
                ]
            },
        }
        lab.admin.ok("POST", "/api/v1/namespaces/gpu/pods", pod)
    lab.kubectl("wait", "--for=condition=Ready", "pod/train-0", "pod/train-1", "-n", "gpu", "--timeout=20s")
    bound = {
        lab.admin.ok("GET", f"/api/v1/namespaces/gpu/pods/train-{i}")["spec"]["nodeName"] for i in (0, 1)
    }
    assert bound == {"gpu-node-2", "gpu-node-3"}
    pending = lab.wait(
        lambda: [
            c
            for c in lab.admin.ok("GET", "/api/v1/namespaces/gpu/pods/train-2")["status"].get(
                "conditions", []
            )
            if c["type"] == "PodScheduled" and c["status"] == "False"
        ]
    )
    assert pending[0]["reason"] == "Unschedulable" and "Insufficient nvidia.com/gpu" in pending[0]["message"]
    events = lab.kubectl("get", "events", "-n", "gpu", "--field-selector", "reason=FailedScheduling").stdout
    assert "train-2" in events
    lab.kubectl("delete", "namespace", "gpu", "--timeout=20s")


def test_cordon_drain_with_pdb(lab: Lab) -> None:
    """Task "Safely Drain a Node": cordon sets spec.unschedulable (node shows SchedulingDisabled); drain
    evicts through pods/eviction, which answers 429 TooManyRequests while a PodDisruptionBudget allows no
    disruption ("API-initiated eviction"); uncordon clears it."""
    lab.kubectl("create", "namespace", "drain")
    dep = _deploy("guarded", ns="drain", replicas=1, nodeSelector={"kubernetes.io/hostname": "gpu-node-3"})
    lab.admin.ok("POST", "/apis/apps/v1/namespaces/drain/deployments", dep)
    lab.kubectl("create", "pdb", "guarded", "-n", "drain", "--selector=app=guarded", "--min-available=1")
    lab.kubectl("rollout", "status", "deployment/guarded", "-n", "drain", "--timeout=20s")
    pod = lab.admin.ok("GET", "/api/v1/namespaces/drain/pods")["items"][0]["metadata"]["name"]
    lab.wait(
        lambda: (
            lab.admin.ok("GET", "/apis/policy/v1/namespaces/drain/poddisruptionbudgets/guarded")
            .get("status", {})
            .get("currentHealthy")
            == 1
        )
    )
    code, body = lab.admin.request(
        "POST",
        f"/api/v1/namespaces/drain/pods/{pod}/eviction",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": "drain"}},
    )
    assert (code, body["reason"]) == (429, "TooManyRequests") and "disruption budget" in body["message"]
    out = lab.kubectl("drain", "gpu-node-3", "--ignore-daemonsets", "--timeout=3s", check=False, timeout=30)
    assert (
        out.returncode != 0
        and "Cannot evict pod as it would violate the pod's disruption budget" in out.stderr
    )
    assert "SchedulingDisabled" in lab.kubectl("get", "node", "gpu-node-3").stdout
    lab.kubectl("delete", "pdb", "guarded", "-n", "drain")
    out = lab.kubectl("drain", "gpu-node-3", "--ignore-daemonsets", "--timeout=15s", timeout=30)
    assert f"pod/{pod} evicted" in out.stdout and "node/gpu-node-3 drained" in out.stdout
    lab.kubectl("uncordon", "gpu-node-3")
    node = lab.admin.ok("GET", "/api/v1/nodes/gpu-node-3")
    assert not node["spec"].get("unschedulable")
    lab.kubectl("delete", "namespace", "drain", "--timeout=20s")


def test_pod_log_and_events(lab: Lab) -> None:
    """pods/NAME/log returns plain text ("kubectl logs"); events (core/v1 and events.k8s.io/v1) record what
    the controllers did; leases (coordination.k8s.io/v1) are plain objects."""
    lab.kubectl("run", "logme", "--image=busybox:1.36", "--restart=Never", check=False)
    if lab.kubectl("get", "pod", "logme", check=False).returncode != 0:
        lab.admin.ok(
            "POST",
            "/api/v1/namespaces/default/pods",
            {
                "metadata": {"name": "logme"},
                "spec": {"containers": [{"name": "logme", "image": "busybox:1.36"}]},
            },
        )
    lab.kubectl("wait", "--for=condition=Ready", "pod/logme", "--timeout=20s")
    assert "started on node" in lab.kubectl("logs", "logme").stdout
    assert "Successfully assigned default/logme" in lab.kubectl("get", "events").stdout
    assert lab.admin.ok("GET", "/apis/events.k8s.io/v1/events")["kind"] == "EventList"
    lease = {
        "metadata": {"name": "on-call-lock"},
        "spec": {"holderIdentity": "alice", "leaseDurationSeconds": 40},
    }
    lab.admin.ok("POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases", lease)
    lab.kubectl("delete", "pod", "logme")


# --------------------------------------------------------------------------- auth


def test_rbac_least_privilege_and_tokens(lab: Lab) -> None:
    """Access "Using RBAC Authorization" (Role/RoleBinding grant verbs on resources, resourceNames and
    subresources; everything else is 403 Forbidden; "Privilege escalation prevention": roles and bindings
    grant no more than their author holds), "Authenticating": X509 client certs (CN user, O groups),
    ServiceAccount tokens from the TokenRequest API, bootstrap tokens; an invalid bearer token is 401."""
    code, body = lab.alice.request("GET", "/api/v1/namespaces/default/pods")
    assert code == 403 and body["reason"] == "Forbidden" and 'User "alice"' in body["message"]
    lab.kubectl("create", "role", "oncall", "--verb=get,list,watch", "--resource=pods,pods/log")
    lab.kubectl("create", "rolebinding", "oncall", "--role=oncall", "--group=oncall")
    assert lab.alice.request("GET", "/api/v1/namespaces/default/pods")[0] == 200
    assert lab.alice.request("GET", "/api/v1/namespaces/kube-system/pods")[0] == 403
    assert lab.alice.request("DELETE", "/api/v1/namespaces/default/pods/x")[0] == 403
    assert lab.kubectl("auth", "can-i", "delete", "pods", user="alice", check=False).stdout.strip() == "no"
    assert lab.kubectl("auth", "can-i", "list", "pods", user="alice").stdout.strip() == "yes"
    # escalation prevention: holding create on roles/rolebindings is not enough to grant more than one holds
    lab.kubectl("create", "role", "rbac-writer", "--verb=create", "--resource=roles,rolebindings")
    lab.kubectl("create", "rolebinding", "rbac-writer", "--role=rbac-writer", "--user=alice")
    role: dict[str, Any] = {
        "metadata": {"name": "more"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}],
    }
    code, body = lab.alice.request(
        "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles", role
    )
    assert code == 403 and "attempting to grant RBAC permissions not currently held" in body["message"]
    role["rules"][0]["verbs"] = ["get"]
    assert (
        lab.alice.request("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles", role)[0]
        == 201
    )
    binding = {
        "metadata": {"name": "b"},
        "subjects": [{"kind": "User", "name": "bob"}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
    }
    path = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings"
    assert lab.alice.request("POST", path, binding)[0] == 403
    binding["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "more"}
    assert lab.alice.request("POST", path, binding)[0] == 201
    lab.kubectl("create", "serviceaccount", "agent")
    lab.kubectl("create", "rolebinding", "agent", "--clusterrole=view", "--serviceaccount=default:agent")
    token = lab.kubectl("create", "token", "agent").stdout.strip()
    sa = Client(lab.api, None, token)
    assert sa.request("GET", "/apis/apps/v1/namespaces/default/deployments")[0] == 200
    assert sa.request("DELETE", "/apis/apps/v1/namespaces/default/deployments/x")[0] == 403
    who = sa.ok("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", {})["status"]["userInfo"]
    assert who["username"] == "system:serviceaccount:default:agent"
    assert Client(lab.api, None, "x" * 40).request("GET", "/api/v1/pods")[0] == 401
    lab.admin.ok(
        "POST",
        "/api/v1/namespaces/kube-system/secrets",
        {
            "metadata": {"name": "bootstrap-token-abcdef"},
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {
                "token-id": "abcdef",
                "token-secret": "0123456789abcdef",
                "usage-bootstrap-authentication": "true",
            },
        },
    )
    boot = Client(lab.api, None, "abcdef.0123456789abcdef")
    info = boot.ok("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", {})["status"]["userInfo"]
    assert info["username"] == "system:bootstrap:abcdef" and "system:bootstrappers" in info["groups"]
    # the CSR API as kubeadm's TLS bootstrap and `kubectl certificate approve` use it (typed client: protobuf)
    csr_pem = subprocess.run(
        [
            "openssl",
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "/dev/null",
            "-subj",
            "/O=system:nodes/CN=system:node:gpu-node-5",
        ],
        capture_output=True,
        check=True,
    ).stdout
    csr: dict[str, Any] = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": "node-csr-test"},
        "spec": {
            "request": base64.b64encode(csr_pem).decode(),
            "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"],
        },
    }
    path = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
    assert boot.request("POST", path, csr)[0] == 403
    lab.kubectl(
        "create",
        "clusterrolebinding",
        "kubeadm:kubelet-bootstrap",
        "--clusterrole=system:node-bootstrapper",
        "--group=system:bootstrappers",
    )
    boot.ok("POST", path, csr)
    lab.kubectl("certificate", "approve", "node-csr-test")
    got = lab.admin.ok("GET", "/apis/certificates.k8s.io/v1/certificatesigningrequests/node-csr-test")
    assert got["spec"]["request"] == csr["spec"]["request"] and got["spec"]["usages"] == csr["spec"]["usages"]
    assert [(c["type"], c["status"]) for c in got["status"]["conditions"]] == [("Approved", "True")]
    anon = Client(lab.api, None)
    assert anon.get_raw("/version")[0] == 200 and anon.request("GET", "/api/v1/pods")[0] == 403


# --------------------------------------------------------------------------- CRDs and upstream manifests


def test_crd_adds_resources(lab: Lab) -> None:
    """ "Extend the Kubernetes API with CustomResourceDefinitions": a CRD's group/version/resource appears in
    discovery; custom objects take JSON/merge patches; strategic merge patch is 415 for them."""
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.lab.example.com"},
        "spec": {
            "group": "lab.example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wg"]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                    "subresources": {"status": {}},
                }
            ],
        },
    }
    lab.admin.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    lab.kubectl("wait", "--for=condition=Established", "crd/widgets.lab.example.com", "--timeout=10s")
    manifest = "apiVersion: lab.example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 1}\n"
    lab.kubectl("apply", "-f", "-", stdin=manifest)
    assert "unchanged" in lab.kubectl("apply", "-f", "-", stdin=manifest).stdout
    assert "w1" in lab.kubectl("get", "wg").stdout
    code, _ = lab.admin.request(
        "PATCH",
        "/apis/lab.example.com/v1/namespaces/default/widgets/w1",
        {"spec": {"size": 2}},
        "application/strategic-merge-patch+json",
    )
    assert code == 415
    lab.kubectl("delete", "crd", "widgets.lab.example.com")
    assert lab.kubectl("get", "widgets.lab.example.com", check=False).returncode != 0
    # deleting the definition deletes its objects: a re-created CRD starts empty
    lab.admin.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert lab.admin.request("GET", "/apis/lab.example.com/v1/namespaces/default/widgets/w1")[0] == 404


def test_upstream_manifests_apply(lab: Lab) -> None:
    """Every object of the pinned Calico, NVIDIA device plugin and DCGM exporter manifests applies (CRDs
    first, as kubectl orders them) and a second apply is unchanged; the DaemonSets get their pods."""
    try:
        files = [
            manifest("calico/v3.32.1/calico.yaml"),
            manifest("k8s-device-plugin/v0.20.0/nvidia-device-plugin.yml"),
            manifest("dcgm-exporter/4.5.3-4.8.2/dcgm-exporter.yaml"),
        ]
    except UpstreamError as error:
        pytest.skip(str(error))

    def versions(f: Path) -> dict[str, str]:
        doc = json.loads(lab.kubectl("get", "-f", str(f), "-o", "json", timeout=60).stdout)
        items = doc.get("items", [doc])
        # controllers keep writing the status of workloads and PDBs: for those compare the generation
        live = ("PodDisruptionBudget", "DaemonSet", "Deployment")
        return {
            f"{i['kind']}/{i['metadata']['name']}": str(i["metadata"].get("generation"))
            if i["kind"] in live
            else i["metadata"]["resourceVersion"]
            for i in items
        }

    for f in files:
        lab.kubectl("apply", "-f", str(f), timeout=60)
        before = versions(f)
        again = lab.kubectl("apply", "-f", str(f), timeout=60).stdout.splitlines()
        # kubectl itself reports "configured" for a PDB (its selector's patchStrategy is replace) and for a
        # CRD
        # whose manifest carries a status stanza: a patch is sent, the server changes nothing
        changed = [line for line in again if not line.endswith(" unchanged")]
        assert all(
            line.startswith(("poddisruptionbudget", "customresourcedefinition")) for line in changed
        ), changed
        assert len(changed) <= 2 and versions(f) == before
    assert "ippools" in lab.kubectl("api-resources", "--api-group=crd.projectcalico.org").stdout
    # Priority admission: priorityClassName system-node-critical (a built-in class) resolves to its value
    calico = lab.admin.ok("GET", "/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Dcalico-node")
    assert calico["items"] and {p["spec"]["priority"] for p in calico["items"]} == {2000001000}
    lab.kubectl("rollout", "status", "daemonset/calico-node", "-n", "kube-system", "--timeout=30s")
    lab.kubectl(
        "rollout", "status", "daemonset/nvidia-device-plugin-daemonset", "-n", "kube-system", "--timeout=30s"
    )


# --------------------------------------------------------------------------- kubernetes.core through Ansible

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  module_defaults:
    group/kubernetes.core.k8s: {kubeconfig: "KUBECONFIG"}
  vars:
    deploy:
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: api, namespace: ans}
      spec:
        replicas: 2
        selector: {matchLabels: {app: api}}
        template:
          metadata: {labels: {app: api}}
          spec: {containers: [{name: c, image: "busybox:1.36", env: [{name: A, value: "1"}]}]}
  tasks:
    - kubernetes.core.k8s: {definition: {apiVersion: v1, kind: Namespace, metadata: {name: ans}}}
      register: ns1
    - kubernetes.core.k8s: {definition: {apiVersion: v1, kind: Namespace, metadata: {name: ans}}}
      register: ns2
    - kubernetes.core.k8s: {apply: true, wait: true, wait_sleep: 1, wait_timeout: 30, definition: "{{ x }}"}
      vars: {x: "{{ deploy }}"}
      register: d1
    - kubernetes.core.k8s: {apply: true, definition: "{{ deploy }}"}
      register: d2
    - kubernetes.core.k8s:
        apply: true
        definition: "{{ deploy | combine({'spec': {'replicas': 3}}, recursive=true) }}"
      check_mode: true
      register: d3
    - kubernetes.core.k8s:
        wait: true
        wait_sleep: 1
        wait_timeout: 30
        definition:
          apiVersion: apps/v1
          kind: DaemonSet
          metadata: {name: agent, namespace: ans}
          spec:
            selector: {matchLabels: {app: agent}}
            template:
              metadata: {labels: {app: agent}}
              spec: {containers: [{name: c, image: "busybox:1.36"}]}
      register: ds
    - kubernetes.core.k8s_info: {kind: Pod, namespace: ans, label_selectors: ["app=api"]}
      register: by_label
    - kubernetes.core.k8s_info:
        kind: Pod
        namespace: ans
        field_selectors: ["spec.nodeName=gpu-node-2", "status.phase=Running"]
      register: by_field
    - kubernetes.core.k8s_drain: {name: gpu-node-2, state: cordon}
      register: cordon
    - kubernetes.core.k8s_drain:
        name: gpu-node-2
        state: drain
        delete_options: {ignore_daemonsets: true, wait_timeout: 20, wait_sleep: 1}
      register: drain
    - kubernetes.core.k8s_drain: {name: gpu-node-2, state: uncordon}
      register: uncordon
    - kubernetes.core.k8s_drain: {name: no-such-node, state: cordon}
      register: missing
      ignore_errors: true
    - ansible.builtin.assert:
        that:
          - ns1 is changed and ns2 is not changed
          - d1 is changed and d2 is not changed and d3 is changed
          - d1.result.status.availableReplicas == 2
          - ds is changed and ds.result.status.numberReady == 2
          - by_label.resources | length == 2
          - by_field.resources | map(attribute='spec.nodeName') | unique == ['gpu-node-2']
          - cordon is changed and drain is changed and uncordon is changed
          - missing is failed and 'not found' in missing.msg
"""


def test_kubernetes_core_modules(lab: Lab) -> None:
    """kubernetes.core (k8s create/apply idempotence and check mode, wait: on Deployment and DaemonSet status,
    k8s_info label/field selectors, k8s_drain cordon/drain/uncordon, a missing Node reported) through the
    `kubernetes` Python client: discovery, GET/POST/PATCH, list kinds, eviction as the real API serves them.
    """
    play = lab.tmp / "play.yml"
    play.write_text(PLAYBOOK.replace("KUBECONFIG", str(lab.kubeconfigs["admin"])))
    exe = Path(sys.executable).parent / "ansible-playbook"
    cfg = lab.tmp / "ansible.cfg"
    cfg.write_text("[defaults]\nstdout_callback = default\n")
    # TMPDIR: the kubernetes client's discovery cache (k8srcp-*.json) stays in the test's folder
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_CONFIG": str(cfg), "TMPDIR": str(lab.tmp)}
    proc = subprocess.run(
        [
            str(exe),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(play),
        ],
        cwd=lab.tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# --------------------------------------------------------------------------- persistence (last: restarts)


def test_state_survives_restart(lab: Lab) -> None:
    """etcd keeps the cluster across API server restarts; the stand-in's --state-file does (atomic writes)."""
    lab.admin.ok(
        "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "persist"}, "data": {"a": "1"}}
    )
    before = lab.admin.ok("GET", "/api/v1/namespaces/default/configmaps/persist")
    lab.api.stop()
    assert lab.api.proc is not None and lab.api.proc.returncode == 0
    lab.api.start()
    after = lab.admin.ok("GET", "/api/v1/namespaces/default/configmaps/persist")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    nxt = lab.admin.ok(
        "PATCH",
        "/api/v1/namespaces/default/configmaps/persist",
        {"data": {"a": "2"}},
        "application/merge-patch+json",
    )
    assert int(nxt["metadata"]["resourceVersion"]) > int(after["metadata"]["resourceVersion"])
