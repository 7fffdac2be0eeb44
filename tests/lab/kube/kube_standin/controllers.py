"""Controllers and scheduler running inside the API stand-in (kube-controller-manager and kube-scheduler,
reduced): namespaces, ServiceAccount tokens, garbage collection, Deployment -> ReplicaSet -> Pods,
StatefulSet, DaemonSet, PodDisruptionBudget status, node taints from conditions, and binding of pending
Pods to nodes with room."""

from __future__ import annotations

import base64
import calendar
import contextlib
import copy
import hashlib
import json
import re
import threading
import time
import traceback
import uuid
from typing import TYPE_CHECKING, Any

from .api import int_or_percent, pod_ready
from .errors import ApiError
from .resources import Resource
from .selectors import labels_match
from .store import now_iso

if TYPE_CHECKING:
    from .apiserver import Server

SAFE = "bcdfghjklmnpqrstvwxz2456789"
WORKLOADS = ("ReplicaSet", "StatefulSet", "DaemonSet")


def safe_hash(data: Any, length: int = 10) -> str:
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).digest()
    return "".join(SAFE[b % len(SAFE)] for b in digest[:length])


def _epoch(stamp: Any) -> float:
    """RFC 3339 (Time or MicroTime) -> seconds; 0 when absent or unreadable."""
    if not isinstance(stamp, str) or len(stamp) < 19:
        return 0.0
    try:
        return float(calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return 0.0


def rand_suffix() -> str:
    return "".join(SAFE[b % len(SAFE)] for b in uuid.uuid4().bytes[:5])


_QTY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def quantity(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    m = _QTY.match(str(value).strip())
    if not m or m.group(2) not in _SUFFIX:
        return 0.0
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def _owner_ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
    return any(
        r.get("uid") == owner["metadata"]["uid"] and r.get("controller")
        for r in obj["metadata"].get("ownerReferences") or []
    )


def _condition(
    old: list[dict[str, Any]], ctype: str, status: str, reason: str, message: str, with_update: bool = False
) -> dict[str, Any]:
    prev = next((c for c in old if c.get("type") == ctype), None)
    now = now_iso()
    cond = {"type": ctype, "status": status, "reason": reason, "message": message}
    if prev and prev.get("status") == status:
        cond["lastTransitionTime"] = prev.get("lastTransitionTime", now)
    else:
        cond["lastTransitionTime"] = now
    if with_update:
        same = (
            prev
            and prev.get("status") == status
            and prev.get("reason") == reason
            and prev.get("message") == message
        )
        cond["lastUpdateTime"] = prev.get("lastUpdateTime", now) if same and prev else now
    return cond


# ---------------------------------------------------------------------------- scheduling predicates


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for tol in tolerations or []:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        op = tol.get("operator", "Equal")
        if not tol.get("key") and op == "Exists":
            return True
        if tol.get("key") != taint.get("key"):
            continue
        if op == "Exists" or tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _expr_match(expr: dict[str, Any], value: str | None) -> bool:
    op, values = expr.get("operator"), [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
        except ValueError:
            return False
    return False


def node_affinity_ok(spec: dict[str, Any], node: dict[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    for key, val in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != val:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    for term in terms:
        ok = all(_expr_match(e, labels.get(e.get("key", ""))) for e in term.get("matchExpressions") or [])
        ok = ok and all(
            _expr_match(e, node["metadata"]["name"] if e.get("key") == "metadata.name" else None)
            for e in term.get("matchFields") or []
        )
        if ok and (term.get("matchExpressions") or term.get("matchFields")):
            return True
    return False


def pod_requests(spec: dict[str, Any]) -> dict[str, float]:
    total: dict[str, float] = {}
    for ctr in spec.get("containers") or []:
        res = ctr.get("resources") or {}
        reqs = dict(res.get("limits") or {}) if not res.get("requests") else {}
        reqs.update(res.get("requests") or {})
        if "nvidia.com/gpu" in (res.get("limits") or {}):
            reqs["nvidia.com/gpu"] = (res.get("limits") or {})["nvidia.com/gpu"]
        for key, val in reqs.items():
            total[key] = total.get(key, 0.0) + quantity(val)
    for ctr in spec.get("initContainers") or []:
        for key, val in ((ctr.get("resources") or {}).get("requests") or {}).items():
            total[key] = max(total.get(key, 0.0), quantity(val))
    total["pods"] = 1
    return total


class Controllers:
    def __init__(self, server: Server) -> None:
        self.srv = server
        self.api = server.api
        self.store = server.store
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sched_msg: dict[str, str] = {}
        self._cidr_warned: set[str] = set()
        self.api.on_change.append(self._on_change)

    def _on_change(self, res: Resource, obj: dict[str, Any], event: str) -> None:
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="controllers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self.reconcile()
            except Exception:  # a controller bug must not stop the others; it is logged
                traceback.print_exc()

    def r(self, group: str, plural: str) -> Resource:
        return self.api.builtin(group, plural)

    def reconcile(self) -> None:
        for _ in range(5):  # a few passes so chains (Deployment -> RS -> Pod -> bind) settle in one wake
            with self.store.lock:
                before = self.store.rv
                for step in (
                    self.namespaces,
                    self.sa_tokens,
                    self.garbage_collect,
                    self.node_taints,
                    self.deployments,
                    self.replicasets,
                    self.statefulsets,
                    self.daemonsets,
                    self.schedule,
                    self.workload_status,
                    self.pdbs,
                    self.endpoints,
                ):
                    try:
                        step()
                    except ApiError as exc:  # conflicts with a client: retried on the next pass
                        if exc.code >= 500:
                            raise
                if self.store.rv == before:
                    return

    # ------------------------------------------------------------------ helpers
    def _list(self, group: str, plural: str, ns: str | None = None) -> list[dict[str, Any]]:
        res = self.r(group, plural)
        return [
            dict(o, apiVersion=res.group_version, kind=res.kind) for o in self.store.select(group, plural, ns)
        ]

    def _save_status(self, group: str, plural: str, obj: dict[str, Any], status: dict[str, Any]) -> None:
        if obj.get("status") == status:
            return
        new = copy.deepcopy(obj)
        new["status"] = status
        self.api.update(
            self.r(group, plural),
            obj["metadata"].get("namespace", ""),
            obj["metadata"]["name"],
            new,
            subresource="status",
        )

    def event(
        self,
        obj: dict[str, Any],
        reason: str,
        message: str,
        etype: str = "Normal",
        component: str = "controller-manager",
    ) -> None:
        ns = obj["metadata"].get("namespace") or "default"
        now = now_iso()
        body = {
            "metadata": {"name": f"{obj['metadata']['name']}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {
                "kind": obj.get("kind"),
                "namespace": obj["metadata"].get("namespace", ""),
                "name": obj["metadata"]["name"],
                "uid": obj["metadata"].get("uid"),
                "apiVersion": obj.get("apiVersion"),
                "resourceVersion": obj["metadata"].get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": etype,
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": component,
            "reportingInstance": "",
        }
        with contextlib.suppress(ApiError):
            self.api.create(self.r("", "events"), ns, body)

    # ------------------------------------------------------------------ namespaces, tokens, GC
    def namespaces(self) -> None:
        for ns in self._list("", "namespaces"):
            name = ns["metadata"]["name"]
            if ns["metadata"].get("deletionTimestamp"):
                left = 0
                for res in self.api.registry.all():
                    if not res.namespaced or res.verbs == ("create",) or res.plural == "bindings":
                        continue
                    for obj in self.store.select(res.group, res.plural, name):
                        left += 1
                        if not obj["metadata"].get("deletionTimestamp"):
                            with contextlib.suppress(ApiError):
                                self.api.delete(res, name, obj["metadata"]["name"])
                if left == 0:
                    self.api._commit(self.r("", "namespaces"), ns, "DELETED")
                continue
            if self.store.get("", "serviceaccounts", name, "default") is None:
                self.api.create(self.r("", "serviceaccounts"), name, {"metadata": {"name": "default"}})
            if self.srv.ca_pem and self.store.get("", "configmaps", name, "kube-root-ca.crt") is None:
                self.api.create(
                    self.r("", "configmaps"),
                    name,
                    {
                        "metadata": {
                            "name": "kube-root-ca.crt",
                            "annotations": {
                                "kubernetes.io/description": "Contains a CA bundle that can be used to "
                                "verify "
                                "the "
                                "kube-apiserver when using internal endpoints such as the "
                                "internal service IP or kubernetes.default.svc. No other usage "
                                "is guaranteed across distributions of Kubernetes clusters."
                            },
                        },
                        "data": {"ca.crt": self.srv.ca_pem},
                    },
                )

    def sa_tokens(self) -> None:
        for secret in self._list("", "secrets"):
            if secret.get("type") != "kubernetes.io/service-account-token":
                continue
            if (secret.get("data") or {}).get("token"):
                continue
            meta = secret["metadata"]
            sa_name = (meta.get("annotations") or {}).get("kubernetes.io/service-account.name")
            sa = self.store.get("", "serviceaccounts", meta["namespace"], sa_name or "")
            if sa is None:
                continue
            token = self.srv.authn.mint_legacy(
                meta["namespace"], sa_name or "", sa["metadata"]["uid"], meta["name"]
            )
            new = copy.deepcopy(secret)
            new["metadata"].setdefault("annotations", {})["kubernetes.io/service-account.uid"] = sa[
                "metadata"
            ]["uid"]
            new["data"] = {
                **(secret.get("data") or {}),
                "token": base64.b64encode(token.encode()).decode(),
                "namespace": base64.b64encode(meta["namespace"].encode()).decode(),
                "ca.crt": base64.b64encode(self.srv.ca_pem.encode()).decode(),
            }
            self.api.update(self.r("", "secrets"), meta["namespace"], meta["name"], new)

    def garbage_collect(self) -> None:
        """Garbage collector: dependents whose owners are all gone are deleted (background propagation);
        owners being deleted in the foreground lose their finalizer once their dependents are gone."""
        by_key: dict[tuple[str, str], Resource] = {}
        for res in self.api.registry.all():
            if res.verbs != ("create",) and res.plural != "bindings":
                by_key.setdefault(res.key, res)
        uids: set[str] = set()
        owned: list[tuple[Resource, dict[str, Any]]] = []
        foreground: list[tuple[Resource, dict[str, Any]]] = []
        # read-only walk over the stored objects (the reconcile pass holds the store lock): no copies
        for (group, plural, _ns, _name), obj in self.store.objects.items():
            found = by_key.get((group, plural))
            if found is None:
                continue
            res = found
            meta = obj["metadata"]
            uids.add(meta["uid"])
            if meta.get("ownerReferences"):
                owned.append((res, obj))
            if meta.get("deletionTimestamp") and "foregroundDeletion" in (meta.get("finalizers") or []):
                foreground.append((res, obj))
        for res, obj in owned:
            if not any(r.get("uid") in uids for r in obj["metadata"]["ownerReferences"]):
                with contextlib.suppress(ApiError):
                    self.api.delete(res, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        for res, obj in foreground:
            meta = obj["metadata"]
            deps = [
                (r, o)
                for r, o in owned
                if any(ref.get("uid") == meta["uid"] for ref in o["metadata"]["ownerReferences"])
            ]
            for r, o in deps:
                with contextlib.suppress(ApiError):
                    self.api.delete(
                        r,
                        o["metadata"].get("namespace", ""),
                        o["metadata"]["name"],
                        {"propagationPolicy": "Foreground"},
                    )
            if not deps:
                new = copy.deepcopy(obj)
                new["metadata"]["finalizers"] = [f for f in meta["finalizers"] if f != "foregroundDeletion"]
                self.api.update(
                    res,
                    meta.get("namespace", ""),
                    meta["name"],
                    dict(new, apiVersion=res.group_version, kind=res.kind),
                )

    # ------------------------------------------------------------------ nodes
    def node_taints(self) -> None:
        """Node lifecycle controller: a node whose kubelet stopped posting (no Lease renewal nor Ready
        heartbeat for --node-monitor-grace-period) gets its conditions set Unknown; taints mirror the Ready
        condition (not-ready / unreachable, NoSchedule and NoExecute) and spec.unschedulable."""
        now = time.time()
        for node in self._list("", "nodes"):
            name = node["metadata"]["name"]
            conditions = node.get("status", {}).get("conditions") or []
            ready = next((c for c in conditions if c.get("type") == "Ready"), None)
            if ready is not None and ready.get("status") != "Unknown":
                lease = self.store.get("coordination.k8s.io", "leases", "kube-node-lease", name) or {}
                beats = [
                    _epoch(ready.get("lastHeartbeatTime")),
                    _epoch((lease.get("spec") or {}).get("renewTime")),
                ]
                if now - max(beats) > self.srv.node_grace:
                    status = copy.deepcopy(node.get("status") or {})
                    for cond in status.get("conditions") or []:
                        cond.update(
                            {
                                "status": "Unknown",
                                "reason": "NodeStatusUnknown",
                                "message": "Kubelet stopped posting node status.",
                                "lastTransitionTime": now_iso(),
                            }
                        )
                    self._save_status("", "nodes", node, status)
                    node = self.api.get(self.r("", "nodes"), "", name)
                    ready = next(c for c in node["status"]["conditions"] if c.get("type") == "Ready")
            if self.srv.cluster_cidr is not None and not node.get("spec", {}).get("podCIDR"):
                node = self._allocate_pod_cidr(node)
            taints = list(node.get("spec", {}).get("taints") or [])
            managed = {
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable",
                "node.kubernetes.io/unschedulable",
            }
            want = [t for t in taints if t.get("key") not in managed]
            if ready is None or ready.get("status") != "True":
                key = (
                    "node.kubernetes.io/unreachable"
                    if ready and ready.get("status") == "Unknown"
                    else ("node.kubernetes.io/not-ready")
                )
                want += [{"key": key, "effect": "NoSchedule"}, {"key": key, "effect": "NoExecute"}]
            if node.get("spec", {}).get("unschedulable"):
                want.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})

            def norm(ts: list[dict[str, Any]]) -> list[str]:
                return sorted(
                    json.dumps({k: v for k, v in t.items() if k != "timeAdded"}, sort_keys=True) for t in ts
                )

            if norm(want) != norm(taints):
                for t in want:
                    if t.get("key") in managed:
                        old = next(
                            (
                                o
                                for o in taints
                                if o.get("key") == t["key"] and o.get("effect") == t["effect"]
                            ),
                            None,
                        )
                        t["timeAdded"] = (old or {}).get("timeAdded") or now_iso()
                new = copy.deepcopy(node)
                new["spec"]["taints"] = want
                if not want:
                    new["spec"].pop("taints")
                self.api.update(self.r("", "nodes"), "", name, new)

    def _allocate_pod_cidr(self, node: dict[str, Any]) -> dict[str, Any]:
        """Node IPAM controller (range allocator): the next free /node-cidr-mask-size of --cluster-cidr."""
        cidr = self.srv.cluster_cidr
        assert cidr is not None
        used = {n.get("spec", {}).get("podCIDR") for n in self._list("", "nodes")}
        for subnet in cidr.subnets(new_prefix=self.srv.node_cidr_mask):
            if str(subnet) not in used:
                new = copy.deepcopy(node)
                new["spec"]["podCIDR"] = str(subnet)
                new["spec"]["podCIDRs"] = [str(subnet)]
                return self.api.update(self.r("", "nodes"), "", node["metadata"]["name"], new)
        if node["metadata"]["uid"] in self._cidr_warned:
            return node
        self._cidr_warned.add(node["metadata"]["uid"])
        self.event(
            node,
            "CIDRNotAvailable",
            f"Node {node['metadata']['name']} status is now: CIDRNotAvailable",
            "Normal",
            component="cidrAllocator",
        )
        return node

    # ------------------------------------------------------------------ workloads
    def _pods_of(self, owner: dict[str, Any]) -> list[dict[str, Any]]:
        return [p for p in self._list("", "pods", owner["metadata"]["namespace"]) if _owned_by(p, owner)]

    def _new_pod(
        self,
        owner: dict[str, Any],
        name: str,
        extra_labels: dict[str, str],
        spec_patch: dict[str, Any] | None = None,
    ) -> None:
        template = copy.deepcopy(owner["spec"].get("template") or {})
        meta = template.get("metadata") or {}
        labels = {**(meta.get("labels") or {}), **extra_labels}
        spec = template.get("spec") or {}
        if spec_patch:
            spec.update(spec_patch)
        body = {
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": meta.get("annotations") or {},
                "ownerReferences": [_owner_ref(owner)],
            },
            "spec": spec,
        }
        if not body["metadata"]["annotations"]:
            body["metadata"].pop("annotations")
        pod = self.api.create(self.r("", "pods"), owner["metadata"]["namespace"], body)
        self.event(owner, "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}")

    def _delete_pod(self, owner: dict[str, Any], pod: dict[str, Any]) -> None:
        try:
            self.api.delete(self.r("", "pods"), pod["metadata"]["namespace"], pod["metadata"]["name"])
            self.event(owner, "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}")
        except ApiError:
            pass

    def deployments(self) -> None:
        rs_res = self.r("apps", "replicasets")
        for dep in self._list("apps", "deployments"):
            meta, spec = dep["metadata"], dep["spec"]
            if meta.get("deletionTimestamp"):
                continue
            template = spec.get("template") or {}
            phash = safe_hash(template)
            rss = [rs for rs in self._list("apps", "replicasets", meta["namespace"]) if _owned_by(rs, dep)]
            new_rs = next(
                (rs for rs in rss if rs["metadata"].get("labels", {}).get("pod-template-hash") == phash), None
            )
            revisions = [
                int((rs["metadata"].get("annotations") or {}).get("deployment.kubernetes.io/revision", 0))
                for rs in rss
            ]
            replicas = int(spec.get("replicas", 1))
            if spec.get("paused"):
                continue
            if new_rs is None:
                rev = str(max(revisions, default=0) + 1)
                tpl = copy.deepcopy(template)
                tpl.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = phash
                sel = copy.deepcopy(spec.get("selector") or {})
                sel.setdefault("matchLabels", {})["pod-template-hash"] = phash
                new_rs = self.api.create(
                    rs_res,
                    meta["namespace"],
                    {
                        "metadata": {
                            "name": f"{meta['name']}-{phash}",
                            "labels": tpl["metadata"]["labels"],
                            "annotations": {
                                "deployment.kubernetes.io/revision": rev,
                                "deployment.kubernetes.io/desired-replicas": str(replicas),
                            },
                            "ownerReferences": [_owner_ref(dep)],
                        },
                        "spec": {"replicas": 0 if rss else replicas, "selector": sel, "template": tpl},
                    },
                )
                if new_rs["spec"]["replicas"]:
                    self.event(
                        dep,
                        "ScalingReplicaSet",
                        f"Scaled up replica set {new_rs['metadata']['name']} from 0 to "
                        f"{new_rs['spec']['replicas']}",
                    )
                rss.append(new_rs)
            old = [rs for rs in rss if rs["metadata"]["uid"] != new_rs["metadata"]["uid"]]
            strategy = spec.get("strategy") or {}
            new_ready = int((new_rs.get("status") or {}).get("readyReplicas", 0))
            if strategy.get("type") == "Recreate":
                old_pods = sum(int((rs.get("status") or {}).get("replicas", 0)) for rs in old)
                want_new = replicas if old_pods == 0 else 0
                want_old = {rs["metadata"]["uid"]: 0 for rs in old}
            else:
                surge = int_or_percent(
                    (strategy.get("rollingUpdate") or {}).get("maxSurge", "25%"), replicas, True
                )
                want_new = (
                    replicas
                    if not old
                    else min(replicas, max(int(new_rs["spec"].get("replicas", 0)), new_ready + max(1, surge)))
                )
                left = max(0, replicas - new_ready)
                want_old = {}
                for rs in sorted(old, key=lambda x: x["metadata"]["creationTimestamp"], reverse=True):
                    cur = int(rs["spec"].get("replicas", 0))
                    keep = min(cur, left)
                    left -= keep
                    want_old[rs["metadata"]["uid"]] = keep
            self._scale_rs(dep, new_rs, want_new)
            for rs in old:
                self._scale_rs(dep, rs, want_old[rs["metadata"]["uid"]])
            # revision annotation on the Deployment
            rev = (new_rs["metadata"].get("annotations") or {}).get("deployment.kubernetes.io/revision", "1")
            if (meta.get("annotations") or {}).get("deployment.kubernetes.io/revision") != rev:
                fresh = self.api.get(self.r("apps", "deployments"), meta["namespace"], meta["name"])
                fresh["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/revision"] = rev
                self.api.update(self.r("apps", "deployments"), meta["namespace"], meta["name"], fresh)
            # history limit
            limit = int(spec.get("revisionHistoryLimit", 10))
            idle = sorted(
                [
                    rs
                    for rs in old
                    if int(rs["spec"].get("replicas", 0)) == 0
                    and not (rs.get("status") or {}).get("replicas")
                ],
                key=lambda x: x["metadata"]["creationTimestamp"],
            )
            for rs in idle[: max(0, len(idle) - limit)]:
                self.api.delete(rs_res, meta["namespace"], rs["metadata"]["name"])

    def _scale_rs(self, dep: dict[str, Any], rs: dict[str, Any], replicas: int) -> None:
        cur = int(rs["spec"].get("replicas", 0))
        if cur == replicas:
            return
        fresh = self.api.get(
            self.r("apps", "replicasets"), rs["metadata"]["namespace"], rs["metadata"]["name"]
        )
        fresh["spec"]["replicas"] = replicas
        fresh["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/desired-replicas"] = str(
            dep["spec"].get("replicas", 1)
        )
        self.api.update(
            self.r("apps", "replicasets"), rs["metadata"]["namespace"], rs["metadata"]["name"], fresh
        )
        verb = "up" if replicas > cur else "down"
        self.event(
            dep,
            "ScalingReplicaSet",
            f"Scaled {verb} replica set {rs['metadata']['name']} from {cur} to {replicas}",
        )

    def replicasets(self) -> None:
        for rs in self._list("apps", "replicasets"):
            if rs["metadata"].get("deletionTimestamp"):
                continue
            pods = [
                p
                for p in self._pods_of(rs)
                if not p["metadata"].get("deletionTimestamp")
                and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
            ]
            want = int(rs["spec"].get("replicas", 1))
            for _ in range(want - len(pods)):
                self._new_pod(rs, f"{rs['metadata']['name']}-{rand_suffix()}", {})
            if len(pods) > want:
                # delete not-ready / unscheduled first, then the newest
                pods.sort(
                    key=lambda p: (
                        pod_ready(p),
                        bool(p["spec"].get("nodeName")),
                        p["metadata"]["creationTimestamp"],
                    ),
                    reverse=False,
                )
                for pod in pods[: len(pods) - want]:
                    self._delete_pod(rs, pod)

    def statefulsets(self) -> None:
        for sts in self._list("apps", "statefulsets"):
            meta, spec = sts["metadata"], sts["spec"]
            if meta.get("deletionTimestamp"):
                continue
            revision = f"{meta['name']}-{safe_hash(spec.get('template') or {})}"
            pods = {p["metadata"]["name"]: p for p in self._pods_of(sts)}
            want = int(spec.get("replicas", 1))
            ordered = spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
            for i in range(want):
                name = f"{meta['name']}-{i}"
                pod = pods.get(name)
                if pod is None:
                    self._new_pod(
                        sts,
                        name,
                        {
                            "statefulset.kubernetes.io/pod-name": name,
                            "controller-revision-hash": revision,
                            "apps.kubernetes.io/pod-index": str(i),
                        },
                        {"hostname": name, "subdomain": spec.get("serviceName", "")}
                        if spec.get("serviceName")
                        else {"hostname": name},
                    )
                    if ordered:
                        break
                elif ordered and not pod_ready(pod):
                    break
            else:
                # scale down from the highest ordinal, then roll outdated pods from the highest ordinal
                extra = sorted(
                    (p for n, p in pods.items() if self._ordinal(n, meta["name"]) >= want),
                    key=lambda p: self._ordinal(p["metadata"]["name"], meta["name"]),
                    reverse=True,
                )
                for pod in extra[:1] if ordered else extra:
                    self._delete_pod(sts, pod)
                if (
                    not extra
                    and (spec.get("updateStrategy") or {}).get("type", "RollingUpdate") == "RollingUpdate"
                ):
                    outdated = sorted(
                        (
                            p
                            for p in pods.values()
                            if p["metadata"].get("labels", {}).get("controller-revision-hash") != revision
                        ),
                        key=lambda p: p["metadata"]["name"],
                        reverse=True,
                    )
                    if outdated and all(pod_ready(p) for p in pods.values()):
                        self._delete_pod(sts, outdated[0])

    @staticmethod
    def _ordinal(name: str, base: str) -> int:
        try:
            return int(name[len(base) + 1 :])
        except ValueError:
            return -1

    def _ds_eligible(self, ds: dict[str, Any], node: dict[str, Any]) -> bool:
        spec = (ds["spec"].get("template") or {}).get("spec") or {}
        if not node_affinity_ok(spec, node):
            return False
        tolerations = list(spec.get("tolerations") or []) + self._ds_tolerations()
        return all(
            tolerates(tolerations, t)
            for t in node.get("spec", {}).get("taints") or []
            if t.get("effect") in ("NoSchedule", "NoExecute")
        )

    @staticmethod
    def _ds_tolerations() -> list[dict[str, Any]]:
        out = [
            {"key": k, "operator": "Exists", "effect": "NoExecute"}
            for k in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        ]
        out += [
            {"key": k, "operator": "Exists", "effect": "NoSchedule"}
            for k in (
                "node.kubernetes.io/disk-pressure",
                "node.kubernetes.io/memory-pressure",
                "node.kubernetes.io/pid-pressure",
                "node.kubernetes.io/unschedulable",
            )
        ]
        return out

    def daemonsets(self) -> None:
        nodes = self._list("", "nodes")
        for ds in self._list("apps", "daemonsets"):
            meta, spec = ds["metadata"], ds["spec"]
            if meta.get("deletionTimestamp"):
                continue
            revision = safe_hash(spec.get("template") or {})
            pods = [p for p in self._pods_of(ds) if not p["metadata"].get("deletionTimestamp")]
            by_node: dict[str, list[dict[str, Any]]] = {}
            for pod in pods:
                target = pod["spec"].get("nodeName") or self._affinity_node(pod)
                by_node.setdefault(target, []).append(pod)
            eligible = {n["metadata"]["name"] for n in nodes if self._ds_eligible(ds, n)}
            for node in sorted(eligible):
                if node not in by_node:
                    tspec = copy.deepcopy((spec.get("template") or {}).get("spec") or {})
                    tol = list(tspec.get("tolerations") or [])
                    for extra in self._ds_tolerations():
                        if not any(
                            t.get("key") == extra["key"] and t.get("effect") == extra["effect"] for t in tol
                        ):
                            tol.append(extra)
                    affinity = copy.deepcopy(tspec.get("affinity") or {})
                    affinity.setdefault("nodeAffinity", {})[
                        "requiredDuringSchedulingIgnoredDuringExecution"
                    ] = {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                        ]
                    }
                    self._new_pod(
                        ds,
                        f"{meta['name']}-{rand_suffix()}",
                        {
                            "controller-revision-hash": revision,
                            "pod-template-generation": str(meta.get("generation", 1)),
                        },
                        {"tolerations": tol, "affinity": affinity},
                    )
            for node, node_pods in by_node.items():
                if node not in eligible:
                    for pod in node_pods:
                        self._delete_pod(ds, pod)
                elif len(node_pods) > 1:
                    for pod in node_pods[1:]:
                        self._delete_pod(ds, pod)
            # rolling update: replace one outdated pod at a time once the rest are ready
            if (spec.get("updateStrategy") or {}).get("type", "RollingUpdate") == "RollingUpdate":
                outdated = [
                    p
                    for p in pods
                    if p["metadata"].get("labels", {}).get("controller-revision-hash") != revision
                ]
                max_unavail = (
                    int_or_percent(
                        ((spec.get("updateStrategy") or {}).get("rollingUpdate") or {}).get(
                            "maxUnavailable", 1
                        ),
                        max(1, len(eligible)),
                        True,
                    )
                    or 1
                )
                unavailable = sum(1 for p in pods if not pod_ready(p))
                for pod in outdated[: max(0, max_unavail - unavailable)]:
                    self._delete_pod(ds, pod)

    @staticmethod
    def _affinity_node(pod: dict[str, Any]) -> str:
        terms = (
            ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution"
            )
            or {}
        ).get("nodeSelectorTerms") or []
        for term in terms:
            for f in term.get("matchFields") or []:
                if f.get("key") == "metadata.name" and f.get("values"):
                    return str(f["values"][0])
        return ""

    # ------------------------------------------------------------------ scheduler
    def schedule(self) -> None:
        pods = self._list("", "pods")
        pending = [
            p
            for p in pods
            if not p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and p["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
        ]
        if not pending:
            return
        nodes = self._list("", "nodes")
        used: dict[str, dict[str, float]] = {}
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if node and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                acc = used.setdefault(node, {})
                for key, val in pod_requests(pod["spec"]).items():
                    acc[key] = acc.get(key, 0.0) + val
        pending.sort(key=lambda p: (-int(p["spec"].get("priority", 0)), p["metadata"]["creationTimestamp"]))
        for pod in pending:
            reasons: dict[str, int] = {}
            fits = []
            need = pod_requests(pod["spec"])
            for node in nodes:
                why = self._fit(pod, node, need, used.get(node["metadata"]["name"], {}))
                if why:
                    reasons[why] = reasons.get(why, 0) + 1
                else:
                    fits.append(node)
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            if fits:
                # least allocated GPU first, then name: spreads pods like the default scoring does
                fits.sort(
                    key=lambda n: (used.get(n["metadata"]["name"], {}).get("pods", 0), n["metadata"]["name"])
                )
                node_name = fits[0]["metadata"]["name"]
                self.api.bind(
                    pod["metadata"]["namespace"], pod["metadata"]["name"], {"target": {"name": node_name}}
                )
                acc = used.setdefault(node_name, {})
                for k, v in need.items():
                    acc[k] = acc.get(k, 0.0) + v
                self._last_sched_msg.pop(key, None)
                self.event(
                    pod,
                    "Scheduled",
                    f"Successfully assigned {key} to {node_name}",
                    component="default-scheduler",
                )
                continue
            detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
            msg = f"0/{len(nodes)} nodes are available" + (f": {detail}." if detail else ".")
            msg += (
                f" preemption: 0/{len(nodes)} nodes are available: {len(nodes)} Preemption is not "
                "helpful for "
                "scheduling."
                if nodes
                else ""
            )
            if self._last_sched_msg.get(key) == msg:
                continue
            self._last_sched_msg[key] = msg
            status = copy.deepcopy(pod.get("status") or {})
            conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            conds.append(
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": msg,
                    "lastProbeTime": None,
                    "lastTransitionTime": now_iso(),
                }
            )
            status["conditions"] = conds
            self._save_status("", "pods", pod, status)
            self.event(pod, "FailedScheduling", msg, "Warning", component="default-scheduler")

    @staticmethod
    def _fit(
        pod: dict[str, Any], node: dict[str, Any], need: dict[str, float], used: dict[str, float]
    ) -> str:
        spec = pod["spec"]
        for taint in node.get("spec", {}).get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
                spec.get("tolerations") or [], taint
            ):
                if taint.get("key") == "node.kubernetes.io/unschedulable":
                    return "node(s) were unschedulable"
                return (
                    f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}".replace(
                        ": }", "}"
                    )
                )
        if not node_affinity_ok(spec, node):
            return "node(s) didn't match Pod's node affinity/selector"
        alloc = node.get("status", {}).get("allocatable") or {}
        for key, amount in need.items():
            if amount <= 0:
                continue
            have = quantity(alloc.get(key, 110 if key == "pods" else 0))
            if key in ("cpu", "memory", "ephemeral-storage") and key not in alloc:
                continue
            if used.get(key, 0.0) + amount > have:
                return "Too many pods" if key == "pods" else f"Insufficient {key}"
        return ""

    # ------------------------------------------------------------------ status
    def workload_status(self) -> None:
        for rs in self._list("apps", "replicasets"):
            pods = [p for p in self._pods_of(rs) if not p["metadata"].get("deletionTimestamp")]
            ready = sum(1 for p in pods if pod_ready(p))
            self._save_status(
                "apps",
                "replicasets",
                rs,
                {
                    "replicas": len(pods),
                    "fullyLabeledReplicas": len(pods),
                    "readyReplicas": ready,
                    "availableReplicas": ready,
                    "observedGeneration": rs["metadata"].get("generation", 1),
                },
            )
        for dep in self._list("apps", "deployments"):
            self._deployment_status(dep)
        for sts in self._list("apps", "statefulsets"):
            revision = f"{sts['metadata']['name']}-{safe_hash(sts['spec'].get('template') or {})}"
            pods = [p for p in self._pods_of(sts) if not p["metadata"].get("deletionTimestamp")]
            ready = sum(1 for p in pods if pod_ready(p))
            updated = sum(
                1 for p in pods if p["metadata"].get("labels", {}).get("controller-revision-hash") == revision
            )
            old = sts.get("status") or {}
            current_rev = old.get("currentRevision", revision)
            if updated == len(pods) == int(sts["spec"].get("replicas", 1)):
                current_rev = revision
            self._save_status(
                "apps",
                "statefulsets",
                sts,
                {
                    "replicas": len(pods),
                    "readyReplicas": ready,
                    "currentReplicas": sum(
                        1
                        for p in pods
                        if p["metadata"].get("labels", {}).get("controller-revision-hash") == current_rev
                    ),
                    "updatedReplicas": updated,
                    "availableReplicas": ready,
                    "currentRevision": current_rev,
                    "updateRevision": revision,
                    "collisionCount": 0,
                    "observedGeneration": sts["metadata"].get("generation", 1),
                },
            )
        nodes = self._list("", "nodes")
        for ds in self._list("apps", "daemonsets"):
            revision = safe_hash(ds["spec"].get("template") or {})
            eligible = {n["metadata"]["name"] for n in nodes if self._ds_eligible(ds, n)}
            pods = [p for p in self._pods_of(ds) if not p["metadata"].get("deletionTimestamp")]
            scheduled = [p for p in pods if p["spec"].get("nodeName")]
            ready = sum(1 for p in scheduled if pod_ready(p))
            self._save_status(
                "apps",
                "daemonsets",
                ds,
                {
                    "desiredNumberScheduled": len(eligible),
                    "currentNumberScheduled": sum(1 for p in scheduled if p["spec"]["nodeName"] in eligible),
                    "numberMisscheduled": sum(1 for p in scheduled if p["spec"]["nodeName"] not in eligible),
                    "numberReady": ready,
                    "numberAvailable": ready,
                    "numberUnavailable": max(0, len(eligible) - ready),
                    "updatedNumberScheduled": sum(
                        1
                        for p in scheduled
                        if p["metadata"].get("labels", {}).get("controller-revision-hash") == revision
                    ),
                    "observedGeneration": ds["metadata"].get("generation", 1),
                },
            )

    def _deployment_status(self, dep: dict[str, Any]) -> None:
        rss = [
            rs for rs in self._list("apps", "replicasets", dep["metadata"]["namespace"]) if _owned_by(rs, dep)
        ]
        phash = safe_hash(dep["spec"].get("template") or {})
        new_rs = next(
            (rs for rs in rss if rs["metadata"].get("labels", {}).get("pod-template-hash") == phash), None
        )
        replicas = sum(int((rs.get("status") or {}).get("replicas", 0)) for rs in rss)
        ready = sum(int((rs.get("status") or {}).get("readyReplicas", 0)) for rs in rss)
        updated = int((new_rs or {}).get("status", {}).get("replicas", 0)) if new_rs else 0
        want = int(dep["spec"].get("replicas", 1))
        old = dep.get("status") or {}
        conds_old = old.get("conditions") or []
        max_unavail = int_or_percent(
            ((dep["spec"].get("strategy") or {}).get("rollingUpdate") or {}).get("maxUnavailable", "25%"),
            want,
            False,
        )
        available_ok = ready >= want - max_unavail
        conds = [
            _condition(
                conds_old,
                "Available",
                "True" if available_ok else "False",
                "MinimumReplicasAvailable" if available_ok else "MinimumReplicasUnavailable",
                "Deployment has minimum availability."
                if available_ok
                else "Deployment does not have minimum availability.",
                True,
            )
        ]
        done = new_rs is not None and updated == want and replicas == want and ready == want
        rs_name = new_rs["metadata"]["name"] if new_rs else dep["metadata"]["name"]
        conds.append(
            _condition(
                conds_old,
                "Progressing",
                "True",
                "NewReplicaSetAvailable" if done else "ReplicaSetUpdated",
                f'ReplicaSet "{rs_name}" has successfully progressed.'
                if done
                else f'ReplicaSet "{rs_name}" is progressing.',
                True,
            )
        )
        status: dict[str, Any] = {
            "observedGeneration": dep["metadata"].get("generation", 1),
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": conds,
        }
        if replicas - ready > 0:
            status["unavailableReplicas"] = replicas - ready
        for key in ("readyReplicas", "availableReplicas", "updatedReplicas", "replicas"):
            if not status[key]:
                status.pop(key)
        self._save_status("apps", "deployments", dep, status)

    def pdbs(self) -> None:
        for pdb in self._list("policy", "poddisruptionbudgets"):
            st = self.api.pdb_status(pdb)
            old = pdb.get("status") or {}
            allowed = st["disruptionsAllowed"] > 0
            st["conditions"] = [
                _condition(
                    old.get("conditions") or [],
                    "DisruptionAllowed",
                    "True" if allowed else "False",
                    "SufficientPods" if allowed else "InsufficientPods",
                    "",
                )
            ]
            st["conditions"][0]["observedGeneration"] = st["observedGeneration"]
            self._save_status("policy", "poddisruptionbudgets", pdb, st)

    # ------------------------------------------------------------------ endpoints
    def endpoints(self) -> None:
        """Endpoints and EndpointSlice controllers: ready (and not-ready) pod IPs behind each Service with a
        selector; the API server's own endpoint behind default/kubernetes."""
        for svc in self._list("", "services"):
            meta, spec = svc["metadata"], svc.get("spec") or {}
            ns, name = meta["namespace"], meta["name"]
            ports = spec.get("ports") or []
            targets: list[tuple[dict[str, Any], bool]] = []
            svc_ports: list[dict[str, Any]] = []
            if ns == "default" and name == "kubernetes":
                targets = [({"ip": self.srv.advertise_ip()}, True)]
                svc_ports = [{"name": "https", "port": self.srv.port, "protocol": "TCP"}]
            elif spec.get("selector"):
                reqs = [(k, "=", [str(v)]) for k, v in spec["selector"].items()]
                pods = [
                    p
                    for p in self._list("", "pods", ns)
                    if labels_match(reqs, p["metadata"].get("labels"))
                    and (p.get("status") or {}).get("podIP")
                    and not p["metadata"].get("deletionTimestamp")
                ]
                for port in ports:
                    target = port.get("targetPort", port.get("port"))
                    number = target if isinstance(target, int) else self._named_port(pods, str(target))
                    if number is not None:
                        entry = {"port": number, "protocol": port.get("protocol", "TCP")}
                        if port.get("name"):
                            entry["name"] = port["name"]
                        svc_ports.append(entry)
                for pod in sorted(pods, key=lambda p: (p["status"]["podIP"], p["metadata"]["name"])):
                    ref = {
                        "kind": "Pod",
                        "namespace": ns,
                        "name": pod["metadata"]["name"],
                        "uid": pod["metadata"]["uid"],
                    }
                    addr = {
                        "ip": pod["status"]["podIP"],
                        "nodeName": pod["spec"].get("nodeName"),
                        "targetRef": ref,
                    }
                    targets.append((addr, pod_ready(pod)))
            else:
                continue
            self._save_endpoints(svc, targets, svc_ports)

    @staticmethod
    def _named_port(pods: list[dict[str, Any]], name: str) -> int | None:
        for pod in pods:
            for ctr in pod["spec"].get("containers") or []:
                for port in ctr.get("ports") or []:
                    if port.get("name") == name:
                        return int(port["containerPort"])
        return None

    def _save_endpoints(
        self, svc: dict[str, Any], targets: list[tuple[dict[str, Any], bool]], ports: list[dict[str, Any]]
    ) -> None:
        meta = svc["metadata"]
        ns, name = meta["namespace"], meta["name"]
        subset: dict[str, Any] = {}
        ready = [a for a, ok in targets if ok]
        not_ready = [a for a, ok in targets if not ok]
        if ready:
            subset["addresses"] = ready
        if not_ready:
            subset["notReadyAddresses"] = not_ready
        labels = dict(meta.get("labels") or {})
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
        }
        if subset and ports:
            body["subsets"] = [{**subset, "ports": ports}]
        self._upsert(self.r("", "endpoints"), ns, name, body)
        default_api = name == "kubernetes" and ns == "default"
        slice_name = name if default_api else f"{name}-{safe_hash(meta['uid'], 5)}"
        eps = []
        for addr, ok in targets:
            ep: dict[str, Any] = {
                "addresses": [addr["ip"]],
                "conditions": {"ready": ok, "serving": ok, "terminating": False},
            }
            if addr.get("nodeName"):
                ep["nodeName"] = addr["nodeName"]
            if addr.get("targetRef"):
                ep["targetRef"] = addr["targetRef"]
            eps.append(ep)
        manager = (
            "endpointslice-controller.k8s.io"
            if not default_api
            else "endpointslicemirroring-controller.k8s.io"
        )
        slice_meta: dict[str, Any] = {
            "name": slice_name,
            "namespace": ns,
            "labels": {
                **labels,
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": manager,
            },
        }
        if not default_api:
            slice_meta["ownerReferences"] = [_owner_ref(svc)]
        body = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": slice_meta,
            "addressType": "IPv4",
            "endpoints": eps,
            "ports": ports,
        }
        self._upsert(self.r("discovery.k8s.io", "endpointslices"), ns, slice_name, body)

    def _upsert(self, res: Resource, ns: str, name: str, body: dict[str, Any]) -> None:
        current = self.store.get(res.group, res.plural, ns, name)
        if current is None:
            self.api.create(res, ns, body)
            return
        new = {k: v for k, v in body.items() if k != "metadata"}
        new["metadata"] = {**current["metadata"], "labels": body["metadata"].get("labels", {})}
        if "ownerReferences" in body["metadata"]:
            new["metadata"]["ownerReferences"] = body["metadata"]["ownerReferences"]
        self.api.update(res, ns, name, new)
