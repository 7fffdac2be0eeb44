#!/usr/bin/python
"""Ansible module value_checks: its documentation (plugins/action/value_checks.py runs it)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: value_checks
short_description: Check a role's values in order, in one task, and fail naming the first that is wrong
description:
  - Each entry of O(checks) is what an M(ansible.builtin.assert) task would be, conditions and a message. They
    are evaluated in order on the controller. The first check whose conditions do not all hold fails the task
    with its message, templated then; the checks after it are not evaluated, so a check may rely on the ones
    before it (a type checked before a value is compared).
  - One task for a role's checks instead of an assert task for each saves a task's fork per host, about
    0.07 s a check on the lab's no-op run (docs/benchmarks.md).
  - Runs on the controller only, the same in check mode; never changes anything.
  - "O(checks) must be written out in the task: it is not templated as a whole (its conditions are evaluated
    one by one, a message only when its check fails)."
version_added: "0.1.0"
author: "A100 LLM platform team"
options:
  argument_types:
    description:
      - First check the types of the task's role's variables against the role's own
        C(meta/argument_specs.yml), entry point C(main), before any of O(checks).
      - Checked are the options of type C(bool), C(int) (a bool is not one), C(float) (any number), C(list)
        (a sequence that is neither a string nor a mapping) and C(dict). Ansible's own check of the argument
        specs accepts V("180") for an int and V("false") for a bool and leaves the variable a string;
        C(-e name=value) always passes strings.
      - One failure names every variable of the wrong type, what it must be, and how to pass it as JSON.
      - The task must belong to a role.
    type: bool
    default: false
  checks:
    description:
      - The checks, in the order they are evaluated.
      - Required unless O(argument_types=true).
    type: list
    elements: dict
    suboptions:
      that:
        description: A condition, or a list of conditions that must all hold, as M(ansible.builtin.assert)
          takes them.
        type: raw
        required: true
      fail_msg:
        description:
          - The message when a condition of O(checks[].that) does not hold. Name the variable, what it must
            be, and what it is.
          - Templated only when the check fails.
        type: str
        required: true
      when:
        description: Conditions that must all hold for the check to be evaluated at all.
        type: raw
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  action:
    description: An action plugin (plugins/action/value_checks.py) runs it on the controller; nothing runs
      on the host.
    support: full
extends_documentation_fragment:
  - llm_platform
seealso:
  - module: ansible.builtin.assert
"""

EXAMPLES = r"""
- name: Check the calico values
  value_checks:
    argument_types: true
    checks:
      - that: calico_manifest_sha256 is match('^[0-9a-f]{64}$')
        fail_msg: >-
          calico_manifest_sha256 must be 64 lower-case hex digits; got {{ calico_manifest_sha256 | to_json }}.
      - that:
          - calico_ipv4pool_cidr is string
          - calico_ipv4pool_cidr in ['', kubeadm_control_plane_pod_subnet]
        fail_msg: >-
          calico_ipv4pool_cidr must be empty or the pod network; got {{ calico_ipv4pool_cidr | to_json }}.
        when: kubeadm_control_plane_pod_subnet is defined
"""

RETURN = r"""
msg:
  description: How many checks were evaluated, or the message of the one that failed.
  returned: always
  type: str
  sample: the argument types and 4 of 5 checks evaluated, all hold
mismatches:
  description: How many variables are not of their type (O(argument_types=true)).
  returned: failed on the argument types
  type: int
  sample: 2
assertion:
  description: The condition that did not hold.
  returned: failed on a check
  type: str
  sample: calico_manifest_sha256 is match('^[0-9a-f]{64}$')
check:
  description: The index in O(checks) of the check that failed.
  returned: failed on a check
  type: int
  sample: 0
evaluated_to:
  description: What the condition evaluated to (false).
  returned: failed on a check
  type: bool
  sample: false
"""
