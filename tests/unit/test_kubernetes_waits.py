"""plugins/filter/kubernetes_waits.py: a wait for a StatefulSet is derived from its own probes (the startup
budget), its replica count and how it creates and updates pods, plus the image pull margin; the playbooks that
wait for vLLM (serving-verify.yml, model_rollout's canary/promote/rollback) use it instead of numbers of their
own."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import real_kube
import yaml
from role_render import RoleVars
from test_serving_manifests import MODEL, render, role_vars

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location(
    "kubernetes_waits", ROOT / "plugins/filter/kubernetes_waits.py"
)
assert _SPEC and _SPEC.loader
waits = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(waits)

SETTLED = {"observedGeneration": 1, "currentRevision": "r1", "updateRevision": "r1", "updatedReplicas": 2}


def statefulset(status: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    sts = render("statefulset.yml.j2", MODEL, **overrides)
    sts["metadata"]["generation"] = 1
    sts["status"] = {**SETTLED, **(status or {})}
    return sts


def test_the_default_vllm_statefulset() -> None:
    """Two replicas, a 900 s startup budget (10 s x 90), readiness every 5 s, 600 s to pull, 60 s grace."""
    margin = role_vars()["vllm_serving_image_pull_margin_s"]
    assert margin == 600
    pod = 600 + 900 + 5
    # created together (Parallel): the slowest pod
    assert waits.k8s_statefulset_ready_wait_s(statefulset(), margin) == pod
    # a new revision rolls one pod at a time, each after the old one terminated
    assert waits.k8s_statefulset_ready_wait_s(statefulset({"updateRevision": "r2"}), margin) == 2 * (60 + pod)
    # just applied, the controller has not seen it yet: counted as a roll
    just_applied = statefulset()
    just_applied["metadata"]["generation"] = 2
    assert waits.k8s_statefulset_ready_wait_s(just_applied, margin) == 2 * (60 + pod)
    # the same in polls of 5 s
    assert waits.k8s_statefulset_ready_wait_s(statefulset(), margin, 5) == 301


def test_the_wait_follows_the_startup_budget_and_the_replicas() -> None:
    longer = statefulset(vllm_serving_startup_budget_s=1800)
    assert waits.k8s_statefulset_ready_wait_s(longer, 0) == 1800 + 5
    three = render("statefulset.yml.j2", {**MODEL, "replicas": 3})
    three["status"] = {**SETTLED, "updateRevision": "r2"}
    assert waits.k8s_statefulset_ready_wait_s(three, 0) == 3 * (60 + 905)


def test_ordered_creation_and_api_defaults() -> None:
    sts = statefulset()
    sts["spec"]["podManagementPolicy"] = "OrderedReady"
    assert waits.k8s_statefulset_ready_wait_s(sts, 0) == 2 * 905
    bare: dict[str, Any] = copy.deepcopy(sts)
    container = bare["spec"]["template"]["spec"]["containers"][0]
    container["startupProbe"] = {"httpGet": {"path": "/health", "port": "http"}}  # 10 s x 3 by default
    del container["readinessProbe"]
    del bare["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]  # 30 s by default
    bare["status"]["updateRevision"] = "r2"
    assert waits.k8s_statefulset_ready_wait_s(bare, 0) == 2 * (30 + 30)


@pytest.mark.parametrize("sts", [None, {}, {"spec": {"replicas": 0}}])
def test_nothing_to_wait_for(sts: Any) -> None:
    assert waits.k8s_statefulset_ready_wait_s(sts, 600, 5) == 0


def test_the_waiting_playbooks_derive_their_wait() -> None:
    """No wait of their own: serving-verify.yml and model_rollout's wait-ready.yml compute it per StatefulSet
    with this filter and vllm_serving_image_pull_margin_s."""
    verify = (ROOT / "playbooks/serving-verify.yml").read_text()
    rollout = (ROOT / "roles/model_rollout/tasks/wait-ready.yml").read_text()
    for text in (verify, rollout):
        assert "k8s_statefulset_ready_wait_s(vllm_serving_image_pull_margin_s" in text
    assert "serving_verify_wait_s" not in verify
    wait_task = next(
        t for t in yaml.safe_load(verify)[0]["tasks"] if "until" in t and "StatefulSet" in t["name"]
    )
    assert "k8s_statefulset_ready_wait_s" in str(wait_task["retries"])


# ------------------------------------------------------------------------------------------ Deployments
def gateway_deployment(checksum: str = "c1") -> dict[str, Any]:
    """The llm_gateway role's Deployment as its template renders it (its defaults, a digest, a checksum)."""
    role = RoleVars(
        "llm_gateway",
        llm_gateway_image_digest="sha256:" + "cd" * 32,
        _llm_gateway_config_text=checksum,
        _llm_gateway_secret_checksum="s1",
    )
    return dict(yaml.safe_load(role.render_template("deployment.yml.j2")))


