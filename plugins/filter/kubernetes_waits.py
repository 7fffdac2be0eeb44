"""How long to wait for a StatefulSet to be ready, or for a Deployment to roll out, computed from the object
itself; and when a Deployment has rolled out.

One home for the rule (docs/CONTRACTS.md, "Roles"): a wait is derived from the probe settings that make a
pod's startup budget, the replica count, the way the StatefulSet creates and updates its pods, and a margin
for pulling the image, never a number of its own. playbooks/serving-verify.yml and roles/model_rollout use
it with the StatefulSet read from the cluster; found through ``filter_plugins`` in ansible.cfg.

- A pod is ready at most ``pull margin + startup probe window + one readiness period`` after it is created:
  the kubelet pulls the image first (no probe covers that), the startup probe then allows
  ``initialDelaySeconds + periodSeconds x failureThreshold``, and the readiness probe needs one success after.
- Pods created together (``podManagementPolicy: Parallel``, nothing to update): one pod's time.
- A rolling update replaces one pod at a time, each after the previous one is ready, and waits for the old
  pod to terminate (``terminationGracePeriodSeconds``) before creating its replacement:
  ``replicas x (grace + pod)``; ``OrderedReady`` creation is one pod at a time too, without the grace.

A Deployment (the gateway: roles/llm_gateway/tasks/wait-rolled-out.yml, which model_rollout runs after each
change of the weights) has a setting of its own for this: ``progressDeadlineSeconds``, the longest its
controller lets one step of a rollout take (a wave of new pods created, pulled, started and available) before
it reports the rollout failed (condition Progressing False, reason ProgressDeadlineExceeded).

- A rolling update makes ``maxSurge + maxUnavailable`` pods new at a time (as the controller resolves them: a
  percentage of the replicas, the surge rounded up, the unavailable down; both 0 means one unavailable), each
  wave within the deadline; the old pods of the last wave then terminate (``terminationGracePeriodSeconds``):
  ``waves x deadline + grace``. ``Recreate`` stops every old pod first, then starts the new ones together:
  ``grace + deadline``.
- Rolled out: the controller has seen the latest spec, every replica is of the new template and available, no
  other pod counts, and none is terminating (``status.terminatingReplicas``, Kubernetes 1.35 and later: a
  terminating pod still serves the requests it holds, with its old configuration). Where the field is absent
  (its feature gate off) terminating pods cannot be seen, and count as none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# The API's defaults for fields a StatefulSet may leave out.
_PROBE_PERIOD_S = 10
_PROBE_FAILURE_THRESHOLD = 3
_TERMINATION_GRACE_S = 30
_PROGRESS_DEADLINE_S = 600
_ROLLING_DEFAULT = "25%"


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj or obj[key] is None:
            return default
        obj = obj[key]
    return obj


def pod_ready_s(pod_spec: Mapping[str, Any], pull_margin_s: int) -> int:
    """Seconds from a pod's creation until it may at the latest be ready (its first container with a startup
    probe, else its first container)."""
    containers = _get(pod_spec, "containers", default=[]) or [{}]
    container = next((c for c in containers if _get(c, "startupProbe")), containers[0])
    startup = _get(container, "startupProbe", default={})
    readiness = _get(container, "readinessProbe", default={})
    window = 0
    if startup:
        window = _get(startup, "initialDelaySeconds", default=0) + _get(
            startup, "periodSeconds", default=_PROBE_PERIOD_S
        ) * _get(startup, "failureThreshold", default=_PROBE_FAILURE_THRESHOLD)
    if readiness:
        window += _get(readiness, "initialDelaySeconds", default=0) if not startup else 0
        window += _get(readiness, "periodSeconds", default=_PROBE_PERIOD_S) * _get(
            readiness, "successThreshold", default=1
        )
    return int(pull_margin_s) + int(window)


def rolling(statefulset: Mapping[str, Any]) -> bool:
    """Whether pods are (or are about to be) replaced one by one: the controller has not seen the latest spec
    yet, or not every replica runs the update revision."""
    replicas = _get(statefulset, "spec", "replicas", default=1)
    status = _get(statefulset, "status", default={})
    generation = _get(statefulset, "metadata", "generation", default=0)
    if _get(status, "observedGeneration", default=0) < generation:
        return True
    if _get(status, "currentRevision") != _get(status, "updateRevision"):
        return True
    return _get(status, "updatedReplicas", default=0) < replicas


def statefulset_ready_wait_s(statefulset: Mapping[str, Any], pull_margin_s: int = 0) -> int:
    """The longest a StatefulSet may take to have every replica ready on its current spec; 0 for none."""
    if not statefulset:
        return 0
    spec = _get(statefulset, "spec", default={})
    replicas = int(_get(spec, "replicas", default=1))
    if replicas == 0:
        return 0
    pod_spec = _get(spec, "template", "spec", default={})
    pod = pod_ready_s(pod_spec, pull_margin_s)
    grace = int(_get(pod_spec, "terminationGracePeriodSeconds", default=_TERMINATION_GRACE_S))
    updates_by_rolling = _get(spec, "updateStrategy", "type", default="RollingUpdate") == "RollingUpdate"
    if updates_by_rolling and rolling(statefulset):
        return replicas * (grace + pod)
    if _get(spec, "podManagementPolicy", default="OrderedReady") == "Parallel":
        return pod
    return replicas * pod


def k8s_statefulset_ready_wait_s(statefulset: Any, pull_margin_s: int = 0, poll_s: int = 0) -> int:
    """statefulset_ready_wait_s; with POLL_S, the number of polls of POLL_S seconds that cover it."""
    wait = statefulset_ready_wait_s(statefulset or {}, int(pull_margin_s))
    return math.ceil(wait / int(poll_s)) if poll_s else wait


def _rolling_bound(value: Any, replicas: int, round_up: bool) -> int:
    """maxSurge (ROUND_UP) or maxUnavailable: a number, or a percentage of the replicas."""
    if isinstance(value, str) and value.endswith("%"):
        share = int(value[:-1]) * replicas / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(value)


def deployment_rollout_wait_s(deployment: Mapping[str, Any]) -> int:
    """The longest a Deployment's rollout may take before its controller reports it failed; 0 for none."""
    if not deployment:
        return 0
    spec = _get(deployment, "spec", default={})
    replicas = int(_get(spec, "replicas", default=1))
    deadline = int(_get(spec, "progressDeadlineSeconds", default=_PROGRESS_DEADLINE_S))
    grace = int(_get(spec, "template", "spec", "terminationGracePeriodSeconds", default=_TERMINATION_GRACE_S))
    if replicas == 0:
        return grace
    if _get(spec, "strategy", "type", default="RollingUpdate") == "Recreate":
        return grace + deadline
    rolling_update = _get(spec, "strategy", "rollingUpdate", default={})
    surge = _rolling_bound(_get(rolling_update, "maxSurge", default=_ROLLING_DEFAULT), replicas, True)
    unavailable = _rolling_bound(
        _get(rolling_update, "maxUnavailable", default=_ROLLING_DEFAULT), replicas, False
    )
    waves = math.ceil(replicas / ((surge + unavailable) or 1))
    return waves * deadline + grace


