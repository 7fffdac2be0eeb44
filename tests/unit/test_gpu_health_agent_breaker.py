"""The circuit breaker rule (module_utils/gpu_breaker.py), shared by the GPU health agent,
playbooks/remediate/ecc-cordon.yml and playbooks/upgrade-driver.yml (module gpu_cordon_plan), and the
decisions built on it."""

from __future__ import annotations

import json
from typing import Any

import gpu_cordon_plan
import pytest
from ansible.module_utils.gpu_breaker import (
    CORDON_ANNOTATION,
    HISTORY_ANNOTATION,
    HISTORY_LENGTH,
    cordon_limit,
    cordon_patches,
    history_with,
    plan,
    rolling_plan,
    uncordon_patch,
)
from conftest import run_module

BAD = {
    "verdict": "unhealthy",
    "reasons": [],
    "msg": "unhealthy: GPU 1 ecc_uncorrectable_volatile",
    "gpus": [
        {"index": 0, "uuid": "GPU-a", "verdict": "healthy", "reasons": []},
        {"index": 1, "uuid": "GPU-b", "verdict": "unhealthy", "reasons": ["ecc_uncorrectable_volatile"]},
    ],
}
DEGRADED = {
    "verdict": "degraded",
    "reasons": [],
    "msg": "degraded: GPU 0 ecc_corrected_over_threshold",
    "gpus": [
        {"index": 0, "uuid": "GPU-c", "verdict": "degraded", "reasons": ["ecc_corrected_over_threshold"]}
    ],
}
OK = {"verdict": "healthy", "reasons": [], "msg": "healthy", "gpus": []}


def node(name: str, cordoned: bool = False, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"unschedulable": True} if cordoned else {},
    }


@pytest.mark.parametrize(
    ("nodes", "percent", "limit"),
    [(3, 34, 1), (3, 33, 0), (3, 67, 2), (3, 100, 2), (1, 100, 0), (10, 34, 3), (0, 34, 0), (2, 50, 1)],
)
def test_cordon_limit_share_rounded_down_never_the_last(nodes: int, percent: int, limit: int) -> None:
    assert cordon_limit(nodes, percent) == limit


def test_cordon_limit_refuses_a_bad_percent() -> None:
    with pytest.raises(ValueError, match="max_cordoned_percent"):
        cordon_limit(3, 101)


def test_plan_one_of_three() -> None:
    three = {"gpu-node-1": False, "gpu-node-2": False, "gpu-node-3": False}
    both = plan(three, ["gpu-node-3", "gpu-node-2"])
    assert both.cordon == ["gpu-node-2"]
    assert list(both.held_back) == ["gpu-node-3"]
    assert "1 of 3 GPU nodes cordoned already, at most 1" in both.held_back["gpu-node-3"]
    after = plan({**three, "gpu-node-2": True}, ["gpu-node-2", "gpu-node-3"])
    assert (after.cordon, after.already_cordoned, list(after.held_back)) == (
        [],
        ["gpu-node-2"],
        ["gpu-node-3"],
    )
    # a node cordoned by hand counts too
    assert plan({**three, "gpu-node-1": True}, ["gpu-node-3"]).cordon == []
    assert plan(three, ["gpu-node-9"]).held_back == {"gpu-node-9": "not a known GPU node of the cluster"}


def test_plan_never_the_last_schedulable_node() -> None:
    two = {"a": True, "b": False}
    result = plan(two, ["b"], max_cordoned_percent=100)
    assert result.cordon == []
    assert "last schedulable GPU node" in result.held_back["b"]


