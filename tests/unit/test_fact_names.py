"""Facts are read as ansible_facts[...] only: ansible.cfg sets inject_facts_as_vars = False, so the top-level
copies (ansible_distribution, ansible_default_ipv4, ...) do not exist, and a task reading one would fail as
undefined, or, behind `| default(...)`, quietly read its default. No role, playbook, template or scenario
names one; the fact names are those the setup module gathers on this machine."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["roles", "playbooks", "molecule", "inventories", "tests/lab"]
SUFFIXES = {".yml", ".yaml", ".j2", ".cfg"}
NAME = re.compile(r"\bansible_[a-z0-9_]+")


def fact_names(tmp_path: Path) -> set[str]:
    """The top-level fact variables inject_facts_as_vars would make, as the setup module names them here."""
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"gather_subset": ["all"]}}))
    done = subprocess.run(
        [sys.executable, "-m", "ansible.modules.setup", str(args)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return set(json.loads(done.stdout)["ansible_facts"])


def test_the_controller_does_not_make_the_top_level_fact_copies() -> None:
    config = (ROOT / "ansible.cfg").read_text()
    assert re.search(r"^inject_facts_as_vars = False$", config, re.MULTILINE)


def test_no_file_reads_a_fact_as_a_top_level_variable(tmp_path: Path) -> None:
    facts = fact_names(tmp_path)
    assert {"ansible_distribution", "ansible_default_ipv4", "ansible_user_id"} <= facts
    used = []
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                code = line.split("#", 1)[0] if path.suffix != ".j2" else line
                used += [f"{path.relative_to(ROOT)}:{number}: {n}" for n in NAME.findall(code) if n in facts]
    assert used == []
