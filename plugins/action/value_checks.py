"""Action plugin value_checks: a role's checks of its values, in order, in one task (library/value_checks.py
has its documentation).

Each check is what an ``ansible.builtin.assert`` task was: conditions (``that``), the message naming the
variable at fault (``fail_msg``) and an optional ``when``. Evaluated in order on the controller, the first
failing check fails the task with its message, and the later ones are not evaluated: a check may rely on the
checks before it (a type checked before a value is compared). A role's checks as one task instead of one
assert task each save a task's fork per host: about 0.07 s a check on the lab's no-op run
(docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

_KEYS = frozenset({"that", "fail_msg", "when"})


def _conditions(check: Mapping[str, Any], key: str, index: int) -> list[Any]:
    value = check.get(key, [])
    conditions = value if isinstance(value, list) else [value]
    if not all(isinstance(c, (str, bool)) for c in conditions) or (key == "that" and not conditions):
        raise AnsibleActionFail(
            f"checks[{index}].{key} must be a condition or a list of conditions (strings); got {value!r}"
        )
    return conditions


def _check_shape(checks: Any) -> list[Mapping[str, Any]]:
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
    _VALID_ARGS = frozenset({"checks"})

    @classmethod
    def finalize_task_arg(cls, name: str, value: Any, templar: Any, context: Any) -> Any:
        # The checks are not templated as task arguments: their conditions are evaluated one by one below,
        # and a message is templated only when its check fails (it may rely on the checks before it).
        if name == "checks":
            return value
        return super().finalize_task_arg(name, value, templar, context)

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        checks = _check_shape(self._task.args.get("checks"))
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
        result.update(changed=False, msg=f"{evaluated} of {len(checks)} checks evaluated, all hold")
        return result