def test_cordon_patches_annotate_reason_gpu_time_and_report_same_reason() -> None:
    nodes = [node("gpu-node-1"), node("gpu-node-2"), node("gpu-node-3")]
    health = {"gpu-node-1": OK, "gpu-node-2": BAD, "gpu-node-3": DEGRADED}
    result = cordon_patches(nodes, health, "ecc-cordon.yml", "2026-12-01T00:00:00Z")
    assert result["cordon"] == ["gpu-node-2"] and result["unhealthy"] == ["gpu-node-2"]
    patch = result["patches"]["gpu-node-2"]
    assert patch["spec"] == {"unschedulable": True}
    record = json.loads(patch["metadata"]["annotations"][CORDON_ANNOTATION])
    assert record == {
        "by": "ecc-cordon.yml",
        "time": "2026-12-01T00:00:00Z",
        "reasons": ["ecc_uncorrectable_volatile"],
        "gpus": [{"index": 1, "uuid": "GPU-b"}],
        "message": "GPU 1: ecc_uncorrectable_volatile",
    }
    # the same state once cordoned (by the agent): reported, nothing to patch
    nodes[1] = node("gpu-node-2", True, patch["metadata"]["annotations"])
    again = cordon_patches(nodes, health, "ecc-cordon.yml", "2026-12-01T00:05:00Z")
    assert (again["cordon"], again["patches"], again["already_same_reason"]) == ([], {}, ["gpu-node-2"])
    # cordoned by hand: reported as another reason
    nodes[1] = node("gpu-node-2", True)
    other = cordon_patches(nodes, health, "ecc-cordon.yml", "t")
    assert other["already_other_reason"] == {"gpu-node-2": "cordoned without a GPU health annotation"}


def test_uncordon_refused_while_unhealthy_forced_is_recorded() -> None:
    annotations = {CORDON_ANNOTATION: json.dumps({"reasons": ["ecc_uncorrectable_volatile"], "message": "m"})}
    cordoned = node("gpu-node-2", True, annotations)
    patch, why = uncordon_patch(cordoned, BAD, "uncordon.yml", "t", force=False)
    assert patch is None and why.startswith("refused") and "ecc_uncorrectable_volatile" in why
    patch, why = uncordon_patch(cordoned, BAD, "uncordon.yml", "t", force=True)
    assert patch is not None and why.startswith("force-uncordon")
    assert patch["spec"] == {"unschedulable": None}
    assert patch["metadata"]["annotations"][CORDON_ANNOTATION] is None
    history = json.loads(patch["metadata"]["annotations"][HISTORY_ANNOTATION])
    assert history[-1]["action"] == "force-uncordon" and history[-1]["forced"] is True
    assert history[-1]["cordon"]["reasons"] == ["ecc_uncorrectable_volatile"]
    patch, why = uncordon_patch(cordoned, OK, "uncordon.yml", "t", force=False)
    assert patch is not None and why.startswith("uncordon")
    assert uncordon_patch(node("gpu-node-2"), OK, "uncordon.yml", "t", force=False)[0] is None


def test_history_is_bounded_and_survives_garbage() -> None:
    text = None
    for i in range(HISTORY_LENGTH + 5):
        text = history_with(text, "cordon", {"n": i})
    history = json.loads(text or "[]")
    assert len(history) == HISTORY_LENGTH and history[-1]["n"] == HISTORY_LENGTH + 4
    assert json.loads(history_with("not json", "cordon", {"n": 1})) == [{"action": "cordon", "n": 1}]


def test_module_cordon_and_uncordon() -> None:
    nodes = [node("gpu-node-1"), node("gpu-node-2"), node("gpu-node-3")]
    failed, result = run_module(
        gpu_cordon_plan,
        {"action": "cordon", "nodes": nodes, "health": {"gpu-node-2": BAD, "gpu-node-3": BAD}, "by": "x"},
        check_mode=True,
    )
    assert not failed and result["changed"] is False
    assert result["cordon"] == ["gpu-node-2"] and list(result["held_back"]) == ["gpu-node-3"]
    assert result["annotation"] == CORDON_ANNOTATION
    assert "held back: gpu-node-3" in result["msg"]
    failed, result = run_module(
        gpu_cordon_plan,
        {"action": "uncordon", "node": "gpu-node-9", "nodes": nodes, "health": OK, "by": "x"},
    )
    assert failed and "gpu-node-9 is not among the GPU nodes" in result["msg"]
    failed, result = run_module(
        gpu_cordon_plan,
        {"action": "cordon", "nodes": nodes, "health": {}, "by": "x", "max_cordoned_percent": 150},
    )
    assert failed and "max_cordoned_percent must be 0..100" in result["msg"]


OWN = "upgrade-driver.llm-platform.io/cordoned"


