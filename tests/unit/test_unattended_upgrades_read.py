"""nvidia_driver's and cuda_toolkit's unattended-upgrades drop-ins, read in their own files_in_place read.

Role unattended_upgrades_exclusion writes the drop-in; each including role lists it among the files its own
read compares (with the entry that role reads it with) and passes that read along
(unattended_upgrades_exclusion_read), so the role does not read it again: one module call a run less per
include (issue 19). Held here: the including role's entry is exactly the one unattended_upgrades_exclusion
builds for the values the include passes (path, owner, mode, and the SHA-1 of its template rendered for that
role, as its template task writes it), for both states; the read is in the files the including role reads;
and the role reads the drop-in itself where no read is passed. Rendered with Ansible's templar from the roles'
own files.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import yaml
from role_render import ROOT, RoleVars

KERNEL = "5.15.0-105-generic"
# the including role: its switch for the drop-in, the name of its include
CALLERS = {
    "nvidia_driver": ("nvidia_driver_unattended_upgrades_blacklist", "Keep the driver out of unattended"),
    "cuda_toolkit": ("cuda_toolkit_unattended_upgrades_blacklist", "Keep the toolkit out of unattended"),
}


def role_vars(role: str, **overrides: Any) -> RoleVars:
    path = str(ROOT / "roles" / role)
    base = {
        "ansible_facts": {"kernel": KERNEL},
        "__nvidia_driver_secure_boot": False,
        "role_path": path,
        "ansible_search_path": [path],
    }
    return RoleVars(role, **(base | overrides))


def include_task(role: str) -> dict[str, Any]:
    tasks = yaml.safe_load((ROOT / "roles" / role / "tasks/main.yml").read_text())
    (task,) = [t for t in tasks if t.get("name", "").startswith(CALLERS[role][1])]
    assert task["ansible.builtin.include_role"] == {"name": "unattended_upgrades_exclusion"}
    return task


@pytest.mark.parametrize("blacklist", [True, False])
@pytest.mark.parametrize("caller", list(CALLERS))
def test_the_including_roles_entry_is_the_roles_own(caller: str, blacklist: bool) -> None:
    flag, _name = CALLERS[caller]
    including = role_vars(caller, **{flag: blacklist})
    entry = including[f"__{caller}_unattended_upgrades_file"]
    # the values the include passes, as the including role templates them
    passed = dict(include_task(caller)["vars"])
    assert passed.pop("unattended_upgrades_exclusion_read") == f"{{{{ __{caller}_files_state }}}}"
    passed = including.template(passed)
    exclusion = role_vars("unattended_upgrades_exclusion", ansible_parent_role_names=[caller], **passed)
    assert entry == exclusion["__unattended_upgrades_exclusion_file"]
    assert entry["path"] == exclusion["__unattended_upgrades_exclusion_path"]
    if blacklist:
        # what the template task writes (the template module's defaults), for this role
        written = exclusion.render_template("unattended-upgrades.j2")
        assert entry["checksum"] == hashlib.sha1(written.encode()).hexdigest()
        assert f"(role {caller})" in written.splitlines()[0]
        assert all(f'"{p}";' in written for p in passed["unattended_upgrades_exclusion_packages"])
    else:
        assert entry == {"path": entry["path"], "state": "absent"}


@pytest.mark.parametrize("caller", list(CALLERS))
def test_the_including_role_reads_the_drop_in_and_passes_its_read(caller: str) -> None:
    including = role_vars(caller)
    files = including[f"__{caller}_files"]
    assert including[f"__{caller}_unattended_upgrades_file"] in files
    tasks = yaml.safe_load((ROOT / "roles" / caller / "tasks/main.yml").read_text())
    (read,) = [t for t in tasks if "files_in_place" in t]
    assert read["files_in_place"]["files"] == f"{{{{ __{caller}_files }}}}"
    passed = include_task(caller)["vars"]["unattended_upgrades_exclusion_read"]
    assert passed == f"{{{{ {read['register']} }}}}"
    assert tasks.index(read) < tasks.index(include_task(caller))


def exclusion_tasks() -> dict[str, dict[str, Any]]:
    tasks = yaml.safe_load((ROOT / "roles/unattended_upgrades_exclusion/tasks/main.yml").read_text())
    return {t["name"].split(" of ")[0]: t for t in tasks}


PATH = "/etc/apt/apt.conf.d/51nvidia-driver-unattended-upgrades"


@pytest.mark.parametrize(
    ("passed", "own", "reads", "differs"),
    [
        # no read passed (the role included by another role, or alone): it reads the drop-in itself
        ({}, {"differ": []}, True, False),
        ({}, {"differ": [PATH]}, True, True),
        # the including role's read: the role's own read skipped, that read decides
        ({"differ": []}, {"skipped": True}, False, False),
        ({"differ": ["/etc/modprobe.d/blacklist-nouveau.conf"]}, {"skipped": True}, False, False),
        ({"differ": [PATH]}, {"skipped": True}, False, True),
    ],
)
@pytest.mark.parametrize("state", ["present", "absent"])
def test_the_write_follows_the_read_that_was_made(
    passed: dict[str, Any], own: dict[str, Any], reads: bool, differs: bool, state: str
) -> None:
    tasks = exclusion_tasks()
    before = role_vars(
        "unattended_upgrades_exclusion",
        unattended_upgrades_exclusion_name="nvidia-driver",
        unattended_upgrades_exclusion_state=state,
        unattended_upgrades_exclusion_read=passed,
    )
    assert before.when(tasks["Read the unattended-upgrades exclusion"]["when"]) is reads
    after = role_vars(
        "unattended_upgrades_exclusion",
        unattended_upgrades_exclusion_name="nvidia-driver",
        unattended_upgrades_exclusion_state=state,
        unattended_upgrades_exclusion_read=passed,
        __unattended_upgrades_exclusion_found=own,
    )
    writes = after.when(tasks["Write the unattended-upgrades exclusion"]["when"])
    removes = after.when(tasks["Remove the unattended-upgrades exclusion"]["when"])
    assert (writes, removes) == (differs and state == "present", differs and state == "absent")