def deployment_rolled_out(deployment: Mapping[str, Any]) -> bool:
    """Every replica of the Deployment's current template available; no other pod, terminating included."""
    if not deployment:
        return False
    replicas = int(_get(deployment, "spec", "replicas", default=1))
    status = _get(deployment, "status", default={})
    if _get(status, "observedGeneration", default=0) < _get(deployment, "metadata", "generation", default=0):
        return False
    counts = ("updatedReplicas", "replicas", "availableReplicas")
    if any(int(_get(status, count, default=0)) != replicas for count in counts):
        return False
    return int(_get(status, "terminatingReplicas", default=0)) == 0


def deployment_stalled(deployment: Mapping[str, Any]) -> str:
    """The controller's message when it has given up on the current rollout (ProgressDeadlineExceeded), else
    ''."""
    status = _get(deployment, "status", default={})
    if _get(status, "observedGeneration", default=0) < _get(deployment, "metadata", "generation", default=0):
        return ""
    for condition in _get(status, "conditions", default=[]) or []:
        if (
            _get(condition, "type") == "Progressing"
            and _get(condition, "status") == "False"
            and _get(condition, "reason") == "ProgressDeadlineExceeded"
        ):
            return str(_get(condition, "message", default="ProgressDeadlineExceeded"))
    return ""


def k8s_deployment_rollout_wait_s(deployment: Any, poll_s: int = 0) -> int:
    """deployment_rollout_wait_s; with POLL_S, the number of polls of POLL_S seconds that cover it."""
    wait = deployment_rollout_wait_s(deployment or {})
    return math.ceil(wait / int(poll_s)) if poll_s else wait


def k8s_deployment_rolled_out(deployment: Any) -> bool:
    return deployment_rolled_out(deployment or {})


def ready_node_names(nodes: Any) -> list[str]:
    """The names of the Nodes whose condition Ready is True: what the kubelet last reported and the node
    lifecycle controller has not since marked Unknown."""
    names = []
    for node in nodes or []:
        conditions = _get(node, "status", "conditions", default=None) or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            names.append(_get(node, "metadata", "name", default=""))
    return names


def k8s_deployment_stalled(deployment: Any) -> str:
    return deployment_stalled(deployment or {})


class FilterModule:
    """k8s_statefulset_ready_wait_s; k8s_deployment_rollout_wait_s, k8s_deployment_rolled_out,
    k8s_deployment_stalled; k8s_ready_node_names (a wait for several Nodes in one read)."""

    def filters(self) -> dict[str, Any]:
        return {
            "k8s_statefulset_ready_wait_s": k8s_statefulset_ready_wait_s,
            "k8s_deployment_rollout_wait_s": k8s_deployment_rollout_wait_s,
            "k8s_deployment_rolled_out": k8s_deployment_rolled_out,
            "k8s_deployment_stalled": k8s_deployment_stalled,
            "k8s_ready_node_names": ready_node_names,
        }
