#!/usr/bin/python
"""Ansible module gpu_cordon_plan: the circuit breaker's decision for the remediation playbooks."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_cordon_plan
short_description: Decide which GPU nodes to cordon or uncordon, within the circuit breaker
description:
  - The decision of C(playbooks/remediate/ecc-cordon.yml) and C(uncordon.yml), computed by the same code
    as the GPU health agent's (C(module_utils/gpu_breaker.py)), so a playbook and the agents never disagree
    on how many nodes may be out of service.
  - "O(action=cordon): from the GPU Node objects and every host's C(gpu_health) result, which unhealthy nodes
    may be cordoned now (at most O(max_cordoned_percent) of the GPU nodes, rounded down, never the last
    schedulable one), which the breaker holds back (named, with why), which are already cordoned for the same
    reasons (nothing to do) or for others; and the merge patch (cordon + annotations) for each to cordon."
  - "O(action=uncordon): for O(node), the merge patch that uncordons it and removes the cordon annotation,
    appending to the annotation history; refused (no patch) while O(health) is unhealthy unless O(force)."
  - "O(action=maintenance): a remediation playbook's own work on O(node) (O(what): a GPU reset, a reboot):
    the merge patch that cordons it with the record (the O(gpus) it works on, their reasons, the action
    gpu_health names) and a history entry; for a node cordoned already only the history entry; refused (no
    patch) for the last schedulable GPU node. A human runs these playbooks, so the breaker's share does not
    apply; the last schedulable node rule does."
  - Computes only; it changes nothing (the playbook applies the patches with kubernetes.core.k8s), so it
    reports C(changed=false) and runs the same in check mode.
version_added: "0.1.0"
author: "A100 LLM platform team"
options:
  action:
    description:
      - What to decide. C(cordon), C(uncordon), C(maintenance) - see O(health) and O(node).
      - C(rolling) - planned work that takes the GPU nodes out one at a time (playbooks/upgrade-driver.yml,
        upgrade-kubernetes.yml and upgrade-containerd.yml, through playbooks/tasks/breaker-plan.yml and
        cordon-within-breaker.yml), which of O(todo) may be cordoned within the breaker's limit, and the patch
        that cordons each.
    type: str
    choices: [cordon, uncordon, maintenance, rolling]
    required: true
  nodes:
    description: The GPU Node objects (as kubernetes.core.k8s_info returns them).
    type: list
    elements: dict
    required: true
  todo:
    description: The nodes the work is for, in order (O(action=rolling)).
    type: list
    elements: str
    default: []
  own_annotation:
    description:
      - The annotation the calling playbook marks its own cordon with (O(action=rolling)). A node that carries
        it counts as not cordoned, since the playbook lifts that cordon before it takes the next node; in
        O(todo), such a node (left cordoned by a run that stopped) is out of service already and may be
        finished whatever the others. The patches set it.
    type: str
  health:
    description:
      - C(gpu_health) results by node name. For O(action=uncordon) and O(action=maintenance), the result for
        O(node) (a dict with C(verdict) and C(msg); C(gpus) and C(action) for maintenance).
      - Required unless O(action=rolling).
    type: dict
  node:
    description: The node to uncordon (O(action=uncordon)) or to work on (O(action=maintenance)).
    type: str
  gpus:
    description: NVML indexes of the GPUs the work is on (O(action=maintenance)).
    type: list
    elements: int
    default: []
  what:
    description: The work, written into the history (O(action=maintenance) and O(action=rolling)).
    type: str
    choices: [reset, reboot, driver-upgrade, kubernetes-upgrade, containerd-upgrade]
    default: reset
  force:
    description: Uncordon even though the node is unhealthy now; recorded in the history annotation.
    type: bool
    default: false
  by:
    description: Who decides, written into the annotations (the playbook's name).
    type: str
    required: true
  max_cordoned_percent:
    description: At most this percent of the GPU nodes (rounded down) may be cordoned at once.
    type: int
    default: 34
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - llm_platform
seealso:
  - module: gpu_health
"""

