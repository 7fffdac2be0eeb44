"""How playbooks/validate.yml reads the site values (playbooks/vars/site-values.yml), on the controller.

A value is missing on a host when it is unset or empty there (a required one), or when it still holds the
sample inventory's placeholder. Values are read, never shown: secrets come from a vault."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

EMPTY: tuple[Any, ...] = (None, "", [], {})


def _lacks(value: Any, required: bool, placeholder: re.Pattern[str]) -> bool:
    if value is None or (isinstance(value, (str, list, dict)) and value in EMPTY):
        return required
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        return required
    return bool(placeholder.search(json.dumps(value, default=str)))


def site_values_missing(
    site_values: list[Mapping[str, Any]],
    groups: Mapping[str, list[str]],
    hostvars: Mapping[str, Mapping[str, Any]],
    placeholders: str,
) -> list[str]:
    """One line per site value that some host of its group lacks: 'NAME (WHERE): WHAT'."""
    placeholder = re.compile(placeholders)
    lines = []
    for entry in site_values:
        name, group = entry["name"], entry["hosts"]
        hosts = list(groups.get(group) or [])
        lacking, unreadable = [], ""
        for host in hosts:
            # a template of a variable nobody set ("{{ vault_... }}" without the vault) comes as a marker that
            # raises when read: that value is missing too, and must not keep the others from being listed
            try:
                lacks = _lacks(hostvars[host].get(name), bool(entry.get("required", True)), placeholder)
            except Exception as exc:
                lacks, unreadable = True, f" (it cannot be read: {str(exc).splitlines()[0]})"
            if lacks:
                lacking.append(host)
        if not lacking:
            continue
        where = ", ".join(lacking) if entry.get("per_host") or lacking != hosts else f"group {group}"
        lines.append(f"{name} ({where}): {entry['what']}{unreadable}")
    return lines


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"site_values_missing": site_values_missing}
