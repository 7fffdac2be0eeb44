"""The local accounts and groups from /etc/passwd and /etc/group as a role's read found them (files_in_place's
``slurp``: base64; nothing for a missing file), so that a role's ansible.builtin.user task runs only for an
account not as that task leaves it. The module asks NSS (pwd, grp); on a node whose accounts are local, as the
cluster's are, NSS answers from these files ("files" first in nsswitch.conf).

Each answer is conservative, for a gate that runs the task wherever it is unsure: a name whose line is not
seven (passwd) or four (group) fields, a name given twice, and every name where a NIS compat line (``+``,
``-``) could make NSS answer otherwise, are left out (the account reads as not there, and the task runs).

- ``passwd_accounts(content)``: ``{name: {"uid", "gid", "gecos", "home", "shell"}}`` (uid and gid as text).
- ``group_members(content)``: ``{group: [member, ...]}`` (the supplementary members, the fourth field).

tests/unit/test_local_accounts.py holds them to Python's own parse of such files; the roles' gates on them
(roles common, gpu_health_agent) to the real user module.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any


def _lines(content: Any) -> list[str] | None:
    """The file's lines from CONTENT (slurp's base64, '' for a missing file); None where it is not base64 of
    UTF-8 text or holds a compat line."""
    if not isinstance(content, str):
        return None
    try:
        text = base64.b64decode(content, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    lines = [line for line in text.split("\n") if line.strip() and not line.startswith("#")]
    if any(line.startswith(("+", "-")) for line in lines):
        return None
    return lines


def _entries(content: Any, fields: int) -> dict[str, list[str]]:
    """Each name given once on a line of FIELDS colon-separated fields, with its fields."""
    entries: dict[str, list[str]] = {}
    twice: set[str] = set()
    for line in _lines(content) or []:
        parts = line.split(":")
        name = parts[0]
        if name in entries or len(parts) != fields or not name:
            twice.add(name)
            continue
        entries[name] = parts
    return {name: parts for name, parts in entries.items() if name not in twice}


def passwd_accounts(content: Any) -> dict[str, dict[str, str]]:
    """The accounts of /etc/passwd whose content (slurp's base64) is CONTENT."""
    return {
        name: {"uid": uid, "gid": gid, "gecos": gecos, "home": home, "shell": shell}
        for name, (_, _, uid, gid, gecos, home, shell) in _entries(content, 7).items()
    }


def group_members(content: Any) -> dict[str, list[str]]:
    """The groups of /etc/group whose content (slurp's base64) is CONTENT, each with its members."""
    return {
        name: [member for member in members.split(",") if member]
        for name, (_, _, _, members) in _entries(content, 4).items()
    }


class FilterModule:
    """passwd_accounts, group_members."""

    def filters(self) -> dict[str, Any]:
        return {"passwd_accounts": passwd_accounts, "group_members": group_members}
