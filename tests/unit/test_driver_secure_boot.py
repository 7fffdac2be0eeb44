"""roles/nvidia_driver and Secure Boot (issue 16, item 6): the decision made before any change.

With Secure Boot on, the kernel loads only signed modules: a DKMS-built nvidia.ko needs the DKMS MOK key
enrolled, otherwise `modprobe nvidia` fails after the reboot ("Key was rejected by service") and the run
reports only that NVML does not work. tasks/read-secure-boot.yml reads the state (the SecureBoot UEFI
variable in one files_in_place read, mokutil --sb-state only where that cannot answer); vars/main.yml decides:
Ubuntu's signed prebuilt modules where the source allows, DKMS where Secure Boot is off or the key is
enrolled, otherwise refuse (tasks/validate.yml names both ways out). The decision's expressions are rendered
here with Ansible's templar, from the role's own files.
"""

from __future__ import annotations

import base64

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


EFIVAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def efi_read(efi: bool, variable: bytes | None) -> dict[str, object]:
    """What files_in_place returns for read-secure-boot.yml's read (/sys/firmware/efi, the variable)."""
    slurp = {} if variable is None else {"content": base64.b64encode(variable).decode(), "encoding": "base64"}
    return {"stat": {"/sys/firmware/efi": {"exists": efi}}, "slurp": {EFIVAR: slurp}}


def test_the_state_is_read_from_the_uefi_variable_then_mokutil() -> None:
    tasks = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/read-secure-boot.yml").read_text())
    (read,) = [t for t in tasks if "files_in_place" in t]
    assert read["files_in_place"]["stat"] == ["/sys/firmware/efi"]
    assert read["files_in_place"]["slurp"] == ["{{ __nvidia_driver_secure_boot_efivar }}"]
    assert read["register"] == "__nvidia_driver_efi" and read["check_mode"] is False
    (mokutil,) = [t for t in tasks if "ansible.builtin.command" in t]
    assert mokutil["ansible.builtin.command"]["argv"] == ["mokutil", "--sb-state"]
    assert mokutil["when"] == "__nvidia_driver_secure_boot_ask_mokutil"
    assert mokutil["check_mode"] is False and mokutil["changed_when"] is False
    assert tasks.index(read) < tasks.index(mokutil)
    assert role()["__nvidia_driver_secure_boot_efivar"] == EFIVAR


# The variable's bytes as efivarfs gives them: attributes (NV|BS|RT = 7, little-endian), then the state byte.
ON = b"\x06\x00\x00\x00\x01"
OFF = b"\x06\x00\x00\x00\x00"
MOKUTIL_ON = {"rc": 0, "stdout": "SecureBoot enabled"}
MOKUTIL_OFF = {"rc": 0, "stdout": "SecureBoot disabled"}
MOKUTIL_NONE = {"rc": 255, "stdout": "EFI variables are not supported on this system"}
SKIPPED = {"skipped": True}
FAILED = {"failed": True, "msg": "cannot read"}


@pytest.mark.parametrize(
    ("read", "mokutil", "asks_mokutil", "on", "evidence"),
    [
        # the variable answers: mokutil is not asked (it reads the same byte)
        (efi_read(True, ON), SKIPPED, False, True, f"{EFIVAR}: 1"),
        (efi_read(True, OFF), SKIPPED, False, False, f"{EFIVAR}: 0"),
        # shim's own state comes after the byte, as mokutil prints "SecureBoot enabled" for it too
        (efi_read(True, ON + b"\x01"), SKIPPED, False, True, f"{EFIVAR}: 1"),
        # no /sys/firmware/efi: legacy BIOS, off, as mokutil and od answered it before (both could not read)
        (efi_read(False, None), SKIPPED, False, False, "/sys/firmware/efi: not there"),
        # UEFI, the variable not readable (efivarfs not mounted): mokutil answers
        (efi_read(True, None), MOKUTIL_ON, True, True, "mokutil --sb-state: SecureBoot enabled"),
        (efi_read(True, None), MOKUTIL_OFF, True, False, "mokutil --sb-state: SecureBoot disabled"),
        (efi_read(True, b"\x06"), MOKUTIL_ON, True, True, "mokutil --sb-state: SecureBoot enabled"),
        (efi_read(True, None), MOKUTIL_NONE, True, False, f"{EFIVAR}: not readable"),
        # the read failed (failed_when: false): mokutil is asked
        (FAILED, MOKUTIL_ON, True, True, "mokutil --sb-state: SecureBoot enabled"),
        (FAILED, {"rc": 2, "stdout": ""}, True, False, f"{EFIVAR}: not readable"),
    ],
)
def test_the_state_read_decides(
    read: dict[str, object], mokutil: dict[str, object], asks_mokutil: bool, on: bool, evidence: str
) -> None:
    before = role(__nvidia_driver_efi=read)
    assert before["__nvidia_driver_secure_boot_ask_mokutil"] is asks_mokutil
    after = role(__nvidia_driver_efi=read, __nvidia_driver_mokutil=mokutil)
    answer = after["__nvidia_driver_secure_boot_answer"]
    assert answer[0] is on
    assert answer[1].startswith(evidence)
