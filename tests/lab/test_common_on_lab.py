"""The common role's refusals on the lab, over SSH: values that would lock the
operators out fail before anything changes, naming the variable.

    make lab-up && .venv/bin/pytest -m lab tests/lab/test_common_on_lab.py -v
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
RECAP = re.compile(
    r"^gpu-node-1\s+:\s+ok=\d+\s+changed=(?P<changed>\d+)\s+unreachable=\d+\s+failed=(?P<failed>\d+)", re.M
)


def common_playbook(extra_vars: dict) -> tuple[int, str]:
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i", "inventories/lab/hosts.yml", "playbooks/common.yml",
            "--limit", "gpu-node-1", "-e", json.dumps(extra_vars),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        timeout=600,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("extra_vars", "expected"),
    [
        # labadmin (the login user) is only in group labadmin
        ({"common_ssh_allow_groups": ["ops"]}, "common_ssh_allow_groups=['ops'] would lock out labadmin"),
        (
            {"common_ops_users": [{"name": "labadmin", "state": "absent"}]},
            "common_ops_users: refusing to remove labadmin",
        ),
        ({"common_ssh_permit_root_login": "maybe"}, "common_ssh_permit_root_login"),
        ({"common_ssh_max_auth_tries": "three"}, "common_ssh_max_auth_tries"),
    ],
)
def test_lockouts_fail_before_any_change(extra_vars, expected):
    rc, output = common_playbook(extra_vars)

    assert rc != 0, output[-3000:]
    assert expected in output, output[-3000:]
    recap = RECAP.search(output)
    assert recap is not None, output[-3000:]
    assert recap["changed"] == "0"
    assert recap["failed"] == "1"
