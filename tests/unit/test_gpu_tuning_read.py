"""Role gpu_tuning's one NVML read (validate.yml: gpu_topology with facts, check: false and the role's
settings) decides whether gpu_settings and the layout's check run after it. The read runs against the fake
NVML; the `when` of the tasks after it is evaluated by Ansible's templar with the role's defaults and vars:
gpu_settings must run wherever it has something to do (a drifted GPU above all), and a converged node must
cost no second NVML run. (Controller pass only: the templar needs the controller's Ansible.)"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import gpu_settings
import gpu_topology
import yaml
from conftest import ROOT, FakeNode, run_module
from role_render import RoleVars

ROLE = ROOT / "roles" / "gpu_tuning"

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
OMIT = "__omit_place_holder__"


def role_task(name: str, file: str) -> dict[str, Any]:
    tasks = yaml.safe_load((ROLE / "tasks" / file).read_text())
    return next(task for task in tasks if task["name"] == name)


def module_args(task: dict[str, Any], module: str, role: Any) -> dict[str, Any]:
    args = role.template(task[module])
    return {key: value for key, value in args.items() if value != OMIT}


def role_read(**overrides: Any) -> dict[str, Any]:
    """What validate.yml's read registers (__gpu_tuning_facts) on the fake node, for these role values."""
    task = role_task(
        "Read the GPUs before changing anything, with their NVLink layout and what gpu_settings would change",
        "validate.yml",
    )
    failed, result = run_module(
        gpu_topology, module_args(task, "gpu_topology", RoleVars("gpu_tuning", omit=OMIT, **overrides))
    )
    assert not failed, result["msg"]
    return result


def settings_task_runs(
    read: dict[str, Any], boot_id: str | None = None, as_validated: bool | None = True, **overrides: Any
) -> tuple[bool, dict[str, Any] | None]:
    """Whether apply-gpu-settings.yml's gpu_settings task runs after that read (on the boot it was made on,
    unless ``boot_id``; nvidia_driver having taken that read as its own, unless ``as_validated`` is False, or
    None: nvidia_driver did not run), and if it does, gpu_settings' result with the task's own arguments."""
    if as_validated is not None:
        overrides["nvidia_driver_gpus_as_validated"] = as_validated
    boot = BOOT_ID.read_text().strip() if boot_id is None else boot_id
    role = RoleVars(
        "gpu_tuning",
        omit=OMIT,
        __gpu_tuning_facts=read,
        __gpu_tuning_boot_state={
            "differ": [],
            "slurp": {
                str(BOOT_ID): {"content": base64.b64encode(boot.encode()).decode(), "encoding": "base64"}
            },
        },
        **overrides,
    )
    task = role_task("Apply power cap, target temperature and persistence mode", "apply-gpu-settings.yml")
    if not role.when(task["when"]):
        return False, None
    failed, result = run_module(gpu_settings, module_args(task, "gpu_settings", role))
    assert not failed, result["msg"]
    return True, result


