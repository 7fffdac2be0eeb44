"""A stage validates each role once per run: its validation play records the roles it validated
(llm_platform_validated_roles), and each of those roles' tasks/main.yml skips its validate.yml for a role
recorded, at the cost of one skipped task. Held here:

- each stage records exactly the roles its validation play validated (with their meta dependencies, which
  run with them, and the roles their validate.yml validates), after the last validation;
- a role skips validate.yml only for its own name in the record, and every recorded role does (no role run
  alone, or by another playbook, loses its validation: nothing else sets the record); so does its
  tasks/settings.yml, where other roles and plays load its values;
- no play or task enters a recorded role with values of its own (vars or role parameters), which its
  validation would not have seen.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RECORD = "llm_platform_validated_roles"
# stage playbook -> index of its validation play (models.yml validates in its one play's pre_tasks)
STAGES = {
    "playbooks/gpu.yml": 0,
    "playbooks/kubernetes.yml": 0,
    "playbooks/gpu-health-agent.yml": 0,
    "playbooks/models.yml": 0,
    "playbooks/serving.yml": 0,
}


def load(path: str | Path) -> Any:
    return yaml.safe_load((ROOT / path).read_text())


def tasks(items: list[dict[str, Any]] | None) -> Iterator[dict[str, Any]]:
    for task in items or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from tasks(task.get(key))


def play_tasks(play: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for key in ("pre_tasks", "tasks", "post_tasks") for t in tasks(play.get(key))]


def dependencies(role: str) -> list[str]:
    meta = load(f"roles/{role}/meta/main.yml") or {}
    found = []
    for dep in meta.get("dependencies") or []:
        name = dep["role"] if isinstance(dep, dict) else dep
        found += [name, *dependencies(name)]
    return found


def validated_by(role: str) -> list[str]:
    """The other roles ROLE's validate.yml validates (include_role tasks_from validate), and theirs."""
    found = []
    for task in tasks(load(f"roles/{role}/tasks/validate.yml")):
        include = task.get("ansible.builtin.include_role") or {}
        if include.get("tasks_from") == "validate":
            found += [include["name"], *validated_by(include["name"])]
    return found


def validated(play: dict[str, Any]) -> tuple[list[str], int]:
    """The roles PLAY validates (include_role tasks_from validate, loops resolved from the play's vars) and
    the index of its last such task."""
    roles: list[str] = []
    last = -1
    for index, task in enumerate(play_tasks(play)):
        include = task.get("ansible.builtin.include_role") or {}
        if include.get("tasks_from") != "validate":
            continue
        loop = task.get("loop", [include["name"]])
        if isinstance(loop, str):
            loop = play["vars"][loop.strip("{} ")]
        roles += loop
        last = index
    return roles, last


def recorded(play: dict[str, Any]) -> tuple[list[str], int]:
    """The roles PLAY records as validated, and the index of the task that records them."""
    found = [
        (index, task["ansible.builtin.set_fact"][RECORD])
        for index, task in enumerate(play_tasks(play))
        if RECORD in (task.get("ansible.builtin.set_fact") or {})
    ]
    assert len(found) == 1, f"{play['name']}: one task records the validated roles, found {found}"
    index, value = found[0]
    if isinstance(value, str):
        value = jinja2.Environment().from_string(value).render(**play.get("vars", {}))
        value = yaml.safe_load(value)
    return value, index


def guarded_roles() -> dict[str, str]:
    """role -> the `when` of the task of its tasks/main.yml that includes validate.yml (or '' if imported)."""
    found = {}
    for main in sorted(ROOT.glob("roles/*/tasks/main.yml")):
        for task in tasks(load(main)):
            if task.get("ansible.builtin.include_tasks") == "validate.yml":
                found[main.parent.parent.name] = str(task.get("when", ""))
            elif task.get("ansible.builtin.import_tasks") == "validate.yml":
                found[main.parent.parent.name] = ""
    return found


def all_recorded() -> set[str]:
    return {role for path, index in STAGES.items() for role in recorded(load(path)[index])[0]}


@pytest.mark.parametrize("path", list(STAGES))
def test_a_stage_records_the_roles_its_validation_play_validated_after_validating_them(path: str) -> None:
    play = load(path)[STAGES[path]]
    roles, last_validation = validated(play)
    record, at = recorded(play)
    assert roles, f"{path}: no validation found where this test looks"
    assert set(record) == set(roles) | {
        other for role in roles for other in [*dependencies(role), *validated_by(role)]
    }
    assert at > last_validation


def test_only_the_roles_a_stage_records_skip_their_validation_and_each_only_for_its_own_name() -> None:
    guards = guarded_roles()
    recorded_roles = all_recorded()
    for role in recorded_roles:
        assert f"'{role}' not in {RECORD} | default([])" in guards.get(role, ""), (
            f"roles/{role}/tasks/main.yml: include validate.yml when '{role}' is not in {RECORD}"
        )
    skipping = {role for role, when in guards.items() if RECORD in when}
    assert skipping == recorded_roles
    # the roles no stage validation play validates still import it unconditionally
    assert {role for role, when in guards.items() if not when} >= {"common", "model_rollout"}


def playbook_plays(path: Path) -> list[dict[str, Any]]:
    content = load(path)
    return [p for p in content if "hosts" in p] if isinstance(content, list) else []


