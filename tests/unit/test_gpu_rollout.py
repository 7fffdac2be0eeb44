"""The GPU stage's rollout split (playbooks/gpu.yml, roles/nvidia_driver/tasks/rollout-check.yml).

A node the check calls steady converges beside the others instead of in a serial batch, so the
decision must call every disruptive case "rolling": the decision's expression is rendered here with
Ansible's templar for each answer the read-only probes can give. The playbook's shape (the rolling
play keeps serial and max_fail_percentage 0, no play that runs the roles escapes the sort) is
checked from the YAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "roles" / "nvidia_driver" / "tasks" / "rollout-check.yml"
GPU_PLAYBOOK = ROOT / "playbooks" / "gpu.yml"
WANTED = "535.183.06"

NVML_OK = {"changed": False, "ansible_facts": {"nvidia": {"driver_version": WANTED}}}
NO_NOUVEAU = {"changed": False, "stat": {"exists": False}}
APT_OK = {"changed": False}


def decide(nvml: dict[str, Any], nouveau: dict[str, Any], apt: dict[str, Any]) -> list[str]:
    tasks = yaml.safe_load(CHECK.read_text())
    (decision,) = [t for t in tasks if "ansible.builtin.set_fact" in t]
    variables: dict[str, Any] = {
        "nvidia_driver_version": WANTED,
        "__nvidia_driver_rollout_nvml": nvml,
        "__nvidia_driver_rollout_nouveau": nouveau,
        "__nvidia_driver_rollout_apt": apt,
    }
    variables |= {k: trust_as_template(v) for k, v in decision["vars"].items()}
    templar = Templar(loader=DataLoader(), variables=variables)
    found = templar.template(
        trust_as_template(decision["ansible.builtin.set_fact"]["nvidia_driver_rollout_reasons"])
    )
    needed = templar.template(
        trust_as_template(decision["ansible.builtin.set_fact"]["nvidia_driver_rollout_needed"])
    )
    assert needed is (len(found) > 0)
    return list(found)


def test_a_converged_node_is_steady() -> None:
    assert decide(NVML_OK, NO_NOUVEAU, APT_OK) == []


def test_runfile_nodes_skip_apt_and_stay_steady_when_converged() -> None:
    assert decide(NVML_OK, NO_NOUVEAU, {"changed": False, "skipped": True}) == []


@pytest.mark.parametrize(
    ("nvml", "nouveau", "apt", "expected"),
    [
        (
            {"changed": False, "msg": "Failed to initialize NVML: Driver/library version mismatch"},
            NO_NOUVEAU,
            APT_OK,
            "NVML reports driver none: Failed to initialize NVML: Driver/library version mismatch",
        ),
        (
            {"changed": False, "ansible_facts": {"nvidia": {"driver_version": "535.104.05"}}},
            NO_NOUVEAU,
            APT_OK,
            "NVML reports driver 535.104.05, wanted 535.183.06",
        ),
        (NVML_OK, {"changed": False, "stat": {"exists": True}}, APT_OK, "nouveau is loaded"),
        (NVML_OK, NO_NOUVEAU, {"changed": True}, "apt would change the driver packages"),
        (
            NVML_OK,
            NO_NOUVEAU,
            {"changed": False, "failed": True, "msg": "No package matching 'nvidia-driver-535'"},
            "apt cannot resolve the driver packages: No package matching",
        ),
    ],
    ids=["nvml-fails", "other-driver", "nouveau", "apt-would-change", "apt-fails"],
)
def test_every_disruptive_case_rolls(
    nvml: dict[str, Any], nouveau: dict[str, Any], apt: dict[str, Any], expected: str
) -> None:
    reasons = decide(nvml, nouveau, apt)
    assert len(reasons) == 1, reasons
    assert reasons[0].startswith(expected), reasons


def test_the_rolling_play_keeps_the_batches_and_no_play_runs_the_roles_unsorted() -> None:
    plays = yaml.safe_load(GPU_PLAYBOOK.read_text())
    role_plays = [p for p in plays if p.get("roles")]
    assert len(role_plays) == 2
    rolling, steady = role_plays
    assert "gpu_stage_rolling" in rolling["hosts"] and "gpu_stage_steady" in steady["hosts"]
    assert "gpu_stage_serial" in str(rolling["serial"])
    assert "serial" not in steady
    for play in role_plays:
        assert play["max_fail_percentage"] == 0
        assert play["force_handlers"] is True
    sort = plays[0]
    assert sort["hosts"] == "gpu_nodes"
    names = [t["name"] for t in sort["tasks"]]
    # every value is validated before the check, and the check before the sort
    assert names.index("Ask each node whether the driver step would disrupt it") > max(
        i for i, n in enumerate(names) if n.startswith("Validate the ")
    )
    assert names.index("Sort the nodes into rolling and steady") > names.index(
        "Ask each node whether the driver step would disrupt it"
    )
