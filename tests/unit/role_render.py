"""A role's own variables and templates, rendered by Ansible's templar as the role would render them.

    from role_render import RoleVars, items_run

    role = RoleVars("nvidia_driver", nvidia_driver_source="ubuntu")
    role["__nvidia_driver_package_specs"]          # a variable of defaults/ or vars/, templated
    role.render_template("nvidia-driver.pref.j2")  # templates/<name>, as ansible.builtin.template writes it
    items_run("kubernetes_node", task, items, __kubernetes_node_held={"stdout_lines": []})  # `when` true

defaults/main.yml, then vars/main.yml, then the overrides (facts, inventory values, what an earlier task set),
like Ansible's precedence for a role's own files. Nothing is copied from the role: a changed default, variable
or template is what the tests see.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import filter_loader, init_plugin_loader
from ansible.template import Templar, trust_as_template
from ansible.utils.collection_loader import AnsibleCollectionConfig

ROOT = Path(__file__).resolve().parents[2]


def _trusted(value: Any) -> Any:
    """Strings from the role's own files are templates (Ansible trusts them; yaml.safe_load does not)."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(item) for item in value]
    if isinstance(value, dict):
        return {key: _trusted(item) for key, item in value.items()}
    return value


def _load_plugins() -> None:
    """Filters and lookups by their FQCN (ansible.builtin.file, community.general.dict_kv), once; and the
    filters the roles share (plugins/filter), as ansible.cfg's filter_plugins gives them to a play wherever
    the tests run from."""
    if AnsibleCollectionConfig.collection_finder is None:
        init_plugin_loader()
    filter_loader.add_directory(str(ROOT / "plugins/filter"))  # once: a directory added again is not


class RoleVars:
    def __init__(self, role: str, **overrides: Any) -> None:
        self.role_dir = ROOT / "roles" / role
        variables: dict[str, Any] = {}
        for path in ("defaults/main.yml", "vars/main.yml"):
            variables |= yaml.safe_load((self.role_dir / path).read_text()) or {}
        variables |= overrides
        variables.setdefault("ansible_managed", "Ansible managed")
        self.templar = Templar(loader=DataLoader(), variables=_trusted(variables))

    def __getitem__(self, name: str) -> Any:
        _load_plugins()
        return self.templar.template(trust_as_template("{{ " + name + " }}"))

    def template(self, value: Any) -> Any:
        """A value from one of the role's task files (a module argument, a loop), templated."""
        _load_plugins()
        return self.templar.template(_trusted(value))

    def render_template(self, name: str) -> str:
        """templates/<name> with the template module's defaults (trim_blocks on)."""
        text = (self.role_dir / "templates" / name).read_text()
        return str(self.templar.template(trust_as_template(text), overrides={"trim_blocks": True}))

    def when(self, condition: str | bool | list[str | bool]) -> bool:
        """A task's `when`, evaluated as Ansible evaluates it: a list, all must hold; a Jinja '\\n' is a
        newline there, where a variable's template keeps it as backslash-n."""
        _load_plugins()
        conditions = condition if isinstance(condition, list) else [condition]
        return all(
            c if isinstance(c, bool) else self.templar.evaluate_conditional(trust_as_template(c))
            for c in conditions
        )


def items_run(role: str, task: dict[str, Any], items: list[Any], **variables: Any) -> list[Any]:
    """The loop items a task of the role calls its module for (its `when` true), with the task's own vars and
    these variables (what earlier tasks registered, facts; they replace a task var of the same name): which
    items a node in that state sends."""
    return [
        item
        for item in items
        if RoleVars(role, **(task.get("vars", {}) | variables), item=item).when(task.get("when", True))
    ]