def test_the_gateway_rollout_wait_is_the_deployments_own() -> None:
    """Two replicas, one surge pod at a time and none unavailable: two waves, each given the controller's
    progressDeadlineSeconds (600 s, the API's default, which the role leaves), then the old pods' grace."""
    deployment = gateway_deployment()
    assert "progressDeadlineSeconds" not in deployment["spec"]
    assert waits.k8s_deployment_rollout_wait_s(deployment) == 2 * 600 + 30
    assert waits.k8s_deployment_rollout_wait_s(deployment, 5) == 246
    deployment["spec"]["progressDeadlineSeconds"] = 120
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 10
    assert waits.k8s_deployment_rollout_wait_s(deployment) == 2 * 120 + 10


@pytest.mark.parametrize(
    ("replicas", "strategy", "waves"),
    [
        (4, {}, 2),  # the API's 25 % / 25 %: one surge, one unavailable
        (10, {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}, 2),  # 3 up, 2 down
        (3, {"rollingUpdate": {"maxSurge": 3, "maxUnavailable": 0}}, 1),
        (5, {"rollingUpdate": {"maxSurge": "10%", "maxUnavailable": "10%"}}, 5),  # 1 up (ceil), 0 down
    ],
)
def test_waves_of_a_rolling_update(replicas: int, strategy: dict[str, Any], waves: int) -> None:
    deployment = {"spec": {"replicas": replicas, "strategy": {"type": "RollingUpdate", **strategy}}}
    assert waits.k8s_deployment_rollout_wait_s(deployment) == waves * 600 + 30


def test_recreate_nothing_and_no_replicas() -> None:
    assert waits.k8s_deployment_rollout_wait_s({"spec": {"strategy": {"type": "Recreate"}}}) == 30 + 600
    assert waits.k8s_deployment_rollout_wait_s({"spec": {"replicas": 0}}) == 30  # the old pods terminate
    assert waits.k8s_deployment_rollout_wait_s(None, 5) == 0


def with_status(generation: int = 2, **status: Any) -> dict[str, Any]:
    deployment = gateway_deployment()
    deployment["metadata"]["generation"] = generation
    settled = {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}
    deployment["status"] = {**settled, "readyReplicas": 2, "terminatingReplicas": 0, **status}
    return deployment


@pytest.mark.parametrize(
    ("deployment", "rolled_out"),
    [
        (with_status(), True),
        (with_status(generation=3), False),  # applied, not yet seen by the controller
        (with_status(replicas=3), False),  # the surge pod beside an old one
        (with_status(updatedReplicas=1), False),
        (with_status(availableReplicas=1), False),
        # every new pod ready, an old one still terminating: it serves its requests with the old weights
        (with_status(terminatingReplicas=1), False),
        (None, False),
    ],
    ids=["settled", "not-observed", "surge", "half-updated", "not-available", "old-terminating", "none"],
)
def test_rolled_out(deployment: Any, rolled_out: bool) -> None:
    assert waits.k8s_deployment_rolled_out(deployment) is rolled_out


def test_a_stalled_rollout_is_named_by_the_controllers_condition() -> None:
    stuck = {
        "type": "Progressing",
        "status": "False",
        "reason": "ProgressDeadlineExceeded",
        "message": 'ReplicaSet "llm-gateway-5d4" has timed out progressing.',
    }
    assert waits.k8s_deployment_stalled(with_status(conditions=[stuck])) == stuck["message"]
    # a condition left from an earlier rollout does not speak for a spec the controller has not seen
    assert waits.k8s_deployment_stalled(with_status(generation=3, conditions=[stuck])) == ""
    progressing = {**stuck, "status": "True", "reason": "ReplicaSetUpdated"}
    assert waits.k8s_deployment_stalled(with_status(conditions=[progressing])) == ""
    assert waits.k8s_deployment_stalled(None) == ""


# The real controllers: kube-apiserver and the Deployment and ReplicaSet controllers of the production pin
# (real_kube.py). No kubelet runs: Kubelet below binds the pods, marks them Ready, and keeps a deleted pod
# terminating for a while before it removes it, as a kubelet does while the container stops within its grace.
ROLL_CONTROLLERS = ("serviceaccount-controller", "deployment-controller", "replicaset-controller")
TERMINATING_S = 3.0


@pytest.fixture(scope="module")
def kube_rollouts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[real_kube.ControlPlane]:
    with real_kube.control_plane(tmp_path_factory.mktemp("rollouts")) as plane:
        plane.start_controllers(ROLL_CONTROLLERS)
        plane.register_node("unit-node", {}, "127.0.0.1")
        plane.admin.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "serving"}})
        yield plane


