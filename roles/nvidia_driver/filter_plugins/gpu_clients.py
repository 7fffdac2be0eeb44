"""Driver work and the cluster's own GPU clients, as filters of the nvidia_driver role.

The cluster's own GPU clients (vars/main.yml, __nvidia_driver_gpu_clients) keep the GPUs open on every GPU
node: the systemd units of the list, and the pods of the DaemonSets that select the GPU nodes by the GPU
node label (nvidia_device_plugin_node_label: the device plugin, dcgm-exporter). Driver work stops them on
purpose (stop-gpu-clients.yml) and brings them back (start-gpu-clients.yml); any other process that holds
a GPU is a workload, named in the refusal. Kept in Python so the unit tests drive exactly what the role
decides (tests/unit/test_driver_gpu_clients.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

EMPTY_RECORD: dict[str, Any] = {"units": [], "node_label": {}, "daemonsets": []}


def carried_labels(node: Mapping[str, Any] | None, labels: Mapping[str, Any]) -> dict[str, str]:
    """The entries of ``labels`` the Node carries with the same value (what removing them takes away)."""
    have = ((node or {}).get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items() if k in have and str(have[k]) == str(v)}


def _owner_daemonset(pod: Mapping[str, Any]) -> str | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "DaemonSet" and ref.get("controller", True):
            return str(ref.get("name"))
    return None


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return (
        not (pod.get("metadata") or {}).get("deletionTimestamp")
        and status.get("phase") == "Running"
        and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
    )


def gpu_client_pods(pods: Iterable[Mapping[str, Any]], labels: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods of the cluster's own GPU clients among a node's pods: made by a DaemonSet whose pods select
    nodes on an entry of the GPU node label ``labels`` (spec.nodeSelector), so they leave a node without it.
    Each: namespace, name, uid, daemonset (namespace/name), ready."""
    wanted = {str(k): str(v) for k, v in labels.items()}
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        owner = _owner_daemonset(pod)
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        if owner is None or not any(str(selector.get(k)) == v for k, v in wanted.items() if k in selector):
            continue
        namespace = str(meta.get("namespace", "default"))
        found.append(
            {
                "namespace": namespace,
                "name": str(meta.get("name")),
                "uid": str(meta.get("uid")),
                "daemonset": f"{namespace}/{owner}",
                "ready": _ready(pod),
            }
        )
    return sorted(found, key=lambda p: (p["namespace"], p["name"]))


def gpu_holders(
    processes: Iterable[Mapping[str, Any]],
    client_units: Iterable[str],
    pods: Iterable[Mapping[str, Any]] = (),
    labels: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The processes that hold a GPU (gpu_facts' device_processes, the driver's own daemons left out), each
    with ``client`` (one of the cluster's own GPU clients: its unit in ``client_units``, or its pod one of
    gpu_client_pods(pods, labels)) and ``text``, how a message names it: name[pid] on its devices, and the
    pod (namespace/name where ``pods`` knows it) or unit it runs in."""
    units = set(client_units)
    node_pods = list(pods)
    clients = {p["uid"] for p in gpu_client_pods(node_pods, labels or {})}
    names = {
        str((p.get("metadata") or {}).get("uid")): "{}/{}".format(
            (p.get("metadata") or {}).get("namespace", "default"), (p.get("metadata") or {}).get("name")
        )
        for p in node_pods
    }
    holders = []
    for proc in processes:
        if proc.get("driver_daemon"):
            continue
        uid, unit = proc.get("pod_uid"), proc.get("unit")
        where = f"pod {names.get(uid, uid)}" if uid else (unit or "")
        text = f"{proc['name']}[{proc['pid']}] on {' '.join(proc.get('devices') or [])}"
        holders.append(
            {
                "pid": proc["pid"],
                "name": proc["name"],
                "pod_uid": uid,
                "unit": unit,
                "client": (unit in units) if unit else uid in clients,
                "text": text + (f" ({where})" if where else ""),
            }
        )
    return holders


def merge_records(*records: Mapping[str, Any] | None) -> dict[str, Any]:
    """What is stopped, from several records (this run's, the one an earlier run left on the node): units
    and DaemonSets (namespace/name) in first-seen order, the GPU node label entries taken away."""
    merged: dict[str, Any] = {"units": [], "node_label": {}, "daemonsets": []}
    for record in records:
        for key in ("units", "daemonsets"):
            for item in (record or {}).get(key) or []:
                if item not in merged[key]:
                    merged[key].append(item)
        merged["node_label"].update((record or {}).get("node_label") or {})
    return merged


def record_empty(record: Mapping[str, Any] | None) -> bool:
    return merge_records(record) == EMPTY_RECORD


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "nvidia_driver_carried_labels": carried_labels,
            "nvidia_driver_gpu_client_pods": gpu_client_pods,
            "nvidia_driver_gpu_holders": gpu_holders,
            "nvidia_driver_merge_records": merge_records,
            "nvidia_driver_record_empty": record_empty,
        }
