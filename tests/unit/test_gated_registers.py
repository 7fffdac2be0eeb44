"""A task file included under a gate (an `include_tasks` with a `when`) that a converged node skips registers
nothing: Ansible leaves a skipped include's `register` and `set_fact` names UNDEFINED, where an import, or the
same tasks inline, left a skipped result. So a name set inside a gated file and read by the role's vars or
handlers (evaluated wherever they are used) must be read guarded (`is defined`, `is not defined`,
`default(...)`) in the same expression, or be named here with the reason it cannot be read when the file was
skipped. The merge of issue 19's gates failed the lab's first converge on one such read (containerd's
`__containerd_config_reread`, in vars/main.yml).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = "ansible.builtin.include_tasks"
IMPORT = "ansible.builtin.import_tasks"

# (role, name): why an unguarded read by the role's vars or handlers cannot meet the name undefined
READ_ONLY_WHEN_ENTERED = {
    ("kubernetes_node", "__kubernetes_node_kubelet_conf"): (
        "vars/main.yml's __kubernetes_node_in_cluster falls back to it only where "
        "__kubernetes_node_pin_state.stat is not defined: the first term of "
        "install-and-hold-kube-packages.yml's gate, whose stat task ran then"
    ),
    ("gpu_tuning", "__gpu_tuning_facts"): (
        "registered by validate.yml, which the stage's validation play runs on the same hosts before the "
        "role (llm_platform_validated_roles), or main.yml enters first wherever __gpu_tuning_nvml (read "
        "from it) is undefined; the vars that read it are read only after that"
    ),
    ("nvidia_driver", "__nvidia_driver_mokutil"): (
        "read-secure-boot.yml is imported by validate.yml, which the stage's validation play runs on the "
        "same hosts before the role, or main.yml enters first"
    ),
    ("nvidia_driver", "__nvidia_driver_secure_boot"): "set by validate.yml's read-secure-boot.yml, as above",
    ("model_sync", "__model_sync_rrsync"): (
        "read by vars/main.yml's __model_sync_key_options, which only authorize-source.yml's own tasks read"
    ),
    ("model_sync", "__model_sync_rrsync_look"): (
        "read by vars/main.yml's __model_sync_rrsync_found, which only rrsync.yml's and "
        "authorize-source.yml's own tasks read"
    ),
}

# (role, including file, gated file, names the gated file sets, the files it covers)
Gate = tuple[str, str, str, set[str], set[str]]


def tasks_of(entries: Any) -> Iterator[dict[str, Any]]:
    for entry in entries or []:
        if not isinstance(entry, dict):
            continue
        yield entry
        for part in ("block", "rescue", "always"):
            yield from tasks_of(entry.get(part))


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def names_set_by(task: dict[str, Any]) -> set[str]:
    names = {task["register"]} if "register" in task else set()
    facts = task.get("ansible.builtin.set_fact")
    if isinstance(facts, dict):
        names |= {key for key in facts if key != "cacheable"}
    return names


def set_names(role: Path, name: str, covered: set[str]) -> set[str]:
    """The names a task file sets (register, set_fact), with the files it imports or includes (added to
    COVERED)."""
    if name in covered:
        return set()
    covered.add(name)
    names: set[str] = set()
    for task in tasks_of(load(role / "tasks" / name)):
        names |= names_set_by(task)
        for key in (INCLUDE, IMPORT):
            if isinstance(task.get(key), str) and "{{" not in task[key]:
                names |= set_names(role, task[key], covered)
    return names


def gates() -> Iterator[Gate]:
    for role in sorted((ROOT / "roles").iterdir()):
        for path in sorted((role / "tasks").glob("*.yml")):
            for task in tasks_of(load(path)):
                included = task.get(INCLUDE)
                if isinstance(included, str) and "{{" not in included and task.get("when") is not None:
                    covered: set[str] = set()
                    names = set_names(role, included, covered)
                    yield role.name, path.name, included, names, covered


def set_elsewhere(role: str, covered: set[str]) -> set[str]:
    """The names the role's other task files set too (an earlier `set_fact: {x: []}` keeps x defined), and
    its defaults' and vars' names."""
    base = ROOT / "roles" / role
    names: set[str] = set()
    for path in sorted((base / "tasks").glob("*.yml")):
        if path.name not in covered:
            for task in tasks_of(load(path)):
                names |= names_set_by(task)
    for path in (base / "defaults/main.yml", base / "vars/main.yml"):
        names |= set(load(path) or {})
    return names


def strings(node: Any) -> Iterator[str]:
    """Every string of a YAML document; a `when` or `that` list as one string (a guard may be an earlier
    item)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in ("when", "that", "changed_when", "failed_when") and isinstance(value, list):
                yield " and ".join(str(v) for v in value)
            else:
                yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def read_unguarded(name: str, text: str) -> bool:
    """Whether TEXT reads NAME without a guard in the same expression. The guard may follow an attribute or
    index chain: x.stat is defined, x.slurp | default({}), hostvars[h]['x'].public_key | default('')."""
    word = rf"\b{re.escape(name)}\b"
    chain = r"'?\]?(\.\w+|\[[^\]]*\])*\s*"
    guard = r"(is\s+(not\s+)?defined|\|\s*default\b)"
    return re.search(word, text) is not None and re.search(word + chain + guard, text) is None


def unguarded_reads(role: str, name: str) -> list[str]:
    base = ROOT / "roles" / role
    return [
        f"{path.relative_to(ROOT)}: {text.strip()[:160]}"
        for path in (base / "vars/main.yml", base / "handlers/main.yml")
        for text in strings(load(path))
        if read_unguarded(name, text)
    ]


GATES = list(gates())


def test_the_gates_are_found() -> None:
    # the roles gate dozens of files (issue 19); a parser that found none would guard nothing
    assert len(GATES) >= 25
    assert any(gate[:3] == ("containerd", "main.yml", "configure-containerd.yml") for gate in GATES)


@pytest.mark.parametrize("gate", GATES, ids=[f"{g[0]}:{g[2]}" for g in GATES])
def test_what_a_gated_file_sets_is_read_guarded_by_the_roles_vars(gate: Gate) -> None:
    role, _, _, names, covered = gate
    problems = {
        name: reads
        for name in sorted(names - set_elsewhere(role, covered))
        if (role, name) not in READ_ONLY_WHEN_ENTERED and (reads := unguarded_reads(role, name))
    }
    assert not problems, f"read unguarded where the gated file may not have set it: {problems}"


def test_an_unguarded_read_is_found() -> None:
    # containerd's read as the merge had it, and as it is now
    name = "__containerd_config_reread"
    assert read_unguarded(name, f"{{{{ {name}.differ if {name} is not skipped else [] }}}}")
    assert not read_unguarded(name, f"{{{{ {name}.differ if {name} is defined and {name} is not skipped }}}}")
    assert not read_unguarded(name, f"{{{{ {name}.slurp | default({{}}) }}}}")
    assert not read_unguarded(name, "{{ other }}")
