"""Action plugin value_checks: a role's checks of its values, in order, in one task (library/value_checks.py
has its documentation).

Each check is what an ``ansible.builtin.assert`` task was: conditions (``that``), the message naming the
variable at fault (``fail_msg``) and an optional ``when``. Evaluated in order on the controller, the first
failing check fails the task with its message, and the later ones are not evaluated: a check may rely on the
checks before it (a type checked before a value is compared). A role's checks as one task instead of one
assert task each save a task's fork per host: about 0.07 s a check on the lab's no-op run
(docs/benchmarks.md).

With ``argument_types: true`` it first checks the types of the task's role's variables against the role's
own ``meta/argument_specs.yml`` (entry point ``main``). Ansible's check of the argument specs, before a role's
first task, accepts ``"180"`` for an ``int`` and ``"false"`` for a ``bool`` (they can be converted) and leaves
the variable a string; ``-e name=value`` always passes strings. One failure names every variable of the wrong
type, what it must be and how to pass it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from numbers import Number
from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleActionFail
from ansible.module_utils.datatag import native_type_name
from ansible.plugins.action import ActionBase

_KEYS = frozenset({"that", "fail_msg", "when"})


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


# The argument spec types checked, each with what a value must be (the Jinja tests the checks used:
# ``boolean``; ``integer``, a bool is not one; ``number``, a bool included; a ``sequence`` that is neither a
# string nor a mapping; ``mapping``). Other types (str, path, raw, ...) are not: the specs accept a YAML 535
# for a str.
TYPES: dict[str, tuple[str, Any]] = {
    "bool": ("true or false", lambda value: isinstance(value, bool)),
    "int": ("a whole number", _is_integer),
    "float": ("a number", lambda value: isinstance(value, Number)),
    "list": ("a list", lambda value: _is_sequence(value) and not isinstance(value, (str, Mapping))),
    "dict": ("a mapping", lambda value: isinstance(value, Mapping)),
}


def argument_type_mismatches(options: Mapping[str, Any], values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``[{"name", "type", "value"}]`` for each option of a checked type whose value is not of that type, in
    the order of OPTIONS (name -> argument spec); VALUES maps each such name to its value."""
    mismatches = []
    for name, spec in options.items():
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        if kind not in TYPES:
            continue
        if name not in values:
            raise AnsibleActionFail(f"argument_types: no value given for {name}")
        if not TYPES[kind][1](values[name]):
            mismatches.append({"name": name, "type": kind, "value": values[name]})
    return mismatches


def argument_types_message(mismatches: list[dict[str, Any]]) -> str:
    """One sentence for each variable of the wrong type: what it must be, what it is, how to pass it."""
    sentences = []
    for wrong in mismatches:
        name, kind, value = wrong["name"], wrong["type"], wrong["value"]
        example = {"list": "[]", "dict": "{}"}.get(kind, str(value).lower() if kind == "bool" else str(value))
        got = f"{json.dumps(value, default=str)} (a {native_type_name(value)})"
        sentences.append(
            f"{name} must be {TYPES[kind][0]}; got {got}."
            f" `-e {name}=...` passes a string: pass JSON, -e '{{\"{name}\": {example}}}', or use an"
            " extra-vars file."
        )
    return " ".join(sentences)


def typed_options(role_path: str) -> dict[str, Any]:
    """The options of ROLE_PATH's entry point main whose type is checked, name -> spec."""
    specs_file = Path(role_path) / "meta" / "argument_specs.yml"
    try:
        specs = yaml.safe_load(specs_file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise AnsibleActionFail(f"argument_types: cannot read {specs_file}: {err}") from err
    entry_points = specs.get("argument_specs") if isinstance(specs, Mapping) else None
    main = entry_points.get("main") if isinstance(entry_points, Mapping) else None
    if not isinstance(main, Mapping):
        raise AnsibleActionFail(
            f"argument_types: {specs_file} has no argument_specs.main to check the types by"
        )
    options = main.get("options") or {}
    return {
        name: spec
        for name, spec in options.items()
        if isinstance(spec, Mapping) and spec.get("type") in TYPES
    }


def _conditions(check: Mapping[str, Any], key: str, index: int) -> list[Any]:
    value = check.get(key, [])
    conditions = value if isinstance(value, list) else [value]
    if not all(isinstance(c, (str, bool)) for c in conditions) or (key == "that" and not conditions):
        raise AnsibleActionFail(
            f"checks[{index}].{key} must be a condition or a list of conditions (strings); got {value!r}"
        )
    return conditions


def _check_shape(checks: Any, argument_types: bool) -> list[Mapping[str, Any]]:
    if checks is None and argument_types:
        return []
    if not isinstance(checks, list) or not checks:
        raise AnsibleActionFail(f"checks must be a non-empty list of checks; got {checks!r}")
    for index, check in enumerate(checks):
        if not isinstance(check, Mapping):
            raise AnsibleActionFail(
                f"checks[{index}] must be a mapping with that and fail_msg; got {check!r}"
            )
        unknown = sorted(set(check) - _KEYS)
        if unknown or "that" not in check or not isinstance(check.get("fail_msg"), str):
            raise AnsibleActionFail(
                f"checks[{index}] must have that and fail_msg (a string), and may have when; "
                f"got the keys {sorted(check)}"
            )
    return checks


class ActionModule(ActionBase):
    """Evaluate a list of checks in order; fail with the message of the first that does not hold."""

    _requires_connection = False
    _VALID_ARGS = frozenset({"checks", "argument_types"})

    @classmethod
    def finalize_task_arg(cls, name: str, value: Any, templar: Any, context: Any) -> Any:
        # The checks are not templated as task arguments: their conditions are evaluated one by one below,
        # and a message is templated only when its check fails (it may rely on the checks before it).
        if name == "checks":
            return value
        return super().finalize_task_arg(name, value, templar, context)

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        argument_types = self._task.args.get("argument_types", False)
        if not isinstance(argument_types, bool):
            raise AnsibleActionFail(f"argument_types must be true or false; got {argument_types!r}")
        checks = _check_shape(self._task.args.get("checks"), argument_types)
        if argument_types:
            mismatches = self._argument_type_mismatches(task_vars or {})
            if mismatches:
                result.update(failed=True, msg=argument_types_message(mismatches), mismatches=len(mismatches))
                return result
        evaluated = 0
        for index, check in enumerate(checks):
            if not all(
                self._templar.evaluate_conditional(conditional=c) for c in _conditions(check, "when", index)
            ):
                continue
            evaluated += 1
            for that in _conditions(check, "that", index):
                if not self._templar.evaluate_conditional(conditional=that):
                    result.update(
                        failed=True,
                        msg=self._templar.template(check["fail_msg"]),
                        assertion=that,
                        evaluated_to=False,
                        check=index,
                    )
                    return result
        counted = f"{evaluated} of {len(checks)} checks evaluated"
        said = (
            (f"the argument types and {counted}" if checks else "the argument types")
            if argument_types
            else counted
        )
        result.update(changed=False, msg=f"{said}, all hold")
        return result

    def _argument_type_mismatches(self, task_vars: Mapping[str, Any]) -> list[dict[str, Any]]:
        role = self._task._role
        if role is None:
            raise AnsibleActionFail(
                "argument_types: true needs a task of a role (it reads the role's argument specs)"
            )
        options = typed_options(role._role_path)
        values = {name: self._templar.template(task_vars[name]) for name in options if name in task_vars}
        return argument_type_mismatches(options, values)
