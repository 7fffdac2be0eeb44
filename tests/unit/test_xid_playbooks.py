"""Issue 20's remediation: the cordon a remediation playbook takes for its own work (gpu_breaker's
maintenance_patch), the gate before a node returns (tasks/gpu-gate.yml, run for real on this machine with
and without a dcgmi), and how gpu-reset.yml, node-reboot.yml, uncordon.yml and collect-diagnostics.yml are
built. On the lab: tests/lab/test_xid_on_lab.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.gpu_breaker import CORDON_ANNOTATION, HISTORY_ANNOTATION, maintenance_patch

ROOT = Path(__file__).resolve().parents[2]
REMEDIATE = ROOT / "playbooks" / "remediate"
sys.path.insert(0, str(Path(__file__).parent))

from test_remediation_playbooks import all_tasks, load, module_of, tasks  # noqa: E402


def node(name: str, cordoned: bool = False, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": annotations or {}}, "spec": {"unschedulable": cordoned}}


HEALTH = {
    "verdict": "unhealthy",
    "action": "reset_gpu",
    "reasons": [],
    "gpus": [
        {"index": 0, "uuid": "GPU-0", "verdict": "healthy", "action": "none", "reasons": []},
        {"index": 2, "uuid": "GPU-2", "verdict": "unhealthy", "action": "reset_gpu", "reasons": ["xid_95"]},
    ],
}


def test_a_playbook_cordons_for_its_work_with_the_record_and_history() -> None:
    nodes = [node("gpu-node-1"), node("gpu-node-2"), node("gpu-node-3")]
    patch, why = maintenance_patch(nodes, "gpu-node-2", HEALTH, [2], "reset", "gpu-reset.yml", "T")
    assert patch is not None and patch["spec"] == {"unschedulable": True}
    record = json.loads(patch["metadata"]["annotations"][CORDON_ANNOTATION])
    assert record["gpus"] == [{"index": 2, "uuid": "GPU-2"}] and record["reasons"] == ["xid_95"]
    assert (record["gpu_action"], record["by"]) == ("reset_gpu", "gpu-reset.yml")
    history = json.loads(patch["metadata"]["annotations"][HISTORY_ANNOTATION])
    assert [h["action"] for h in history] == ["reset"]
    assert why.startswith("cordon gpu-node-2 for the reset")


def test_a_node_cordoned_already_gets_only_the_history_entry() -> None:
    earlier = json.dumps([{"action": "cordon", "by": "gpu-health-agent"}])
    nodes = [node("gpu-node-1"), node("gpu-node-2", True, {HISTORY_ANNOTATION: earlier}), node("gpu-node-3")]
    patch, why = maintenance_patch(nodes, "gpu-node-2", HEALTH, [2], "reboot", "node-reboot.yml", "T")
    assert (
        patch is not None
        and "spec" not in patch
        and CORDON_ANNOTATION not in patch["metadata"]["annotations"]
    )
    history = json.loads(patch["metadata"]["annotations"][HISTORY_ANNOTATION])
    assert [h["action"] for h in history] == ["cordon", "reboot"]
    assert "cordoned already" in why


def test_never_the_last_schedulable_gpu_node() -> None:
    nodes = [node("gpu-node-1", True), node("gpu-node-2"), node("gpu-node-3", True)]
    patch, why = maintenance_patch(nodes, "gpu-node-2", HEALTH, [2], "reset", "gpu-reset.yml", "T")
    assert patch is None and why.startswith("refused: gpu-node-2 is the last schedulable GPU node")


# ------------------------------------------------------------------------------------------------- the gate
def run_gate(tmp_path: Path, health: dict[str, Any], dcgmi: str | None, level: int = 1) -> dict[str, Any]:
    """tasks/gpu-gate.yml on this machine (connection local), with a dcgmi stand-in on PATH or none."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if dcgmi is not None:
        (bin_dir / "dcgmi").write_text(dcgmi)
        (bin_dir / "dcgmi").chmod(0o755)
    out = tmp_path / "gate.json"
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {"ansible_python_interpreter": sys.executable},
            "environment": {"PATH": f"{bin_dir}:/usr/bin:/bin"},
            "tasks": [
                {
                    "ansible.builtin.include_tasks": str(REMEDIATE / "tasks" / "gpu-gate.yml"),
                    "vars": {
                        "__gate_health": health,
                        "__gate_dcgm_level": level,
                        "__gate_expected_gpu_count": 2,
                    },
                },
                {"ansible.builtin.copy": {"content": "{{ gpu_gate | to_json }}", "dest": str(out)}},
            ],
        }
    ]
    playbook = tmp_path / "gate.yml"
    playbook.write_text(yaml.safe_dump(play))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    proc = subprocess.run(
        # the controller's ansible-playbook (ansible-core needs 3.11 there); the modules run under this
        # test's interpreter (ansible_python_interpreter above: the nodes' 3.10 in the node-side pass)
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", str(playbook)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


FINE = {
    "action": "none",
    "reasons": [],
    "gpus": [{"index": 0, "reasons": []}, {"index": 1, "reasons": ["xid_13"]}],
}


def test_without_dcgm_the_nvml_self_check_decides(tmp_path: Path) -> None:
    gate = run_gate(tmp_path, FINE, None)
    assert gate["ran"].startswith("NVML self-check") and gate["passed"] is True
    broken = {
        "action": "reset_gpu",
        "reasons": [],
        "gpus": [{"index": 0, "reasons": ["ecc_disabled"]}, {"index": 1, "reasons": []}],
    }
    gate = run_gate(tmp_path, broken, None)
    assert gate["passed"] is False and gate["detail"] == "GPU 0, action reset_gpu"
    gate = run_gate(tmp_path, {**FINE, "gpus": FINE["gpus"][:1]}, None)
    assert gate["passed"] is False and gate["detail"] == "GPU count 1 of 2"


@pytest.mark.parametrize(
    ("script", "passed"),
    [
        ('#!/bin/sh\necho "| Deployment | Pass |"\nexit 0\n', True),
        ('#!/bin/sh\necho "| GPU Memory | Fail - GPU: 2 |"\nexit 0\n', False),
        ("#!/bin/sh\necho 'Error: unable to connect to host engine'\nexit 226\n", False),
    ],
)
def test_where_dcgmi_exists_its_diagnostics_decide(tmp_path: Path, script: str, passed: bool) -> None:
    gate = run_gate(tmp_path, FINE, script, level=2)
    assert gate["ran"] == "dcgmi diag -r 2" and gate["passed"] is passed


# ------------------------------------------------------------------------------------------ the playbooks
def included(name: str, role: str) -> list[str]:
    return [
        t["ansible.builtin.include_role"]["tasks_from"]
        for t in all_tasks(name)
        if module_of(t) == "ansible.builtin.include_role"
        and t["ansible.builtin.include_role"]["name"] == role
    ]


def test_gpu_reset_drains_resets_and_returns_the_node_through_uncordon() -> None:
    plays = load("gpu-reset.yml")
    assert plays[-1] == {
        "name": "GPU reset - verify and uncordon",
        "ansible.builtin.import_playbook": "uncordon.yml",
        "vars": {"uncordon_only_gpu_cordon": True},
        "when": "not ansible_check_mode",
    }
    (play,) = plays[:-1]
    # the driver role's own task files, not a copy (its validate comes with the settings loop)
    assert set(included("gpu-reset.yml", "nvidia_driver")) == {"stop-gpu-clients", "start-gpu-clients"}
    block = next(
        t for t in play["tasks"] if t.get("name", "").startswith("Reset, the cluster's own GPU clients")
    )
    assert [t["ansible.builtin.include_role"]["tasks_from"] for t in block["always"]] == ["start-gpu-clients"]
    resets = [t for t in tasks(play) if module_of(t) == "gpu_reset"]
    assert [t["gpu_reset"].get("state", "reset") for t in resets] == ["planned", "reset"]
    assert resets[1]["when"] == "not ansible_check_mode"
    drains = [t for t in tasks(play) if t.get("ansible.builtin.include_tasks") == "tasks/drain-node.yml"]
    (drain,) = drains
    assert "statefulset.kubernetes.io/pod-name in (" in drain["vars"]["__drain_pod_selectors"][0]
    plans = [t["gpu_cordon_plan"] for t in tasks(play) if module_of(t) == "gpu_cordon_plan"]
    assert [(p["action"], p["what"]) for p in plans] == [("maintenance", "reset")]


def test_node_reboot_logs_the_reason_and_reboots_through_the_driver_role() -> None:
    (play,) = load("node-reboot.yml")
    assert set(included("node-reboot.yml", "nvidia_driver")) == {"reboot-if-needed", "start-gpu-clients"}
    logger = next(t for t in tasks(play) if t.get("name") == "Write the reason to the node's log")
    assert logger["ansible.builtin.command"]["argv"][:3] == ["logger", "--tag", "node-reboot.yml"]
    plans = [t["gpu_cordon_plan"] for t in tasks(play) if module_of(t) == "gpu_cordon_plan"]
    assert [(p["action"], p["what"]) for p in plans] == [("maintenance", "reboot")]
    assert any(t.get("ansible.builtin.include_tasks") == "tasks/gpu-gate.yml" for t in tasks(play))


def test_uncordon_runs_the_gate_and_offers_level_2() -> None:
    node_play, decide = load("uncordon.yml")
    assert any(t.get("ansible.builtin.include_tasks") == "tasks/gpu-gate.yml" for t in tasks(node_play))
    refusal = next(t for t in tasks(decide) if t.get("name") == "Refuse while the gate fails")
    assert "not uncordon_gate.passed" in refusal["when"]
    assert "dcgm_diag_level=2" in json.dumps(decide)


def test_the_diagnostics_hold_what_a_vendor_ticket_needs() -> None:
    text = (REMEDIATE / "collect-diagnostics.yml").read_text()
    assert "gpu-vendor-ticket.json" in text
    for field in ("'serial'", "'remapped_rows'", "'xid_history'", "'recovery_action'", "'xids'"):
        assert field in text, field
