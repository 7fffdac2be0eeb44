"""value_checks' argument_types (plugins/action/value_checks.py): the task's role's variables against the
types of its own meta/argument_specs.yml, with the Jinja tests the checks used before; one failure names each
wrong variable, what it must be and how to pass it with -e, one sentence each; every role's validation checks
them first. The action plugin runs on the controller: these tests import its Ansible (ansible.errors), which
keeps them out of the node-side pass under 3.10 (scripts/node-python.py tests), where importing it breaks the
pytest worker for every module test after it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleActionFail
from playbook_text import flat

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("value_checks_action", ROOT / "plugins/action/value_checks.py")
assert _SPEC and _SPEC.loader
vc = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(vc)


@pytest.mark.parametrize(
    ("kind", "good", "bad"),
    [
        ("bool", [True, False], ["false", "yes", 0, 1, None]),
        ("int", [0, 180, -1], ["180", 1.5, True, False, None, [1]]),
        # Jinja's `number` test: any number, a bool included (as before)
        ("float", [0.9, 1, True], ["0.9", None]),
        ("list", [[], [0, 1], (0, 1)], ["0,1", {}, {"a": 1}, None, 3, {0, 1}]),
        ("dict", [{}, {"a": 1}], ["{}", [], "a=1", None]),
    ],
)
def test_each_type_takes_its_values_and_refuses_the_others(
    kind: str, good: list[Any], bad: list[Any]
) -> None:
    options = {f"v{i}": {"type": kind} for i in range(len(good) + len(bad))}
    values = dict(zip(options, good + bad, strict=True))
    wrong = vc.argument_type_mismatches(options, values)
    assert [w["value"] for w in wrong] == bad
    assert {w["type"] for w in wrong} <= {kind}


def test_types_it_does_not_check_and_options_without_a_type_pass() -> None:
    options = {"a": {"type": "str"}, "b": {"type": "path"}, "c": {"type": "raw"}, "d": {}, "e": None}
    assert vc.argument_type_mismatches(options, dict.fromkeys(options, 5)) == []


def test_every_wrong_variable_in_the_order_of_the_spec() -> None:
    options = {
        "x_flag": {"type": "bool"},
        "x_count": {"type": "int"},
        "x_ok": {"type": "int"},
        "x_list": {"type": "list"},
    }
    values = {"x_flag": "false", "x_count": "3", "x_ok": 3, "x_list": "a,b"}
    assert vc.argument_type_mismatches(options, values) == [
        {"name": "x_flag", "type": "bool", "value": "false"},
        {"name": "x_count", "type": "int", "value": "3"},
        {"name": "x_list", "type": "list", "value": "a,b"},
    ]


def test_a_checked_variable_without_a_value_is_named() -> None:
    with pytest.raises(AnsibleActionFail, match="no value given for x_count"):
        vc.argument_type_mismatches({"x_count": {"type": "int"}}, {})


def test_the_typed_options_are_read_from_the_roles_own_specs() -> None:
    options = vc.typed_options(str(ROOT / "roles/gpu_tuning"))
    specs = yaml.safe_load((ROOT / "roles/gpu_tuning/meta/argument_specs.yml").read_text())
    main = specs["argument_specs"]["main"]["options"]
    assert set(options) == {name for name, spec in main.items() if spec.get("type") in vc.TYPES}
    assert "gpu_tuning_power_limit_w" in options


def ansible_playbook(
    playbook: Path, extra: dict[str, Any] | None = None, roles: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """PLAYBOOK on this machine; EXTRA as extra vars (JSON: their types kept), ROLES as the roles path."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    if roles is not None:
        env["ANSIBLE_ROLES_PATH"] = str(roles)
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         str(playbook), "-e", json.dumps({"ansible_python_interpreter": sys.executable, **(extra or {})})],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip


def run_validate(role: str, extra: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """ROLE's tasks/validate.yml on this machine, with EXTRA as extra vars."""
    playbook = tmp_path / "validate.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        f"    - ansible.builtin.include_role:\n        name: {role}\n        tasks_from: validate\n"
    )
    return ansible_playbook(playbook, extra)


def sentence(name: str, wanted: str, got: str, example: str) -> str:
    """The message for one variable."""
    return (
        f"{name} must be {wanted}; got {got} (a str). `-e {name}=...` passes a string: pass JSON,"
        f" -e '{{\"{name}\": {example}}}', or use an extra-vars file."
    )


