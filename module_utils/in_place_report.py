"""What the read-only "in place" modules (library/files_in_place.py, library/packages_in_place.py) share:
the error for an entry they cannot check, the names of entries in their messages (``files[3].path``), and
the run that validates a module's options, reads which of a role's wants are not met and ends the module with
the report (``differ``, ``reasons``, ``in_place``, ``checked``, and what else the module returns; never
changed).

Nothing from Ansible is imported at import time; the modules hand in their AnsibleModule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

if TYPE_CHECKING:
    from ansible.module_utils.basic import AnsibleModule

# One entry of the module's list option, as the module validated it (its Wanted).
W = TypeVar("W")


class EntryError(Exception):
    """An entry of the module's list option that it cannot check; the message names the entry."""


def entry_name(list_name: str, index: int) -> str:
    """The entry ``index`` of the list option ``list_name``, as messages name it: ``files[3]``."""
    return f"{list_name}[{index}]"


def entry_field(list_name: str, index: int, field: str) -> str:
    """A field of an entry, as messages name it: ``files[3].path``."""
    return f"{entry_name(list_name, index)}.{field}"


def reasons_by_key(
    wanted: Iterable[W], key: Callable[[W], str], reasons_of: Callable[[W], list[str]]
) -> dict[str, list[str]]:
    """Each entry whose want is not met, under ``key(entry)``, with its reasons (``reasons_of(entry)``, empty
    when met), in the order of ``wanted`` (dicts keep insertion order)."""
    found: dict[str, list[str]] = {}
    for entry in wanted:
        reasons = reasons_of(entry)
        if reasons:
            found[key(entry)] = reasons
    return found


def exit_with_report(
    module: AnsibleModule, reasons: dict[str, list[str]], checked: int, **found: Any
) -> NoReturn:
    """End the module with the report: ``differ`` (the keys of ``reasons``, in their order), ``reasons``,
    ``in_place`` (nothing differs), ``checked`` (the number of entries checked) and what else the module
    returns (``found``). Never changed."""
    module.exit_json(
        changed=False,
        differ=list(reasons),
        reasons=reasons,
        in_place=not reasons,
        checked=checked,
        **found,
    )


# What a module's read of the target found: the reasons of each want not met by key, the number of wants
# checked, and what else the module returns
Found = tuple[dict[str, list[str]], int, dict[str, Any]]


def run_report(
    module: AnsibleModule,
    validated: Callable[[dict[str, Any]], W],
    read: Callable[[W], Found],
    read_error: type[Exception],
) -> NoReturn:
    """Validate the module's options (``validated``: its wants, from ``module.params``), read the target
    (``read``: what it found of the wants) and exit with the report. An EntryError, or a ``read_error`` (what
    the module reads on the target could not be read), fails the module with its message; the wants are
    validated before anything is read."""
    try:
        wanted = validated(module.params)
    except EntryError as exc:
        module.fail_json(msg=str(exc))
    try:
        reasons, checked, found = read(wanted)
    except read_error as exc:
        module.fail_json(msg=str(exc))
    exit_with_report(module, reasons, checked, **found)
