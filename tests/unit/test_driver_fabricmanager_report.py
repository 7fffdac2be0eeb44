"""roles/nvidia_driver/tasks/install-fabricmanager.yml: its two reports in one task (issue 19: a header less).

Before: "Say why fabric manager is installed" (a debug, "auto" and wanted) and "Warn that the .run path leaves
fabric manager to the operator" (a debug, the .run driver with NVSwitches seen). Held here over every value of
the switch, every source and NVSwitches or none: the one task runs exactly where one of the two ran, with that
one's message. The decision's set_fact is rendered as the role renders it, with Ansible's templar.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import yaml
from role_render import ROOT, RoleVars

TASKS = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/install-fabricmanager.yml").read_text())
WHY_WAS = ["nvidia_driver_fabricmanager is not boolean", "__nvidia_driver_fabricmanager_wanted | bool"]
WARN_WAS = "nvidia_driver_source == 'runfile' and __nvidia_driver_nvswitch_seen | bool"
NVSWITCHES = {"present": True, "pci_devices": ["0000:05:00.0"], "nvml_links": 12}
NONE = {"present": False, "pci_devices": [], "nvml_links": None}


def decided(switch: Any, source: str, nvswitches: dict[str, Any]) -> RoleVars:
    """The role's variables after "Decide whether this node needs fabric manager", as that task sets them."""
    (decide,) = [t for t in TASKS if t["name"] == "Decide whether this node needs fabric manager"]
    inputs = {
        "ansible_facts": {"kernel": "5.15.0-105-generic"},
        "__nvidia_driver_secure_boot": False,
        "nvidia_driver_fabricmanager": switch,
        "nvidia_driver_source": source,
        "__nvidia_driver_probe": {"ansible_facts": {"nvidia": {"nvswitches": nvswitches}}},
    }
    before = RoleVars("nvidia_driver", **inputs)
    facts = RoleVars("nvidia_driver", **inputs, **before.template(decide["vars"])).template(
        decide["ansible.builtin.set_fact"]
    )
    return RoleVars("nvidia_driver", **inputs, **facts)


@pytest.mark.parametrize(
    ("switch", "source", "nvswitches"),
    list(itertools.product(["auto", True, False], ["cuda_repo", "ubuntu", "runfile"], [NVSWITCHES, NONE])),
)
def test_the_report_runs_where_one_of_the_two_ran_with_its_message(
    switch: Any, source: str, nvswitches: dict[str, Any]
) -> None:
    (report,) = [t for t in TASKS if t["name"].startswith("Say why fabric manager is installed")]
    role = decided(switch, source, nvswitches)
    why, warn = role.when(WHY_WAS), role.when(WARN_WAS)
    assert not (why and warn)
    assert role.when(report["when"]) is (why or warn)
    if why:
        assert role.template(report["ansible.builtin.debug"]["msg"]) == (
            "NVSwitch system (NVML: 12 NVLinks to NVSwitches; PCI: NVSwitch at 0000:05:00.0):"
            " fabric manager is needed."
        )
    if warn:
        assert role.template(report["ansible.builtin.debug"]["msg"]) == (
            "NVSwitch links found but nvidia_driver_source is runfile: install fabric manager 535.183.06 from"
            " NVIDIA's tarball, or use the packaged driver."
        )


def test_the_grid_reaches_both_reports() -> None:
    assert decided("auto", "cuda_repo", NVSWITCHES).when(WHY_WAS)
    assert decided("auto", "runfile", NVSWITCHES).when(WARN_WAS)
