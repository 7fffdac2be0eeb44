"""meta.k8s.io/v1 Table rendering (server-side printing, as kubectl get asks for it)."""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Callable
from typing import Any

from .resources import Resource

Col = tuple[str, str, int, Callable[[dict[str, Any]], Any]]  # name, type, priority, getter


def _age(obj: dict[str, Any]) -> str:
    ts = obj.get("metadata", {}).get("creationTimestamp")
    if not ts:
        return "<unknown>"
    secs = int(time.time() - calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")))
    secs = max(secs, 0)
    if secs < 120:
        return f"{secs}s"
    mins = secs // 60
    if mins < 10:
        return f"{mins}m{secs % 60}s" if secs % 60 else f"{mins}m"
    if mins < 180:
        return f"{mins}m"
    hours = mins // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def _g(obj: dict[str, Any], path: str, default: Any = None) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return default
        cur = cur.get(part)
    return default if cur is None else cur


def _pod_status(pod: dict[str, Any]) -> str:
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    for cs in _g(pod, "status.containerStatuses", []):
        waiting = _g(cs, "state.waiting.reason")
        if waiting:
            return str(waiting)
    reason = _g(pod, "status.reason")
    return str(reason or _g(pod, "status.phase", "Pending"))


def _pod_ready(pod: dict[str, Any]) -> str:
    total = len(_g(pod, "spec.containers", []))
    ready = sum(1 for cs in _g(pod, "status.containerStatuses", []) if cs.get("ready"))
    return f"{ready}/{total}"


def _restarts(pod: dict[str, Any]) -> int:
    return sum(int(cs.get("restartCount", 0)) for cs in _g(pod, "status.containerStatuses", []))


def _node_status(node: dict[str, Any]) -> str:
    ready = next((c for c in _g(node, "status.conditions", []) if c.get("type") == "Ready"), None)
    out = "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    if _g(node, "spec.unschedulable"):
        out += ",SchedulingDisabled"
    return out


def _node_roles(node: dict[str, Any]) -> str:
    roles = sorted(
        k.split("/", 1)[1]
        for k in (node["metadata"].get("labels") or {})
        if k.startswith("node-role.kubernetes.io/")
    )
    return ",".join(roles) or "<none>"


def _addr(node: dict[str, Any], kind: str) -> str:
    return next(
        (a.get("address") for a in _g(node, "status.addresses", []) if a.get("type") == kind), "<none>"
    )


def _ports(svc: dict[str, Any]) -> str:
    parts = []
    for port in _g(svc, "spec.ports", []):
        node_port = f":{port['nodePort']}" if port.get("nodePort") else ""
        parts.append(f"{port.get('port')}{node_port}/{port.get('protocol', 'TCP')}")
    return ",".join(parts) or "<none>"


def _selector(obj: dict[str, Any]) -> str:
    labels = _g(obj, "spec.selector.matchLabels", {}) or {}
    return ",".join(f"{k}={v}" for k, v in labels.items()) or "<none>"


def _containers(obj: dict[str, Any], field: str) -> str:
    return ",".join(str(c.get(field)) for c in _g(obj, "spec.template.spec.containers", []))


NAME: Col = ("Name", "string", 0, lambda o: o["metadata"]["name"])
AGE: Col = ("Age", "string", 0, _age)
COLUMNS: dict[str, list[Col]] = {
    "Pod": [
        NAME,
        ("Ready", "string", 0, _pod_ready),
        ("Status", "string", 0, _pod_status),
        ("Restarts", "string", 0, lambda o: str(_restarts(o))),
        AGE,
        ("IP", "string", 1, lambda o: _g(o, "status.podIP", "<none>")),
        ("Node", "string", 1, lambda o: _g(o, "spec.nodeName", "<none>")),
        ("Nominated Node", "string", 1, lambda o: _g(o, "status.nominatedNodeName", "<none>")),
        ("Readiness Gates", "string", 1, lambda o: "<none>"),
    ],
    "Node": [
        NAME,
        ("Status", "string", 0, _node_status),
        ("Roles", "string", 0, _node_roles),
        AGE,
        ("Version", "string", 0, lambda o: _g(o, "status.nodeInfo.kubeletVersion", "")),
        ("Internal-IP", "string", 1, lambda o: _addr(o, "InternalIP")),
        ("External-IP", "string", 1, lambda o: _addr(o, "ExternalIP")),
        ("OS-Image", "string", 1, lambda o: _g(o, "status.nodeInfo.osImage", "<unknown>")),
        ("Kernel-Version", "string", 1, lambda o: _g(o, "status.nodeInfo.kernelVersion", "<unknown>")),
        (
            "Container-Runtime",
            "string",
            1,
            lambda o: _g(o, "status.nodeInfo.containerRuntimeVersion", "<unknown>"),
        ),
    ],
    "Namespace": [NAME, ("Status", "string", 0, lambda o: _g(o, "status.phase", "")), AGE],
    "Deployment": [
        NAME,
        ("Ready", "string", 0, lambda o: f"{_g(o, 'status.readyReplicas', 0)}/{_g(o, 'spec.replicas', 0)}"),
        ("Up-to-date", "integer", 0, lambda o: _g(o, "status.updatedReplicas", 0)),
        ("Available", "integer", 0, lambda o: _g(o, "status.availableReplicas", 0)),
        AGE,
        ("Containers", "string", 1, lambda o: _containers(o, "name")),
        ("Images", "string", 1, lambda o: _containers(o, "image")),
        ("Selector", "string", 1, _selector),
    ],
    "ReplicaSet": [
        NAME,
        ("Desired", "integer", 0, lambda o: _g(o, "spec.replicas", 0)),
        ("Current", "integer", 0, lambda o: _g(o, "status.replicas", 0)),
        ("Ready", "integer", 0, lambda o: _g(o, "status.readyReplicas", 0)),
        AGE,
    ],
    "StatefulSet": [
        NAME,
        ("Ready", "string", 0, lambda o: f"{_g(o, 'status.readyReplicas', 0)}/{_g(o, 'spec.replicas', 0)}"),
        AGE,
    ],
    "DaemonSet": [
        NAME,
        ("Desired", "integer", 0, lambda o: _g(o, "status.desiredNumberScheduled", 0)),
        ("Current", "integer", 0, lambda o: _g(o, "status.currentNumberScheduled", 0)),
        ("Ready", "integer", 0, lambda o: _g(o, "status.numberReady", 0)),
        ("Up-to-date", "integer", 0, lambda o: _g(o, "status.updatedNumberScheduled", 0)),
        ("Available", "integer", 0, lambda o: _g(o, "status.numberAvailable", 0)),
        (
            "Node Selector",
            "string",
            0,
            lambda o: (
                ",".join(f"{k}={v}" for k, v in (_g(o, "spec.template.spec.nodeSelector", {}) or {}).items())
                or "<none>"
            ),
        ),
        AGE,
    ],
    "Service": [
        NAME,
        ("Type", "string", 0, lambda o: _g(o, "spec.type", "ClusterIP")),
        ("Cluster-IP", "string", 0, lambda o: _g(o, "spec.clusterIP", "<none>")),
        ("External-IP", "string", 0, lambda o: ",".join(_g(o, "spec.externalIPs", [])) or "<none>"),
        ("Port(s)", "string", 0, _ports),
        AGE,
        (
            "Selector",
            "string",
            1,
            lambda o: ",".join(f"{k}={v}" for k, v in (_g(o, "spec.selector", {}) or {}).items()) or "<none>",
        ),
    ],
    "ConfigMap": [
        NAME,
        ("Data", "integer", 0, lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {})),
        AGE,
    ],
    "Secret": [
        NAME,
        ("Type", "string", 0, lambda o: o.get("type", "")),
        ("Data", "integer", 0, lambda o: len(o.get("data") or {})),
        AGE,
    ],
    "ServiceAccount": [NAME, ("Secrets", "integer", 0, lambda o: len(o.get("secrets") or [])), AGE],
    "PodDisruptionBudget": [
        NAME,
        ("Min Available", "string", 0, lambda o: str(_g(o, "spec.minAvailable", "N/A"))),
        ("Max Unavailable", "string", 0, lambda o: str(_g(o, "spec.maxUnavailable", "N/A"))),
        ("Allowed Disruptions", "integer", 0, lambda o: _g(o, "status.disruptionsAllowed", 0)),
        AGE,
    ],
    "Event": [
        (
            "Last Seen",
            "string",
            0,
            lambda o: _age(
                {
                    "metadata": {
                        "creationTimestamp": o.get("lastTimestamp") or o.get("eventTime", "")[:19] + "Z"
                        if o.get("lastTimestamp") or o.get("eventTime")
                        else o["metadata"].get("creationTimestamp")
                    }
                }
            ),
        ),
        ("Type", "string", 0, lambda o: o.get("type", "")),
        ("Reason", "string", 0, lambda o: o.get("reason", "")),
        (
            "Object",
            "string",
            0,
            lambda o: f"{_g(o, 'involvedObject.kind', '').lower()}/{_g(o, 'involvedObject.name', '')}",
        ),
        ("Message", "string", 0, lambda o: o.get("message", o.get("note", ""))),
    ],
    "Lease": [NAME, ("Holder", "string", 0, lambda o: _g(o, "spec.holderIdentity", "")), AGE],
    "CustomResourceDefinition": [
        NAME,
        ("Created At", "date", 0, lambda o: o["metadata"].get("creationTimestamp")),
    ],
    "RuntimeClass": [NAME, ("Handler", "string", 0, lambda o: o.get("handler", "")), AGE],
    "PriorityClass": [
        NAME,
        ("Value", "integer", 0, lambda o: o.get("value", 0)),
        ("Global-Default", "boolean", 0, lambda o: bool(o.get("globalDefault"))),
        AGE,
    ],
}


