"""plugins/action/value_checks.py: a role's checks in order, in one task, failing with the first wrong one's
message (templated only then); a check's when; the shape of the checks refused with a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

CHECKS: list[dict[str, Any]] = [
    {"that": "size is integer", "fail_msg": "size must be a whole number; got {{ size | to_json }}."},
    {"that": ["size > 0", "size < 10"], "fail_msg": "size must be 1 to 9; got {{ size }}."},
    # relies on the checks before it: size is a number here
    {
        "that": "limit >= size",
        "fail_msg": "limit ({{ limit }}) must be at least size ({{ size }}).",
        "when": "limit is defined",
    },
    # never evaluated: its message would fail to template
    {"that": False, "fail_msg": "{{ no_such_variable.attribute }}", "when": [False]},
]


def run(
    tmp_path: Path, checks: Any, extra: dict[str, Any] | None = None, **variables: Any
) -> tuple[int, str]:
    """One value_checks task on localhost with VARIABLES as play vars and EXTRA as extra vars (JSON)."""
    tasks = [
        {"name": "Check", "value_checks": {"checks": checks}, "register": "checked"},
        {"name": "Show", "ansible.builtin.debug": {"msg": "RESULT {{ checked.msg }}"}},
    ]
    play = [{"hosts": "localhost", "gather_facts": False, "vars": variables, "tasks": tasks}]
    playbook = tmp_path / "checks.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         str(playbook), "-e", json.dumps({"ansible_python_interpreter": sys.executable, **(extra or {})})],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_checks_that_hold_pass_and_say_how_many_were_evaluated(tmp_path: Path) -> None:
    rc, out = run(tmp_path, CHECKS, size=3, limit=4)
    assert rc == 0, out
    assert "RESULT 3 of 4 checks evaluated, all hold" in out


def test_a_check_whose_when_is_false_is_not_evaluated(tmp_path: Path) -> None:
    rc, out = run(tmp_path, CHECKS, size=3)
    assert rc == 0, out
    assert "RESULT 2 of 4 checks evaluated, all hold" in out


@pytest.mark.parametrize(
    ("extra", "says", "assertion"),
    [
        # from -e, a string: the type check fails first, and the range check after it is never evaluated
        ({"size": "3"}, 'size must be a whole number; got "3".', "size is integer"),
        ({"size": 12}, "size must be 1 to 9; got 12.", "size < 10"),
        ({"size": 5, "limit": 2}, "limit (2) must be at least size (5).", "limit >= size"),
    ],
)
def test_the_first_check_that_fails_fails_the_task_with_its_message(
    tmp_path: Path, extra: dict[str, Any], says: str, assertion: str
) -> None:
    rc, out = run(tmp_path, CHECKS, extra, size=1)
    assert rc == 2, out
    assert says in out
    assert f"assertion: {assertion}" in out
    assert "RESULT" not in out


@pytest.mark.parametrize(
    ("checks", "says"),
    [
        ([], "checks must be a non-empty list of checks"),
        ([{"that": "true"}], "checks[0] must have that and fail_msg (a string), and may have when"),
        ([{"that": "true", "fail_msg": "x", "msg": "y"}], "checks[0] must have that and fail_msg"),
        ([{"that": [], "fail_msg": "x"}], "checks[0].that must be a condition or a list of conditions"),
        ([{"that": "true", "fail_msg": "x", "when": [{"a": 1}]}], "checks[0].when must be a condition"),
    ],
)
def test_a_malformed_check_is_refused_naming_it(tmp_path: Path, checks: list[Any], says: str) -> None:
    rc, out = run(tmp_path, checks, size=1)
    assert rc == 2, out
    assert says in out
