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


# ansible_facts keys other modules set, not setup: gpu_facts, package_facts, service_facts, getent
FACTS_OF_OTHER_MODULES = {"nvidia", "packages", "services", "getent_passwd"}
# gathered by min's ssh_pub_keys where the machine has that host key (every server; not this test's machine)
FACTS_WHERE_PRESENT = {"ssh_host_key_ed25519_public"}
FACT_READ = re.compile(r"""ansible_facts(?:\[['"]([a-z0-9_]+)['"]\]|\.([a-z0-9_]+))""")


def test_every_fact_read_is_in_the_subsets_ansible_cfg_gathers(tmp_path: Path) -> None:
    """ansible.cfg's gather_subset leaves the slow subsets out: every fact a role or playbook reads must be in
    what it gathers (or set by another module), or the read would find it undefined."""
    subset = re.search(r"^gather_subset = (.+)$", (ROOT / "ansible.cfg").read_text(), re.MULTILINE)
    assert subset, "ansible.cfg sets gather_subset"
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"gather_subset": subset[1].split(",")}}))
    done = subprocess.run(
        [sys.executable, "-m", "ansible.modules.setup", str(args)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    gathered = {name.removeprefix("ansible_") for name in json.loads(done.stdout)["ansible_facts"]}
    read = set()
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file():
                read |= {a or b for a, b in FACT_READ.findall(path.read_text(errors="replace"))}
    assert {"distribution", "kernel", "interfaces", "ssh_host_key_ed25519_public"} <= read
    assert read - gathered - FACTS_OF_OTHER_MODULES - FACTS_WHERE_PRESENT == set()
    assert "swaptotal_mb" not in gathered  # the hardware subset is not gathered