class Kubelet:
    def __init__(self, api: real_kube.Client, namespace: str, name: str) -> None:
        self.api, self.path = api, f"/api/v1/namespaces/{namespace}/pods"
        self.selector = f"labelSelector=app.kubernetes.io/name={name}"
        self.terminating: dict[str, float] = {}

    def pods(self) -> list[dict[str, Any]]:
        return list(self.api.ok("GET", f"{self.path}?{self.selector}")["items"])

    def step(self) -> None:
        now = time.monotonic()
        for pod in self.pods():
            name = pod["metadata"]["name"]
            if pod["metadata"].get("deletionTimestamp"):
                if now - self.terminating.setdefault(name, now) >= TERMINATING_S:
                    self.api.ok("DELETE", f"{self.path}/{name}", {"gracePeriodSeconds": 0})
            elif not pod["spec"].get("nodeName"):
                binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": "unit-node"}}
                self.api.ok("POST", f"{self.path}/{name}/binding", binding)
            elif pod.get("status", {}).get("phase") != "Running":
                ready = {"type": "Ready", "status": "True", "lastTransitionTime": now_utc()}
                status = {"phase": "Running", "podIP": "10.244.0.9", "conditions": [ready]}
                self.api.ok("PATCH", f"{self.path}/{name}/status", {"status": status}, MERGE)


MERGE = "application/merge-patch+json"


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def test_rolled_out_only_once_no_old_pod_is_left(kube_rollouts: real_kube.ControlPlane) -> None:
    """The gateway's Deployment, rolled by the real controllers to a new configuration checksum: the pods of
    the old one keep terminating after every new pod is ready (what updatedReplicas == readyReplicas ==
    replicas, the older wait, took for done), and k8s_deployment_rolled_out is true only once none is left."""
    api, kubelet = kube_rollouts.admin, Kubelet(kube_rollouts.admin, "serving", "llm-gateway")
    path = "/apis/apps/v1/namespaces/serving/deployments/llm-gateway"
    deployment = gateway_deployment("first")
    api.ok("POST", "/apis/apps/v1/namespaces/serving/deployments", deployment)
    first = api.ok("GET", path)
    # the API's defaults are what the wait reads: 600 s progress deadline, 30 s grace
    assert waits.k8s_deployment_rollout_wait_s(first) == 2 * 600 + 30

    def roll(checksum: str) -> list[tuple[bool, bool, bool]]:
        """(rolled out, naively done, a pod of another checksum left) at each look until rolled out."""
        seen = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            kubelet.step()
            now = api.ok("GET", path)
            others = [
                p for p in kubelet.pods() if p["metadata"]["annotations"]["checksum/config"] != checksum
            ]
            status, replicas = now.get("status", {}), now["spec"]["replicas"]
            naive = (
                status.get("observedGeneration", 0) >= now["metadata"]["generation"]
                and status.get("updatedReplicas") == replicas
                and status.get("readyReplicas") == replicas
            )
            seen.append((waits.k8s_deployment_rolled_out(now), naive, bool(others)))
            if seen[-1][0]:
                return seen
            time.sleep(0.2)
        raise AssertionError(f"not rolled out: {now.get('status')}")

    looks = roll(hashlib.sha256(b"first").hexdigest())  # the template's checksum of the configuration
    assert not looks[-1][2]
    patch = {"spec": {"template": {"metadata": {"annotations": {"checksum/config": "second"}}}}}
    api.ok("PATCH", path, patch, MERGE)
    looks = roll("second")
    assert all(not others for rolled_out, _, others in looks if rolled_out), looks
    assert any(naive and others for _, naive, others in looks), "no old pod was seen terminating"
    assert not looks[0][0], "rolled out before the controller saw the change"


def test_a_stalled_rollout_is_seen(kube_rollouts: real_kube.ControlPlane) -> None:
    """No pod ever ready (no kubelet here): the controller gives up after progressDeadlineSeconds and the
    wait can stop at once, with its message."""
    api = kube_rollouts.admin
    deployment = gateway_deployment("stuck")
    deployment["metadata"]["name"] = "stuck"
    deployment["spec"]["selector"]["matchLabels"] = {"app.kubernetes.io/name": "stuck"}
    deployment["spec"]["template"]["metadata"]["labels"] = {"app.kubernetes.io/name": "stuck"}
    deployment["spec"]["progressDeadlineSeconds"] = 2
    api.ok("POST", "/apis/apps/v1/namespaces/serving/deployments", deployment)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = api.ok("GET", "/apis/apps/v1/namespaces/serving/deployments/stuck")
        if waits.k8s_deployment_stalled(now):
            break
        time.sleep(0.5)
    assert "progressing" in waits.k8s_deployment_stalled(now), now.get("status")
    assert not waits.k8s_deployment_rolled_out(now)


def test_ready_node_names() -> None:
    """The verification's one wait for every node: Ready True only (not False, Unknown or no condition)."""

    def node(name: str, *conditions: tuple[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "status": {"conditions": [{"type": t, "status": v, "reason": "Kubelet"} for t, v in conditions]},
        }

    nodes = [
        node("a", ("MemoryPressure", "False"), ("Ready", "True")),
        node("b", ("Ready", "False")),
        node("c", ("Ready", "Unknown")),
        node("d"),
        {"metadata": {"name": "e"}},
    ]
    assert waits.ready_node_names(nodes) == ["a"]
    assert waits.ready_node_names(None) == []