def limits(node: FakeNode) -> list[int]:
    return [g["power"]["limit_mw"] // 1000 for g in node.state()["gpus"]]


def test_role_runs_gpu_settings_where_a_gpu_drifted_and_only_there(pcie_node: FakeNode) -> None:
    # a fresh node (250 W, persistence off): applied
    runs, result = settings_task_runs(role_read())
    assert runs and result is not None and result["changed"]
    # converged: no gpu_settings run, and it would indeed have changed nothing
    read = role_read()
    assert {p["setting"] for p in read["settings_pending"]} == {"target_temperature_c"}  # A100s: left out
    assert settings_task_runs(read) == (False, None)
    # the lab's drift test: one GPU's power cap changed through the fake NVML, found and put back
    pcie_node.ctl("power", "--gpu", "1", "--limit-w", "180")
    runs, result = settings_task_runs(role_read())
    assert runs and result is not None and result["changed"]
    assert limits(pcie_node) == [200] * 4
    # persistence mode turned off by hand: found too
    pcie_node.edit(lambda state: state["gpus"][3].update(persistence_mode=0))
    runs, result = settings_task_runs(role_read())
    assert runs and result is not None and "persistence_mode" in result["msg"]
    assert settings_task_runs(role_read()) == (False, None)


def test_role_runs_gpu_settings_after_a_reboot_since_the_read(pcie_node: FakeNode) -> None:
    settings_task_runs(role_read())
    read = role_read()  # the stage's validation play, before nvidia_driver rebooted the node
    assert settings_task_runs(read, boot_id="another-boot")[0]
    assert settings_task_runs({**read, "boot_id": None})[0]


def test_role_runs_gpu_settings_where_nvidia_driver_did_not_take_the_read(pcie_node: FakeNode) -> None:
    # a module reload of this run (a driver/library mismatch after an install) resets the settings on the same
    # boot: nvidia_driver read the GPUs again (nvidia_driver_gpus_as_validated false), so they are compared
    settings_task_runs(role_read())
    read = role_read()
    assert settings_task_runs(read) == (False, None)
    assert settings_task_runs(read, as_validated=False)[0]
    assert settings_task_runs(read, as_validated=None)[0]


def test_role_compares_only_the_managed_gpus(pcie_node: FakeNode) -> None:
    settings_task_runs(role_read(gpu_tuning_gpus=[0, 1]), gpu_tuning_gpus=[0, 1])
    pcie_node.ctl("power", "--gpu", "3", "--limit-w", "180")  # not managed
    assert settings_task_runs(role_read(gpu_tuning_gpus=[0, 1]), gpu_tuning_gpus=[0, 1]) == (False, None)
    pcie_node.ctl("power", "--gpu", "0", "--limit-w", "180")
    runs, result = settings_task_runs(role_read(gpu_tuning_gpus=[0, 1]), gpu_tuning_gpus=[0, 1])
    assert runs and result is not None and [g["index"] for g in result["gpus"] if g["changed"]] == [0]


def test_role_leaves_out_a_target_temperature_no_gpu_supports(pcie_node: FakeNode) -> None:
    # A100s: gpu_settings is given no target temperature (__gpu_tuning_skip_target), so a converged node
    # has nothing pending although the read, given one, finds every GPU without it
    settings_task_runs(role_read())
    read = role_read()
    assert [(p["gpu"], p["setting"], p["action"]) for p in read["settings_pending"]] == [
        (gpu, "target_temperature_c", "unsupported") for gpu in range(4)
    ]
    assert settings_task_runs(read) == (False, None)
    # with gpu_tuning_unsupported: fail, the role gives it and gpu_settings fails: it must run
    role = RoleVars("gpu_tuning", __gpu_tuning_facts=read, gpu_tuning_unsupported="fail")
    assert role["__gpu_tuning_settings_pending"]


def test_role_sets_a_target_temperature_that_differs(pcie_node: FakeNode) -> None:
    settings_task_runs(role_read())

    def supported(state: dict[str, Any]) -> None:
        for index in range(4):
            state["gpus"][index]["temperature"].update(target=75, target_min=65, target_max=88)

    pcie_node.edit(supported)
    runs, result = settings_task_runs(role_read())
    assert runs and result is not None and "target_temperature_c 75 -> 83" in result["msg"]
    assert settings_task_runs(role_read()) == (False, None)


def test_role_runs_gpu_settings_where_some_gpus_lack_the_target_temperature(pcie_node: FakeNode) -> None:
    # only GPUs 0 and 1 support it: gpu_settings is given it and warns for 2 and 3 on every run, as before
    settings_task_runs(role_read())
    pcie_node.edit(
        lambda state: [
            state["gpus"][i]["temperature"].update(target=83, target_min=65, target_max=88) for i in (0, 1)
        ]
    )
    runs, result = settings_task_runs(role_read())
    assert runs and result is not None and not result["changed"]
    assert any("does not support target_temperature_c" in warning for warning in result["warnings"])


def test_role_checks_the_layout_again_only_where_the_read_found_a_problem(pcie_node: FakeNode) -> None:
    task = role_task(
        "Check that the NVLink pairs are up and the GPU count is right", "check-nvlink-topology.yml"
    )
    boot = {"slurp": {str(BOOT_ID): {"content": base64.b64encode(BOOT_ID.read_bytes()).decode()}}}
    pairs = {"gpu_tuning_nvlink_pairs": [[0, 1], [2, 3]], "gpu_tuning_gpu_count": 4}
    read = role_read(**pairs)
    assert read["problems"] == []
    taken = {"nvidia_driver_gpus_as_validated": True}
    role = RoleVars("gpu_tuning", __gpu_tuning_facts=read, __gpu_tuning_boot_state=boot, **pairs, **taken)
    assert not role.when(task["when"])
    role = RoleVars("gpu_tuning", __gpu_tuning_facts=read, __gpu_tuning_boot_state=boot, **pairs)
    assert role.when(task["when"])  # nvidia_driver read the GPUs again, or did not run: checked again
    pcie_node.ctl("link", "--gpu", "2", "--link", "0", "--down")
    read = role_read(**pairs, gpu_tuning_nvlink_min_links=12)
    assert read["problems"] == ["GPUs 2-3: 11 active NVLink(s), need at least 12"]
    role = RoleVars("gpu_tuning", __gpu_tuning_facts=read, __gpu_tuning_boot_state=boot, **pairs)
    assert role.when(task["when"])
    role = RoleVars(
        "gpu_tuning", __gpu_tuning_facts={**read, "problems": []}, __gpu_tuning_boot_state={}, **pairs
    )
    assert role.when(task["when"])  # no boot id to tell: checked again


# --- validate.yml's checks, one value_checks task each stage (were three assert tasks beside them) ---------


def first_failing_check(task_name: str, **values: Any) -> str | None:
    """The message of the first check of validate.yml's value_checks task that does not hold (as the action
    plugin evaluates them, in order), None where all hold."""
    task = role_task(task_name, "validate.yml")
    role = RoleVars("gpu_tuning", **(task.get("vars", {}) | values))
    for check in task["value_checks"]["checks"]:
        if "when" in check and not role.when(check["when"]):
            continue
        if not role.when(check["that"]):
            return " ".join(str(role.template(check["fail_msg"])).split())
    return None


NO_GPU = (
    "Check the gpu_tuning values that need no GPU (GPU indices, power limit, temperature, NVLink, GPU count)"
)
AGAINST_GPUS = "Check the gpu_tuning values against the GPUs (GPU indices, power range, slowdown temperature)"


def test_nvlink_pairs_of_the_wrong_shape_are_named() -> None:
    assert first_failing_check(NO_GPU, gpu_tuning_nvlink_pairs=[[0, 1], [2, 3]]) is None
    message = first_failing_check(
        NO_GPU, gpu_tuning_nvlink_pairs=[[0, 1], [2, 2], [0, 1, 2], [3, -1], ["a", 1]]
    )
    assert message == (
        "gpu_tuning_nvlink_pairs: every entry must be a pair of two different GPU indices such as [0, 1]; "
        'got [2, 2], [0, 1, 2], [3, -1], ["a", 1].'
    )


def test_gpu_indices_beyond_gpu_count_name_each_variable() -> None:
    values = {"gpu_tuning_nvlink_pairs": [[0, 1], [2, 5]], "gpu_tuning_gpu_count": 4}
    assert first_failing_check(NO_GPU, **values) == (
        "gpu_tuning_nvlink_pairs names GPU index 5, but gpu_tuning_gpu_count is 4 (indices 0-3)."
    )
    assert first_failing_check(NO_GPU, **values, gpu_tuning_gpus=[0, 4, 6]) == (
        "gpu_tuning_nvlink_pairs names GPU index 5, gpu_tuning_gpus names GPU index 4, 6, but "
        "gpu_tuning_gpu_count is 4 (indices 0-3)."
    )
    assert first_failing_check(NO_GPU, **(values | {"gpu_tuning_gpu_count": 0})) is None  # not checked then


def test_gpu_indices_and_values_against_the_gpus_read(pcie_node: FakeNode) -> None:
    read = role_read()
    assert first_failing_check(AGAINST_GPUS, __gpu_tuning_facts=read) is None
    assert first_failing_check(AGAINST_GPUS, __gpu_tuning_facts=read, gpu_tuning_gpus=[1, 4]) == (
        "gpu_tuning_gpus names GPU index 4, but this node has 4 GPU(s) (indices 0-3)."
    )
    assert first_failing_check(AGAINST_GPUS, __gpu_tuning_facts=read, gpu_tuning_power_limit_w=300) == (
        "gpu_tuning_power_limit_w is 300 W, outside the range 150-250 W that the managed GPUs accept "
        "(NVIDIA A100-PCIE-40GB)."
    )