EXAMPLES = r"""
- name: Decide which unhealthy GPU nodes to cordon
  gpu_cordon_plan:
    action: cordon
    nodes: "{{ gpu_nodes.resources }}"
    health: "{{ dict(groups['gpu_nodes'] | zip(groups['gpu_nodes'] | map('extract', hostvars, 'health'))) }}"
    by: ecc-cordon.yml
  register: plan

- name: Decide whether gpu-node-2 may be uncordoned
  gpu_cordon_plan:
    action: uncordon
    node: gpu-node-2
    nodes: "{{ gpu_nodes.resources }}"
    health: "{{ hostvars['gpu-node-2'].health }}"
    force: false
    by: uncordon.yml
  register: plan
"""

RETURN = r"""
annotation:
  description: The annotation key holding the cordon record (JSON with by, time, reasons, gpus, message).
  returned: always
  type: str
  sample: gpu-health.llm-platform.io/cordon
history_annotation:
  description: The annotation key holding the history (JSON list of cordon/uncordon entries).
  returned: always
  type: str
time:
  description: The time written into the records (UTC, RFC 3339).
  returned: always
  type: str
limit:
  description: How many GPU nodes may be cordoned at once.
  returned: action is cordon or rolling
  type: int
  sample: 1
allowed:
  description: The O(todo) nodes the breaker lets the work take out (O(action=rolling)).
  returned: action is rolling
  type: list
  elements: str
cordon:
  description: Nodes to cordon now.
  returned: action is cordon
  type: list
  elements: str
held_back:
  description: Unhealthy nodes (O(action=rolling) the O(todo) nodes) the breaker leaves alone, with why.
  returned: action is cordon or rolling
  type: dict
already_same_reason:
  description: Unhealthy nodes already cordoned for the same reasons (nothing to do).
  returned: action is cordon
  type: list
  elements: str
already_other_reason:
  description: Unhealthy nodes already cordoned for another reason or by hand, with their annotation.
  returned: action is cordon
  type: dict
unhealthy:
  description: Nodes whose gpu_health verdict is unhealthy.
  returned: action is cordon
  type: list
  elements: str
cordoned_before:
  description: GPU nodes cordoned before this decision (O(action=rolling) by someone else).
  returned: action is cordon or rolling
  type: list
  elements: str
patches:
  description:
    - Merge patches by node name (O(action=cordon)), or the one patch for O(node) (O(action=uncordon) and
      O(action=maintenance); null when refused or nothing to do).
  returned: always
  type: raw
records:
  description: The cordon record per node to cordon (reasons, GPUs, time, message).
  returned: action is cordon
  type: dict
refused:
  description: >-
    Whether the uncordon was refused because the node is unhealthy now, or the maintenance because the node
    is the last schedulable GPU node.
  returned: action is uncordon or maintenance
  type: bool
msg:
  description: One-line summary of the decision.
  returned: always
  type: str
"""

import datetime as dt
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_breaker import (
    CORDON_ANNOTATION,
    HISTORY_ANNOTATION,
    cordon_patches,
    history_with,
    maintenance_patch,
    rolling_plan,
    uncordon_patch,
)