def _jsonpath(obj: dict[str, Any], path: str) -> Any:
    path = path.strip().lstrip(".")
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1].lstrip(".")
    return _g(obj, path)


def _path_getter(path: str) -> Callable[[dict[str, Any]], Any]:
    return lambda obj: _jsonpath(obj, path)


def columns_for(res: Resource) -> list[Col]:
    if res.kind in COLUMNS and not res.crd:
        return COLUMNS[res.kind]
    if res.crd and res.columns:
        cols: list[Col] = [NAME]
        for name, typ, path in res.columns:
            cols.append((name, typ, 0, _path_getter(path)))
        if not any(c[0] == "Age" for c in cols):
            cols.append(AGE)
        return cols
    return [NAME, ("Created At", "date", 0, lambda o: o["metadata"].get("creationTimestamp"))]


def table(res: Resource, items: list[dict[str, Any]], rv: str, include: str) -> dict[str, Any]:
    cols = columns_for(res)
    rows = []
    for obj in items:
        cells = []
        for _, _, _, getter in cols:
            try:
                val = getter(obj)
            except (KeyError, TypeError, ValueError, IndexError):
                val = None
            cells.append(val if isinstance(val, (int, str, bool, float)) or val is None else json.dumps(val))
        row: dict[str, Any] = {"cells": cells}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": [
            {"name": n, "type": t, "format": "name" if n == "Name" else "", "description": n, "priority": p}
            for n, t, p, _ in cols
        ],
        "rows": rows,
    }
