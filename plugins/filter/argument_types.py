"""Which of a role's variables do not hold the type their argument spec gives them, in one filter call.

Role ``check_argument_types`` reads the including role's ``meta/argument_specs.yml`` and looks up the values;
this filter says which of them are of the wrong type, so that one assert checks every variable of the role
(an assert looped over the variables costs a result per variable and host). The message stays the role's.
Found through ``filter_plugins`` in ansible.cfg.

- ``argument_type_mismatches(options, values)``: ``options`` maps a variable to its argument spec (its
  ``type`` is read), ``values`` a variable to its value. Returns ``[{"name", "type", "value"}]`` for each
  variable of ``options`` whose value is not of its type, in the order of ``options`` (empty list: all
  good). Types ``bool``, ``int``, ``float``, ``list`` and ``dict`` are checked, with the Jinja tests the role
  used before: ``boolean``; ``integer`` (a bool is not one); ``number`` (any number, a bool included);
  ``sequence`` that is neither a string nor a mapping; ``mapping``. Other types (``str``, ``path``,
  ``raw``, ...) and options with no type are not checked, as the argument specs accept a YAML 535 for a str.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Number
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported by the unit tests without Ansible's plugin loader

    class AnsibleFilterError(Exception):  # type: ignore[no-redef]
        pass


def _is_sequence(value: Any) -> bool:
    """Jinja's ``sequence`` test: it has a length and can be indexed."""
    try:
        len(value)
        value.__getitem__  # noqa: B018
    except Exception:
        return False
    return True


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


CHECKS = {
    "bool": lambda value: isinstance(value, bool),
    "int": _is_integer,
    "float": lambda value: isinstance(value, Number),
    "list": lambda value: _is_sequence(value) and not isinstance(value, (str, Mapping)),
    "dict": lambda value: isinstance(value, Mapping),
}


def argument_type_mismatches(options: Mapping[str, Any], values: Mapping[str, Any]) -> list[dict[str, Any]]:
    if not isinstance(options, Mapping) or not isinstance(values, Mapping):
        raise AnsibleFilterError("argument_type_mismatches: options and values must be mappings")
    mismatches = []
    for name, spec in options.items():
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        if kind not in CHECKS:
            continue
        if name not in values:
            raise AnsibleFilterError(f"argument_type_mismatches: no value given for {name}")
        if not CHECKS[kind](values[name]):
            mismatches.append({"name": name, "type": kind, "value": values[name]})
    return mismatches


class FilterModule:
    """argument_type_mismatches."""

    def filters(self) -> dict[str, Any]:
        return {"argument_type_mismatches": argument_type_mismatches}