def test_one_failure_names_every_wrong_variable(tmp_path: Path) -> None:
    # what -e gpu_tuning_power_limit_w=180 -e gpu_tuning_persistence_mode=false -e gpu_tuning_gpus=0,1 passes
    done = run_validate(
        "gpu_tuning",
        {"gpu_tuning_power_limit_w": "180", "gpu_tuning_persistence_mode": "false", "gpu_tuning_gpus": "0,1"},
        tmp_path,
    )
    assert done.returncode != 0
    out = flat(done.stdout).replace("''", "'")
    # one failed task, the role's first check, each wrong variable named with its own sentence
    assert out.count("fatal: [localhost]") == 1, done.stdout[-3000:]
    assert "gpu_tuning : Check the gpu_tuning values that need no GPU" in out
    for expected in [
        sentence("gpu_tuning_power_limit_w", "a whole number", '"180"', "180"),
        sentence("gpu_tuning_persistence_mode", "true or false", '"false"', "false"),
        sentence("gpu_tuning_gpus", "a list", '"0,1"', "[]"),
    ]:
        assert expected in out, done.stdout[-3000:]
    # a variable of the right type is not named
    assert "gpu_tuning_target_temperature_c must" not in out


def fixture_role(tmp_path: Path, specs: dict[str, Any] | None) -> Path:
    """Role x in TMP_PATH/roles: x_list a list whose default is a Jinja expression, x_count an int; its
    tasks one value_checks task with argument_types. SPECS replaces its argument specs."""
    role = tmp_path / "roles" / "x"
    for sub in ("defaults", "meta", "tasks"):
        (role / sub).mkdir(parents=True)
    (role / "defaults/main.yml").write_text('x_source: [1, 2]\nx_list: "{{ x_source }}"\nx_count: 3\n')
    options = {"x_list": {"type": "list"}, "x_count": {"type": "int"}, "x_source": {"type": "raw"}}
    default_specs = {"argument_specs": {"main": {"short_description": "x", "options": options}}}
    (role / "meta/argument_specs.yml").write_text(
        yaml.safe_dump(specs if specs is not None else default_specs)
    )
    (role / "tasks/main.yml").write_text(
        "- name: Check the x values\n  value_checks:\n    argument_types: true\n  register: checked\n"
        "- name: Show\n  ansible.builtin.debug:\n    msg: RESULT {{ checked.msg }}\n"
    )
    return tmp_path / "roles"


def run_role(roles: Path, extra: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    playbook = roles.parent / "play.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  roles: [x]\n")
    return ansible_playbook(playbook, extra, roles)


def test_values_of_their_types_pass_and_a_jinja_default_is_checked_as_it_renders(tmp_path: Path) -> None:
    roles = fixture_role(tmp_path, None)
    done = run_role(roles, {})
    assert done.returncode == 0, done.stdout[-3000:]
    assert "RESULT the argument types, all hold" in done.stdout
    # x_list's default renders x_source: a string there makes x_list a string
    done = run_role(roles, {"x_source": "1,2"})
    assert done.returncode == 2, done.stdout[-3000:]
    out = flat(done.stdout).replace("''", "'")
    assert sentence("x_list", "a list", '"1,2"', "[]") in out, done.stdout[-3000:]
    assert "x_count must" not in out


@pytest.mark.parametrize(
    ("specs", "says"),
    [
        (
            {"argument_specs": {"settings": {"options": {}}}},
            "has no argument_specs.main to check the types by",
        ),
        (["not", "a", "mapping"], "has no argument_specs.main to check the types by"),
    ],
)
def test_specs_without_a_main_entry_point_are_refused_naming_the_file(
    tmp_path: Path, specs: Any, says: str
) -> None:
    done = run_role(fixture_role(tmp_path, specs), {})
    assert done.returncode == 2, done.stdout[-3000:]
    assert "meta/argument_specs.yml " + says in flat(done.stdout), done.stdout[-3000:]


def test_a_task_outside_a_role_is_refused(tmp_path: Path) -> None:
    playbook = tmp_path / "outside.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - value_checks:\n        argument_types: true\n"
    )
    done = ansible_playbook(playbook)
    assert done.returncode == 2, done.stdout[-3000:]
    assert "argument_types: true needs a task of a role" in done.stdout


def test_every_role_with_typed_variables_checks_them_first_in_its_validation() -> None:
    """Each role whose argument specs type a variable as bool, int, float, list or dict checks the types in
    the first value_checks task of its validation (tasks/validate.yml, or main.yml where it has none), before
    any other check of its values. model_rollout is the exception: its values come from the rollout
    playbooks' `-e model=... weight=20` (strings), which its own checks convert and check."""
    unchecked = []
    for specs_file in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        role = specs_file.parent.parent
        if not vc.typed_options(str(role)) or role.name == "model_rollout":
            continue
        entry = role / "tasks" / ("validate.yml" if (role / "tasks/validate.yml").exists() else "main.yml")
        checks = [t for t in yaml.safe_load(entry.read_text()) or [] if "value_checks" in t]
        if not checks or checks[0]["value_checks"].get("argument_types") is not True:
            unchecked.append(role.name)
    assert unchecked == []
