"""Role check_argument_types: one assert checks every variable of the including role against its argument
spec type (plugins/filter/argument_types.py says which are wrong, with the Jinja tests the role's loop used),
and the message names each wrong variable, what it must be and how to pass it with -e, one sentence each as
when the role looped over the variables."""

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
from playbook_text import flat

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("argument_types", ROOT / "plugins/filter/argument_types.py")
assert _SPEC and _SPEC.loader
at = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(at)


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
    wrong = at.argument_type_mismatches(options, values)
    assert [w["value"] for w in wrong] == bad
    assert {w["type"] for w in wrong} <= {kind}


def test_types_it_does_not_check_and_options_without_a_type_pass() -> None:
    options = {"a": {"type": "str"}, "b": {"type": "path"}, "c": {"type": "raw"}, "d": {}, "e": None}
    assert at.argument_type_mismatches(options, dict.fromkeys(options, 5)) == []


def test_every_wrong_variable_in_the_order_of_the_spec() -> None:
    options = {
        "x_flag": {"type": "bool"},
        "x_count": {"type": "int"},
        "x_ok": {"type": "int"},
        "x_list": {"type": "list"},
    }
    values = {"x_flag": "false", "x_count": "3", "x_ok": 3, "x_list": "a,b"}
    assert at.argument_type_mismatches(options, values) == [
        {"name": "x_flag", "type": "bool", "value": "false"},
        {"name": "x_count", "type": "int", "value": "3"},
        {"name": "x_list", "type": "list", "value": "a,b"},
    ]


def test_a_checked_variable_without_a_value_is_a_bug_of_the_caller() -> None:
    with pytest.raises(at.AnsibleFilterError, match="no value given for x_count"):
        at.argument_type_mismatches({"x_count": {"type": "int"}}, {})


def run_validate(role: str, extra: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """ROLE's tasks/validate.yml on this machine, with EXTRA as extra vars (JSON: their types kept)."""
    playbook = tmp_path / "validate.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        f"    - ansible.builtin.include_role:\n        name: {role}\n        tasks_from: validate\n"
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            str(playbook),
            "-e",
            json.dumps({"ansible_python_interpreter": sys.executable, **extra}),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def sentence(name: str, wanted: str, got: str, example: str) -> str:
    """The message for one variable, as the role's loop gave it for each."""
    return (
        f"{name} must be {wanted}; got {got} (a str). `-e {name}=...` passes a string: pass JSON,"
        f" -e '{{\"{name}\": {example}}}', or use an extra-vars file."
    )


def test_one_failure_names_every_wrong_variable_as_before(tmp_path: Path) -> None:
    # what -e gpu_tuning_power_limit_w=180 -e gpu_tuning_persistence_mode=false -e gpu_tuning_gpus=0,1 passes
    done = run_validate(
        "gpu_tuning",
        {"gpu_tuning_power_limit_w": "180", "gpu_tuning_persistence_mode": "false", "gpu_tuning_gpus": "0,1"},
        tmp_path,
    )
    assert done.returncode != 0
    out = flat(done.stdout).replace("''", "'")
    # one failed task, each wrong variable named with its own sentence
    assert out.count("fatal: [localhost]") == 1, done.stdout[-3000:]
    assert "check_argument_types : Check the variable types of role gpu_tuning" in out
    for expected in [
        sentence("gpu_tuning_power_limit_w", "a whole number", '"180"', "180"),
        sentence("gpu_tuning_persistence_mode", "true or false", '"false"', "false"),
        sentence("gpu_tuning_gpus", "a list", '"0,1"', "[]"),
    ]:
        assert expected in out, done.stdout[-3000:]
    # a variable of the right type is not named
    assert "gpu_tuning_target_temperature_c must" not in out


def test_values_of_their_types_pass(tmp_path: Path) -> None:
    done = run_validate("kubernetes_api_client", {}, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "Check the variable types of role kubernetes_api_client" in done.stdout


def test_roles_include_it_without_the_check_of_its_own_argument_spec_which_has_no_options() -> None:
    """Ansible's check of check_argument_types' own argument specs (before its task, at every include) would
    check nothing: it takes no parameters. Every include skips it (rolespec_validate: false)."""
    specs = yaml.safe_load((ROOT / "roles/check_argument_types/meta/argument_specs.yml").read_text())
    assert specs["argument_specs"]["main"]["options"] == {}
    includes = []
    for path in sorted(ROOT.glob("roles/*/tasks/*.yml")):
        for task in yaml.safe_load(path.read_text()) or []:
            include = task.get("ansible.builtin.include_role") or {}
            if include.get("name") == "check_argument_types":
                includes.append((path.parent.parent.name, include.get("rolespec_validate")))
    assert len(includes) >= 20, includes
    assert [(role, skip) for role, skip in includes if skip is not False] == []