def task_files() -> list[Path]:
    """Every task list: the roles' and the playbooks' task files."""
    return sorted(
        [
            *ROOT.glob("roles/*/tasks/*.yml"),
            *ROOT.glob("playbooks/tasks/*.yml"),
            *ROOT.glob("playbooks/*/tasks/*.yml"),
        ]
    )


def test_the_record_is_set_only_by_the_stages_validation() -> None:
    setters = [
        str(path.relative_to(ROOT))
        for path in sorted(
            [*ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("roles/**/*.yml"), *ROOT.glob("molecule/**/*.yml")]
        )
        if re.search(rf"^\s+{RECORD}:", path.read_text(), flags=re.M)
    ]
    assert setters == sorted(STAGES)


def test_no_play_or_task_enters_a_recorded_role_with_values_of_its_own() -> None:
    recorded_roles = all_recorded()
    offenders = []
    sources: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted([*ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("molecule/**/*.yml")]):
        for play in playbook_plays(path):
            for entry in play.get("roles") or []:
                entry = {"role": entry} if isinstance(entry, str) else entry
                if entry["role"] in recorded_roles and set(entry) - {"role"}:
                    offenders.append(
                        (str(path.relative_to(ROOT)), entry["role"], sorted(set(entry) - {"role"}))
                    )
            sources += [(path, task) for task in play_tasks(play)]
    sources += [(path, task) for path in task_files() for task in tasks(load(path))]
    assert len(sources) > 500, "this test no longer looks where the tasks are"
    for path, task in sources:
        for key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
            include = task.get(key) or {}
            entering_main = include.get("tasks_from", "main") == "main"
            if include.get("name") in recorded_roles and entering_main and task.get("vars"):
                offenders.append((str(path.relative_to(ROOT)), include["name"], sorted(task["vars"])))
    assert offenders == []


def test_gpu_tuning_validates_again_where_nvml_did_not_answer_the_validation_play(tmp_path: Path) -> None:
    """gpu.yml validates gpu_tuning before the driver may exist (NVML optional there): where NVML did not
    answer, the role's checks against the GPUs must run again once nvidia_driver has installed it."""
    (task,) = [t for t in load("roles/gpu_tuning/tasks/main.yml") if t.get("ansible.builtin.include_tasks")]
    answered = {"changed": False, "ansible_facts": {"nvidia": {"gpu_count": 4, "gpus": []}}}
    no_driver = {"changed": False, "failed": False, "msg": "NVML Shared Library Not Found"}
    cases = [  # (the record, what the validation play's GPU read registered, validate.yml runs)
        ([], answered, True),
        (["gpu_tuning"], answered, False),
        (["gpu_tuning"], no_driver, True),
        (["gpu_tuning"], None, True),
        (["nvidia_driver"], answered, True),
    ]
    checks = []
    for record, read, runs in cases:
        given: dict[str, Any] = {RECORD: record}
        if read is not None:
            given["__gpu_tuning_facts"] = read
        checks.append(
            {
                "ansible.builtin.assert": {"that": f"({task['when']}) == {runs}"},
                "vars": given,
            }
        )
    playbook = tmp_path / "when.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "vars_files": [str(ROOT / "roles/gpu_tuning/vars/main.yml")],
                    "tasks": checks,
                }
            ]
        )
    )
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            str(playbook),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "ok=5" in done.stdout


def test_where_validate_yml_is_skipped_main_yml_loads_the_values_it_would_have_loaded() -> None:
    """A validate.yml that loads another role's values (include_role public) runs in the validation play, and
    what it loads stays in that play: the role's tasks/main.yml loads it where it skips validate.yml."""
    checked = 0
    for role in sorted(all_recorded()):
        loads = [
            (
                t["ansible.builtin.include_role"]["name"],
                t["ansible.builtin.include_role"].get("tasks_from", "main"),
            )
            for t in tasks(load(f"roles/{role}/tasks/validate.yml"))
            if (t.get("ansible.builtin.include_role") or {}).get("public")
        ]
        main = list(tasks(load(f"roles/{role}/tasks/main.yml")))
        for name, tasks_from in loads:
            checked += 1
            assert [
                t
                for t in main
                if (t.get("ansible.builtin.include_role") or {}).get("name") == name
                # settings.yml: validate.yml where the role is not recorded, as main.yml does
                and t["ansible.builtin.include_role"].get("tasks_from", "main") in (tasks_from, "settings")
                and t["ansible.builtin.include_role"].get("public")
                and t.get("when") == f"'{role}' in {RECORD} | default([])"
            ], f"roles/{role}/tasks/main.yml: load {name} ({tasks_from}) where validate.yml is skipped"
    assert checked >= 2  # gpu_health_agent's and vllm_serving's nvidia_device_plugin


def test_a_roles_settings_entry_point_skips_validation_only_for_its_own_name_in_the_record() -> None:
    """tasks/settings.yml (another role or play loads the role's values there, public) validates as main.yml
    does: unless the role is recorded."""
    settings = sorted(ROOT.glob("roles/*/tasks/settings.yml"))
    assert len(settings) >= 5
    for path in settings:
        role = path.parent.parent.name
        (include,) = [
            t for t in tasks(load(path)) if t.get("ansible.builtin.include_tasks") == "validate.yml"
        ]
        assert include.get("when") == f"'{role}' not in {RECORD} | default([])", str(path)