def test_rolling_takes_one_node_of_three_at_a_time_with_the_same_limit() -> None:
    """Planned work (upgrade-driver.yml) judges each node alone against cordon_limit, the agents' rule."""
    free = {"gpu-node-1": False, "gpu-node-2": False, "gpu-node-3": False}
    assert rolling_plan(free, ["gpu-node-1", "gpu-node-2", "gpu-node-3"]) == {
        "limit": 1,
        "cordoned_before": [],
        "allowed": ["gpu-node-1", "gpu-node-2", "gpu-node-3"],
        "held_back": {},
    }
    one_out = free | {"gpu-node-3": True}
    decision = rolling_plan(one_out, ["gpu-node-1", "gpu-node-3"])
    assert decision["allowed"] == ["gpu-node-3"]  # cordoned already: its work takes no further node out
    assert decision["held_back"] == {
        "gpu-node-1": "circuit breaker: 1 of 3 GPU nodes cordoned already (gpu-node-3), at most 1 may be "
        "(34% of the GPU nodes, never the last schedulable one)"
    }
    assert rolling_plan(one_out, ["gpu-node-1"], 67)["allowed"] == ["gpu-node-1"]
    assert rolling_plan({"gpu-node-1": False}, ["gpu-node-1"], 100)["held_back"]  # never the last node
    assert rolling_plan(free, ["gpu-node-9"])["held_back"] == {
        "gpu-node-9": "not a known GPU node of the cluster"
    }


def test_rolling_finishes_a_node_its_own_stopped_run_left_cordoned_whatever_the_others() -> None:
    """gpu-node-1 out by the caller's own cordon (a run that stopped), gpu-node-3 by someone else: gpu-node-1
    adds no node out of service, so its work may be finished (and its cordon lifted); gpu-node-2 may not
    go."""
    others = {"gpu-node-1": False, "gpu-node-2": False, "gpu-node-3": True}
    decision = rolling_plan(others, ["gpu-node-1", "gpu-node-2"], own_out=["gpu-node-1"])
    assert decision["allowed"] == ["gpu-node-1"]
    assert list(decision["held_back"]) == ["gpu-node-2"]
    assert rolling_plan(others, ["gpu-node-1"])["held_back"]  # without own_out, as before


def test_module_rolling_counts_its_own_cordon_as_lifted_and_patches_the_allowed() -> None:
    nodes = [
        node("gpu-node-1", cordoned=True, annotations={OWN: "cordoned by upgrade-driver.yml"}),
        node("gpu-node-2"),
        node("gpu-node-3"),
    ]
    args = {"action": "rolling", "nodes": nodes, "own_annotation": OWN, "by": "upgrade-driver.yml"}
    failed, result = run_module(
        gpu_cordon_plan, args | {"todo": ["gpu-node-1", "gpu-node-2"], "what": "driver-upgrade"}
    )
    assert not failed and result["changed"] is False, result
    # gpu-node-1 is out by this playbook's own (earlier, stopped) run: not counted against gpu-node-2
    assert result["allowed"] == ["gpu-node-1", "gpu-node-2"] and result["held_back"] == {}
    assert list(result["patches"]) == ["gpu-node-2"]  # gpu-node-1 is cordoned already
    patch = result["patches"]["gpu-node-2"]
    assert patch["spec"] == {"unschedulable": True}
    assert patch["metadata"]["annotations"][OWN].startswith(
        "cordoned by upgrade-driver.yml for the driver-upgrade"
    )
    assert json.loads(patch["metadata"]["annotations"][HISTORY_ANNOTATION])[-1]["action"] == "driver-upgrade"
    # someone else's cordon counts
    nodes[0] = node("gpu-node-1", cordoned=True)
    failed, result = run_module(gpu_cordon_plan, args | {"todo": ["gpu-node-2"]})
    assert not failed and result["allowed"] == [] and list(result["held_back"]) == ["gpu-node-2"], result
    # its own stopped run's node beside someone else's cordon: finished, no patch (cordoned already)
    nodes[1] = node("gpu-node-2", cordoned=True, annotations={OWN: "cordoned by upgrade-driver.yml"})
    failed, result = run_module(gpu_cordon_plan, args | {"todo": ["gpu-node-2"]})
    assert not failed and result["allowed"] == ["gpu-node-2"] and result["patches"] == {}, result
    failed, result = run_module(gpu_cordon_plan, {"action": "rolling", "nodes": nodes, "by": "x"})
    assert failed and "own_annotation" in result["msg"]
    failed, result = run_module(gpu_cordon_plan, {"action": "cordon", "nodes": nodes, "by": "x"})
    assert failed and "health" in result["msg"]
