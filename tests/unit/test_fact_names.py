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


# Facts other modules than setup add (nvidia: gpu_facts; packages: package_facts; services: service_facts;
# getent_passwd: getent): not a subset question.
MODULE_FACTS = {"nvidia", "packages", "services", "getent_passwd"}
FACT_READ = re.compile(r"ansible_facts(?:\[['\"]([a-z0-9_]+)['\"]\]|\.([a-z0-9_]+))")
SITE_SUBSET = ["!all", "min", "network"]


def gathered(tmp_path: Path, subset: list[str]) -> set[str]:
    """The keys of ansible_facts the setup module returns here for SUBSET (without the ansible_ prefix)."""
    args = tmp_path / "subset.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"gather_subset": subset}}))
    done = subprocess.run(
        [sys.executable, "-m", "ansible.modules.setup", str(args)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    names = {name.removeprefix("ansible_") for name in json.loads(done.stdout)["ansible_facts"]}
    # min's ssh_pub_keys collector returns only the host keys this machine has (a CI machine may have none)
    from ansible.module_utils.facts.system.ssh_pub_keys import SshPubKeyFactCollector

    return names | (set(SshPubKeyFactCollector._fact_ids) if "min" in subset else set())


def test_the_gathering_plays_gather_what_the_roles_read_and_no_more(tmp_path: Path) -> None:
    """Every fact a role or playbook reads is in the subsets the stages' gathering plays name, and every
    gathering play of the site's stages names them (without one, setup gathers the hardware subset too)."""
    import yaml

    facts = gathered(tmp_path, SITE_SUBSET)
    assert "memtotal_mb" not in facts and {"kernel", "interfaces", "ssh_host_key_ed25519_public"} <= facts
    read = set()
    for source in ("roles", "playbooks"):
        for path in (ROOT / source).rglob("*"):
            if path.suffix in SUFFIXES | {".py"} and path.is_file():
                read |= {a or b for a, b in FACT_READ.findall(path.read_text(errors="replace"))}
    assert {"kernel", "interfaces", "nodename"} <= read
    assert sorted(read - MODULE_FACTS - facts) == []

    def plays(playbook: str) -> list[dict]:
        entries = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())
        return [
            play
            for entry in entries
            for play in (
                plays(entry["ansible.builtin.import_playbook"])
                if "ansible.builtin.import_playbook" in entry
                else [entry]
            )
        ]

    gathering = [play for play in plays("site.yml") if play.get("gather_facts", True)]
    assert len(gathering) >= 3
    assert [
        play["name"] for play in gathering if not set(play.get("gather_subset", ["all"])) <= set(SITE_SUBSET)
    ] == []
