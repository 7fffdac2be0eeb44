"""roles/nvidia_driver and Secure Boot (issue 16, item 6): the decision made before any change.

With Secure Boot on, the kernel loads only signed modules: a DKMS-built nvidia.ko needs the DKMS MOK key
enrolled, otherwise `modprobe nvidia` fails after the reboot ("Key was rejected by service") and the run
reports only that NVML does not work. tasks/read-secure-boot.yml reads the state (mokutil --sb-state, or the
SecureBoot UEFI variable); vars/main.yml decides: Ubuntu's signed prebuilt modules where the source allows,
DKMS where Secure Boot is off or the key is enrolled, otherwise refuse (tasks/validate.yml names both ways
out). The decision's expressions are rendered here with Ansible's templar, from the role's own files.
"""

from __future__ import annotations

import pytest
import yaml
from role_render import ROOT, RoleVars

KERNEL = "5.15.0-105-generic"


def role(**overrides: object) -> RoleVars:
    return RoleVars("nvidia_driver", **({"ansible_facts": {"kernel": KERNEL}} | overrides))


@pytest.mark.parametrize(
    ("secure_boot", "source", "modules", "mok", "expected", "refused"),
    [
        (False, "cuda_repo", "auto", False, "dkms", False),
        (False, "ubuntu", "auto", False, "dkms", False),
        (True, "ubuntu", "auto", False, "signed", False),
        (True, "cuda_repo", "auto", False, "dkms", True),
        (True, "runfile", "auto", False, "dkms", True),
        (True, "cuda_repo", "auto", True, "dkms", False),
        (True, "ubuntu", "dkms", False, "dkms", True),
        (True, "ubuntu", "dkms", True, "dkms", False),
        (False, "ubuntu", "signed", False, "signed", False),
        (True, "ubuntu", "signed", False, "signed", False),
    ],
)
def test_secure_boot_decides_the_module_or_refuses(
    secure_boot: bool, source: str, modules: str, mok: bool, expected: str, refused: bool
) -> None:
    decided = role(
        __nvidia_driver_secure_boot=secure_boot,
        nvidia_driver_source=source,
        nvidia_driver_kernel_modules=modules,
        nvidia_driver_dkms_mok_enrolled=mok,
    )
    assert decided["__nvidia_driver_kernel_modules"] == expected
    assert decided["__nvidia_driver_secure_boot_refused"] is refused


def test_the_refusal_names_both_ways_out_and_runs_before_any_change() -> None:
    tasks = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/validate.yml").read_text())
    (check,) = [t for t in tasks if t.get("name", "").startswith("Check that the kernel will load")]
    message = check["ansible.builtin.assert"]["fail_msg"]
    assert check["ansible.builtin.assert"]["that"] == "not __nvidia_driver_secure_boot_refused"
    for way_out in (
        "nvidia_driver_source: ubuntu",
        "update-secureboot-policy --enroll-key",
        "nvidia_driver_dkms_mok_enrolled: true",
    ):
        assert way_out in message
    names = [t.get("name", "") for t in tasks]
    assert names.index("Read the Secure Boot state") < names.index(check["name"])
    # the role's first task, skipped only where the GPU stage's validation play ran it before any change
    main = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/main.yml").read_text())
    assert main[0]["ansible.builtin.include_tasks"] == "validate.yml"
    assert main[0]["when"] == "'nvidia_driver' not in llm_platform_validated_roles | default([])"
    stage = yaml.safe_load((ROOT / "playbooks/gpu.yml").read_text())[0]["tasks"]
    assert {"name": "nvidia_driver", "tasks_from": "validate"} in [
        t.get("ansible.builtin.include_role") for t in stage
    ]


def test_the_state_is_read_from_mokutil_then_the_uefi_variable() -> None:
    tasks = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/read-secure-boot.yml").read_text())
    commands = [t["ansible.builtin.command"]["argv"] for t in tasks if "ansible.builtin.command" in t]
    assert commands[0] == ["mokutil", "--sb-state"]
    assert commands[1][0] == "od" and commands[1][-1] == "{{ __nvidia_driver_secure_boot_efivar }}"
    assert all(
        t.get("check_mode") is False and t.get("changed_when") is False
        for t in tasks
        if "ansible.builtin.command" in t
    )
    assert role()["__nvidia_driver_secure_boot_efivar"] == (
        "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
    )
