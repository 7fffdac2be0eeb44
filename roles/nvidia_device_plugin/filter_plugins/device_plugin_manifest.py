"""The changes the nvidia_device_plugin role makes to NVIDIA's static manifest, as a filter.

Kept in Python so that the unit tests apply exactly the role's changes before validating the objects
(tests/unit/test_kubernetes_manifests.py)."""

from __future__ import annotations

import json
from typing import Any


class ManifestError(Exception):
    pass


def nvidia_device_plugin_manifest(
    docs: list[Any], runtime_class: str, node_selector: dict[str, str]
) -> list[dict[str, Any]]:
    """The manifest's objects; the DaemonSet's pods in RUNTIME_CLASS, only on nodes matching NODE_SELECTOR."""
    # plain JSON data, not copy.deepcopy of Ansible's tagged values (slow: roles/calico/filter_plugins)
    objects = [json.loads(json.dumps(doc)) for doc in docs if doc]
    daemonsets = [doc for doc in objects if doc.get("kind") == "DaemonSet"]
    if len(daemonsets) != 1:
        raise ManifestError(f"the device plugin manifest must hold one DaemonSet; it holds {len(daemonsets)}")
    pod_spec = daemonsets[0]["spec"]["template"]["spec"]
    pod_spec["runtimeClassName"] = runtime_class
    pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **node_selector}
    return objects


def allocatable_gpus(node: dict[str, Any], resource: str = "nvidia.com/gpu") -> int:
    """The node's allocatable count of RESOURCE (0 when it offers none)."""
    value = (node.get("status") or {}).get("allocatable", {}).get(resource, "0")
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "nvidia_device_plugin_manifest": nvidia_device_plugin_manifest,
            "nvidia_device_plugin_allocatable": allocatable_gpus,
        }