def rolling(p: dict[str, Any], time: str) -> dict[str, Any]:
    """action=rolling: the breaker's decision for O(todo), and a cordon patch for each allowed node that is
    not cordoned yet (the playbook's own annotation, and the work in the history)."""
    own = p["own_annotation"]
    by_name = {n["metadata"]["name"]: n for n in p["nodes"]}

    def annotations(name: str) -> dict[str, Any]:
        return (by_name[name].get("metadata") or {}).get("annotations") or {}

    def cordoned(name: str) -> bool:
        return bool((by_name[name].get("spec") or {}).get("unschedulable"))

    by_others = {name: cordoned(name) and own not in annotations(name) for name in by_name}
    # cordoned by the calling playbook's own run that stopped: out of service already, finishing it adds none
    own_out = [name for name in by_name if cordoned(name) and own in annotations(name)]
    decision = rolling_plan(by_others, p["todo"], p["max_cordoned_percent"], own_out)
    patches = {}
    for name in decision["allowed"]:
        if cordoned(name):
            continue
        record = {"by": p["by"], "time": time, "message": f"node: {p['what']} ({p['by']})"}
        patches[name] = {
            "metadata": {
                "annotations": {
                    own: f"cordoned by {p['by']} for the {p['what']} at {time}",
                    HISTORY_ANNOTATION: history_with(
                        annotations(name).get(HISTORY_ANNOTATION), p["what"], record
                    ),
                }
            },
            "spec": {"unschedulable": True},
        }
    parts = [f"limit {decision['limit']}", f"allowed: {', '.join(decision['allowed']) or 'none'}"]
    parts += [f"held back: {name}: {why}" for name, why in decision["held_back"].items()]
    return {**decision, "patches": patches, "msg": "; ".join(parts)}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "action": {
                "type": "str",
                "choices": ["cordon", "uncordon", "maintenance", "rolling"],
                "required": True,
            },
            "nodes": {"type": "list", "elements": "dict", "required": True},
            "health": {"type": "dict"},
            "todo": {"type": "list", "elements": "str", "default": []},
            "own_annotation": {"type": "str"},
            "node": {"type": "str"},
            "force": {"type": "bool", "default": False},
            "by": {"type": "str", "required": True},
            "max_cordoned_percent": {"type": "int", "default": 34},
            "gpus": {"type": "list", "elements": "int", "default": []},
            "what": {
                "type": "str",
                "choices": ["reset", "reboot", "driver-upgrade", "kubernetes-upgrade", "containerd-upgrade"],
                "default": "reset",
            },
        },
        required_if=[
            ("action", "cordon", ["health"]),
            ("action", "uncordon", ["node", "health"]),
            ("action", "maintenance", ["node", "health"]),
            ("action", "rolling", ["own_annotation"]),
        ],
        supports_check_mode=True,
    )
    p = module.params
    if not 0 <= p["max_cordoned_percent"] <= 100:
        module.fail_json(msg=f"max_cordoned_percent must be 0..100, got {p['max_cordoned_percent']}")
    for node in p["nodes"]:
        if not isinstance(node.get("metadata"), dict) or not node["metadata"].get("name"):
            module.fail_json(msg="nodes: every element must be a Node object with metadata.name")
    time = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    common: dict[str, Any] = {
        "changed": False,
        "annotation": CORDON_ANNOTATION,
        "history_annotation": HISTORY_ANNOTATION,
        "time": time,
    }
    if p["action"] == "rolling":
        module.exit_json(**common, **rolling(p, time))
    if p["action"] == "cordon":
        result = cordon_patches(p["nodes"], p["health"], p["by"], time, p["max_cordoned_percent"])
        parts = [f"unhealthy: {', '.join(result['unhealthy']) or 'none'}"]
        if result["cordon"]:
            parts.append(f"cordon: {', '.join(result['cordon'])}")
        if result["already_same_reason"]:
            parts.append(f"already cordoned for the same reason: {', '.join(result['already_same_reason'])}")
        if result["held_back"]:
            parts.append(f"held back: {', '.join(result['held_back'])}")
        module.exit_json(**common, **result, msg="; ".join(parts))
    by_name = {n["metadata"]["name"]: n for n in p["nodes"]}
    if p["node"] not in by_name:
        module.fail_json(msg=f"node: {p['node']} is not among the GPU nodes ({', '.join(sorted(by_name))})")
    if p["action"] == "maintenance":
        args = (p["nodes"], p["node"], p["health"], p["gpus"], p["what"], p["by"], time)
        patch, why = maintenance_patch(*args)
        module.exit_json(**common, patches=patch, refused=patch is None, msg=why)
    patch, why = uncordon_patch(by_name[p["node"]], p["health"], p["by"], time, p["force"])
    module.exit_json(**common, patches=patch, refused=why.startswith("refused"), msg=why)


if __name__ == "__main__":
    main()
