"""The changes the calico role makes to Calico's upstream manifest (calico.yaml), as a filter.

Kept in Python so that the unit tests apply exactly the role's changes before validating the objects
(tests/unit/test_kubernetes_manifests.py)."""

from __future__ import annotations

import json
from typing import Any

POOL_ENV = "CALICO_IPV4POOL_CIDR"
# How calico-node finds its node's address (Calico's node configuration, IP_AUTODETECTION_METHOD).
# Upstream's default, first-found, takes the first address of the first interface, which on a server with
# InfiniBand ports and several NICs need not be node_ip; kubernetes-internal-ip takes the Node's InternalIP,
# which the kubeadm roles set to node_ip (the kubelet's --node-ip).
AUTODETECTION_ENV = "IP_AUTODETECTION_METHOD"
AUTODETECTION_METHOD = "kubernetes-internal-ip"


class ManifestError(Exception):
    pass


def calico_node_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    for doc in docs:
        if doc.get("kind") == "DaemonSet" and doc.get("metadata", {}).get("name") == "calico-node":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container.get("name") == "calico-node":
                    return container
    raise ManifestError("calico.yaml has no DaemonSet calico-node with a container calico-node")


def calico_manifest(docs: list[Any], pool_cidr: str) -> list[dict[str, Any]]:
    """The manifest's objects (empty documents dropped) with the default IPv4 pool set to POOL_CIDR and
    calico-node's address taken from the Node's InternalIP.

    Upstream leaves CALICO_IPV4POOL_CIDR commented out, so calico-node would pick 192.168.0.0/16;
    the pool must be the cluster's podSubnet. It sets no IP_AUTODETECTION_METHOD (first-found)."""
    # A copy as plain JSON data: copy.deepcopy of the values Ansible's templating hands a filter (tagged with
    # their origin) took about 60 s for the manifest's 350 KB on the lab's controller; this takes a second.
    objects = [json.loads(json.dumps(doc)) for doc in docs if doc]
    container = calico_node_container(objects)
    ours = (POOL_ENV, AUTODETECTION_ENV)
    env = [entry for entry in container.get("env", []) if entry.get("name") not in ours]
    env.append({"name": POOL_ENV, "value": pool_cidr})
    env.append({"name": AUTODETECTION_ENV, "value": AUTODETECTION_METHOD})
    container["env"] = env
    return objects


def calico_pool_cidr(daemonset: dict[str, Any]) -> str:
    """CALICO_IPV4POOL_CIDR of a running calico-node DaemonSet ('' when unset)."""
    for container in daemonset.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        if container.get("name") == "calico-node":
            for entry in container.get("env", []):
                if entry.get("name") == POOL_ENV:
                    return str(entry.get("value", ""))
    return ""


def ready_pod_nodes(pods: list[dict[str, Any]]) -> list[str]:
    """Names of the nodes where a pod of PODS (k8s_info resources) is Running with condition Ready True."""
    nodes = []
    for pod in pods:
        status = pod.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        if status.get("phase") == "Running" and ready and pod.get("spec", {}).get("nodeName"):
            nodes.append(pod["spec"]["nodeName"])
    return sorted(set(nodes))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "calico_manifest": calico_manifest,
            "calico_pool_cidr": calico_pool_cidr,
            "calico_ready_pod_nodes": ready_pod_nodes,
        }
