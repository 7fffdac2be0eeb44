"""A role included in a loop runs its own loops (its validate.yml) with the loop
variable still set by the including loop: Ansible warns "The loop variable 'item' is already in use", and an
inner task reading `item` could read the outer one. Every loop that includes a role or a task file names its
own loop_var instead: whether the included tasks loop on `item` today is theirs to change (the serving stage's
verification warned through vllm_serving's validate.yml when only monitoring was checked here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = [
    *sorted((ROOT / "playbooks").glob("*.yml")),
    *sorted((ROOT / "playbooks" / "remediate").glob("*.yml")),
]
TASK_FILES = [
    *sorted((ROOT / "playbooks" / "remediate" / "tasks").glob("*.yml")),
    *sorted((ROOT / "roles").glob("*/tasks/*.yml")),
    *sorted((ROOT / "roles").glob("*/handlers/*.yml")),
]
INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.include_tasks")


def tasks(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for task in items or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from tasks(task.get(key) or [])


def include_loops(path: Path) -> Iterator[dict[str, Any]]:
    content = yaml.safe_load(path.read_text()) or []
    sections = (
        [play.get(key) or [] for play in content for key in ("pre_tasks", "tasks", "post_tasks", "handlers")]
        if path in PLAYBOOKS
        else [content]
    )
    for section in sections:
        for task in tasks(section):
            if any(key in task for key in INCLUDES) and "loop" in task:
                yield task


def test_every_including_loop_names_its_own_loop_var() -> None:
    found = []
    for path in PLAYBOOKS + TASK_FILES:
        for task in include_loops(path):
            loop_var = (task.get("loop_control") or {}).get("loop_var", "item")
            found.append((str(path.relative_to(ROOT)), task["name"], loop_var))
    # the stages' validation loops, the model stage's per-model includes, the remediations' drains
    assert len(found) >= 10, f"only {found}: this test no longer looks where the including loops are"
    assert [entry for entry in found if entry[2] == "item"] == []
