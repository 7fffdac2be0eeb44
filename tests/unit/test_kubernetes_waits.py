"""plugins/filter/kubernetes_waits.py: a wait for a StatefulSet is derived from its own probes (the startup
budget), its replica count and how it creates and updates pods, plus the image pull margin; the playbooks that
wait for vLLM (serving-verify.yml, model_rollout's canary/promote/rollback) use it instead of numbers of their
own."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml
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
