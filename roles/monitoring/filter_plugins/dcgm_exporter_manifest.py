"""The changes the monitoring role makes to NVIDIA's static dcgm-exporter manifest, as a filter.

Kept in Python so that the unit tests apply exactly the role's changes before validating the objects
(tests/unit/test_monitoring_workloads.py)."""

from __future__ import annotations

import json
from typing import Any

COUNTERS_DIR = "/etc/dcgm-exporter/llm-serving"
PORT = 9400
# a GPU node stays watched when it is tainted for GPU work only (as the device plugin tolerates) or is the
# control plane with its NoSchedule taint kept (kubeadm_control_plane_keep_taint)
TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
]


class ManifestError(Exception):
    pass


def dcgm_exporter_manifest(
    docs: list[Any],
    namespace: str,
    image_digest: str,
    node_selector: dict[str, str],
    runtime_class: str,
    counters_configmap: str,
    counters_checksum: str,
) -> list[dict[str, Any]]:
    """The manifest's objects in NAMESPACE; the DaemonSet's image pinned to IMAGE_DIGEST (the manifest's tag
    kept for the reader), its pods only on nodes matching NODE_SELECTOR in RUNTIME_CLASS, reading the counters
    file of ConfigMap COUNTERS_CONFIGMAP (COUNTERS_CHECKSUM rolls the pods when it changes), annotated for
    Prometheus's annotation-based scraping."""
    # plain JSON data, not copy.deepcopy of Ansible's tagged values (slow: roles/calico/filter_plugins)
    objects = [json.loads(json.dumps(doc)) for doc in docs if doc]
    daemonsets = [doc for doc in objects if doc.get("kind") == "DaemonSet"]
    if len(daemonsets) != 1:
        raise ManifestError(f"the dcgm-exporter manifest must hold one DaemonSet; it holds {len(daemonsets)}")
    for doc in objects:
        doc["metadata"]["namespace"] = namespace
        doc["metadata"].setdefault("labels", {})["app.kubernetes.io/part-of"] = "llm-serving"
    template = daemonsets[0]["spec"]["template"]
    template["metadata"]["labels"]["app.kubernetes.io/part-of"] = "llm-serving"
    template["metadata"]["annotations"] = {
        **(template["metadata"].get("annotations") or {}),
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(PORT),
        "prometheus.io/path": "/metrics",
        "checksum/counters": counters_checksum,
    }
    pod = template["spec"]
    pod["runtimeClassName"] = runtime_class
    pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **node_selector}
    pod["tolerations"] = [
        *(pod.get("tolerations") or []),
        *(t for t in TOLERATIONS if t not in (pod.get("tolerations") or [])),
    ]
    containers = [c for c in pod["containers"] if c["name"] == "dcgm-exporter"]
    if len(containers) != 1:
        raise ManifestError("the dcgm-exporter DaemonSet must hold one container named dcgm-exporter")
    container = containers[0]
    image = container["image"].split("@", 1)[0]
    container["image"] = f"{image}@{image_digest}"
    container["imagePullPolicy"] = "IfNotPresent"
    env = [e for e in container.get("env", []) if e["name"] != "DCGM_EXPORTER_COLLECTORS"]
    env.append({"name": "DCGM_EXPORTER_COLLECTORS", "value": f"{COUNTERS_DIR}/counters.csv"})
    container["env"] = env
    container.setdefault("volumeMounts", []).append(
        {"name": "counters", "mountPath": COUNTERS_DIR, "readOnly": True}
    )
    pod.setdefault("volumes", []).append({"name": "counters", "configMap": {"name": counters_configmap}})
    return objects


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"monitoring_dcgm_exporter_manifest": dcgm_exporter_manifest}
