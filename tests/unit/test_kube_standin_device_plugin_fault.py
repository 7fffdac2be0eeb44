"""The lab's device-plugin-unregistered fault models the real failure (issue 11, docs/lab.md): the plugin
Pods running when registration was lost offer nothing (allocatable 0, the capacity kept), a new plugin Pod
(its DaemonSet's replacement of a deleted one) registers again, and clearing the fault brings the old one
back. The lab test tests/lab/test_remediation_on_lab.py drives the same through restart-device-plugin.yml."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "lab" / "kube"))
from kube_standin import kubelet  # noqa: E402 - the stand-in package lives in tests/lab/kube


def plugin_pod(uid: str) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": f"nvidia-device-plugin-{uid}", "namespace": "kube-system"},
        "spec": {"containers": [{"name": "ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> kubelet.Kubelet:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"gpus": [{"present": True}] * 4}))
    monkeypatch.setattr(kubelet, "NVML_STATE", str(state))
    node = object.__new__(kubelet.Kubelet)  # only the GPU bookkeeping: no API client, no threads
    node.gpu_registered = False
    node.plugin_lost_uids = None
    return node


def test_lost_registration_until_a_new_plugin_pod(node: kubelet.Kubelet) -> None:
    old, new = plugin_pod("old"), plugin_pod("new")
    assert node.gpu_resources([old], {}) == {"capacity": "4", "allocatable": "4"}
    fault = {"device_plugin_unregistered": True}
    # registration lost: the running pod keeps running and offers nothing, the capacity stays
    assert node.gpu_resources([old], fault) == {"capacity": None, "allocatable": "0"}
    assert node.gpu_resources([old], fault) == {"capacity": None, "allocatable": "0"}
    # the DaemonSet's new pod registers, the fault notwithstanding
    assert node.gpu_resources([new], fault) == {"capacity": "4", "allocatable": "4"}
    # cleared: any running plugin registers
    assert node.gpu_resources([old], {}) == {"capacity": "4", "allocatable": "4"}


def test_no_plugin_pod_no_gpus(node: kubelet.Kubelet) -> None:
    assert node.gpu_resources([], {}) is None
    node.gpu_resources([plugin_pod("a")], {})
    assert node.gpu_resources([], {}) == {"capacity": None, "allocatable": "0"}
