"""roles/nvidia_driver's read of the GPUs after the driver steps (tasks/fix-version-mismatch.yml, issue 19).

The GPU stage's validation play reads the GPUs with gpu_facts (gpu_tuning's validate.yml registers
__gpu_tuning_facts). Where nothing the role did since can change NVML's answer, that read is the role's too
(vars/main.yml, __nvidia_driver_gpus_read_holds), one gpu_facts call a node less; wherever this run changed
something under NVML, or NVML did not answer the validation play, or the role runs without that play, the role
reads the GPUs itself. Rendered with Ansible's templar from the role's own files.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from role_render import ROOT, RoleVars

KERNEL = "5.15.0-105-generic"
NVML = {"ansible_facts": {"nvidia": {"driver_version": "535.183.06", "gpu_count": 2}}, "changed": False}


MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"


def files_state(differ: list[str], nouveau: bool) -> dict[str, Any]:
    return {"differ": differ, "stat": {"/sys/module/nouveau": {"exists": nouveau}}}


# A converged node in the GPU stage: the validation play read the GPUs, the role's reads found all as wanted.
CONVERGED: dict[str, Any] = {
    "ansible_facts": {"kernel": KERNEL},
    "__nvidia_driver_secure_boot": False,
    "llm_platform_validated_roles": ["cuda_repository", "nvidia_driver", "cuda_toolkit", "gpu_tuning"],
    "__gpu_tuning_facts": NVML,
    "__nvidia_driver_packages_found": {"differ": [], "in_place": True},
    "__nvidia_driver_files_state": files_state([], nouveau=False),
    "__nvidia_driver_reboot_reasons": [],
}


def holds(**changes: Any) -> bool:
    variables = {key: value for key, value in (CONVERGED | changes).items() if value is not None}
    return RoleVars("nvidia_driver", **variables)["__nvidia_driver_gpus_read_holds"]


def test_a_converged_node_takes_the_validation_plays_read() -> None:
    assert holds() is True


@pytest.mark.parametrize(
    "changes",
    [
        # the role run alone, or by a playbook without the GPU stage's validation play (driver-mismatch.yml)
        {"llm_platform_validated_roles": None},
        {"llm_platform_validated_roles": ["kubernetes"]},
        # NVML did not answer the validation play (no driver yet, a mismatch), or it was not read
        {"__gpu_tuning_facts": None},
        {"__gpu_tuning_facts": {"failed": True, "msg": MISMATCH}},
        {"__gpu_tuning_facts": {"skipped": True}},
        # a driver package to install, remove or hold: the driver may change under NVML
        {"__nvidia_driver_packages_found": {"differ": ["nvidia-headless-535"], "in_place": False}},
        # nvidia-ml-py to install: gpu_facts itself may answer differently
        {"__nvidia_driver_packages_found": {"differ": ["/opt/nvidia-ml-py"], "in_place": False}},
        {"__nvidia_driver_packages_found": None},
        {"nvidia_driver_source": "runfile"},
        # nouveau loaded: a reboot
        {"__nvidia_driver_files_state": files_state([], nouveau=True)},
        # nvidia-persistenced started by this run
        {"__nvidia_driver_files_state": files_state(["nvidia-persistenced.service"], nouveau=False)},
        # a reboot due, or this run stopped the cluster's own GPU clients (a reboot, a reload)
        {"__nvidia_driver_reboot_reasons": ["driver 535.183.06 installed"]},
        {"__nvidia_driver_gpu_clients_stopped": {"units": ["gpu-health-agent.service"]}},
        {"__nvidia_driver_gpu_clients_stopped": {}},
    ],
)
def test_anything_that_can_change_nvmls_answer_reads_again(changes: dict[str, Any]) -> None:
    assert holds(**changes) is False


def test_the_read_is_taken_or_made_never_both_nor_neither() -> None:
    tasks = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/fix-version-mismatch.yml").read_text())
    (take,) = [t for t in tasks if "ansible.builtin.set_fact" in t]
    (read,) = [t for t in tasks if t.get("ansible.builtin.include_tasks") == "read-gpu-facts.yml"]
    assert take["ansible.builtin.set_fact"] == {
        "__nvidia_driver_probe": "{{ __gpu_tuning_facts }}",
        "nvidia_driver_gpus_as_validated": True,
    }
    # wherever the role reads the GPUs itself (here, after a reload or a reboot), it tells gpu_tuning so
    own_read = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/read-gpu-facts.yml").read_text())
    assert own_read[-1]["ansible.builtin.set_fact"] == {"nvidia_driver_gpus_as_validated": False}
    assert take["when"] == ["not __nvidia_driver_check_mode_pending", "__nvidia_driver_gpus_read_holds"]
    assert read["when"] == ["not __nvidia_driver_check_mode_pending", "not __nvidia_driver_gpus_read_holds"]
    assert tasks.index(take) < tasks.index(read)
    # the validation play's read into __gpu_tuning_facts answers what read-gpu-facts.yml's gpu_facts does:
    # gpu_topology with `facts: true` returns gpu_facts' ansible_facts.nvidia (test_gpu_topology.py holds the
    # two equal), and `check: false` leaves a layout problem to gpu_tuning instead of failing the read
    own = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/read-gpu-facts.yml").read_text())
    (own_read,) = [t for t in own if "gpu_facts" in t]
    assert own_read["gpu_facts"] is None
    tuning = yaml.safe_load((ROOT / "roles/gpu_tuning/tasks/validate.yml").read_text())
    (validation_read,) = [t for t in tuning if t.get("register") == "__gpu_tuning_facts"]
    assert validation_read["gpu_topology"]["facts"] is True
    assert validation_read["gpu_topology"]["check"] is False
    play = yaml.safe_load((ROOT / "playbooks/gpu.yml").read_text())[0]
    names = [t.get("ansible.builtin.include_role", {}).get("name") for t in play["tasks"]]
    assert "gpu_tuning" in names
    facts = [t["ansible.builtin.set_fact"] for t in play["tasks"] if "ansible.builtin.set_fact" in t]
    recorded = next(f["llm_platform_validated_roles"] for f in facts if "llm_platform_validated_roles" in f)
    assert "gpu_tuning" in recorded
