"""A role included in a loop runs its own loops (check_argument_types, its validate.yml) with the loop
variable still set by the including loop: Ansible warns "The loop variable 'item' is already in use", and an
inner task reading `item` could read the outer one. The including loop names its own loop_var instead."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = [
    *sorted((ROOT / "playbooks").glob("*.yml")),
    *sorted((ROOT / "playbooks" / "remediate").glob("*.yml")),
]
INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.include_tasks")
# roles whose own tasks loop with `item`: an including loop must not use that name
ROLES_LOOPING_ON_ITEM = ("monitoring",)


def tasks(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for task in items or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from tasks(task.get(key) or [])


def include_loops(playbook: Path) -> Iterator[dict[str, Any]]:
    for play in yaml.safe_load(playbook.read_text()) or []:
        for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
            for task in tasks(play.get(section) or []):
                if any(key in task for key in INCLUDES) and "loop" in task:
                    yield task


@pytest.mark.parametrize("role", ROLES_LOOPING_ON_ITEM)
def test_a_loop_including_the_role_names_its_own_loop_var(role: str) -> None:
    found = []
    for playbook in PLAYBOOKS:
        for task in include_loops(playbook):
            if role in str(task["loop"]):
                loop_var = (task.get("loop_control") or {}).get("loop_var", "item")
                found.append((playbook.relative_to(ROOT), task["name"], loop_var))
    assert found, f"no playbook includes {role} in a loop: this test no longer looks where it should"
    assert [entry for entry in found if entry[2] == "item"] == []
