#!/usr/bin/python
"""Ansible module gpu_health: a healthy/degraded/unhealthy verdict per GPU and per node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Health verdict for a node's NVIDIA GPUs, the input for cordoning
description:
  - Reads every GPU through NVML (C(pynvml) of C(nvidia-ml-py)) and gives each GPU, and the node, a verdict
    C(healthy), C(degraded) or C(unhealthy) with reason codes. The node's verdict is its worst GPU's or
    node-level reason's. Never changes anything; it is the input for cordoning and draining nodes.
  - "Reasons that make a GPU C(unhealthy): C(ecc_uncorrectable_volatile) (uncorrectable ECC errors since the
    driver loaded: data was lost), C(row_remap_pending) (a GPU reset is needed before the bad row is
    retired), C(row_remap_failure) (no spare rows left: replace the GPU), C(retired_pages_pending) (on GPUs
    that retire pages: reset needed), C(gpu_lost) (NVML_ERROR_GPU_IS_LOST, fell off the bus), C(nvml_error)
    (the GPU or the driver cannot be read, including a driver/library version mismatch). Node level:
    C(gpu_missing) (fewer GPUs than O(expected_gpu_count))."
  - "Reasons that make a GPU C(degraded): C(ecc_corrected_over_threshold) (more corrected errors since the
    driver loaded than O(corrected_errors_threshold)), C(temperature_slowdown) (at or above the slowdown
    temperature), C(ecc_disabled), C(nvlink_inactive) (a link down). Node level: C(gpu_count_unexpected)
    (more GPUs than expected)."
  - Corrected ECC errors alone are not a failure. ECC corrected them and the data arrived intact; on A100
    the GPU also remaps the row, so memory heals itself. Cordoning on any non-zero ECC count (as
    C(nvidia-smi -q | grep) scripts do) takes healthy GPUs out of service. What matters is an uncorrectable
    error since the driver loaded and a pending or failed remap. Old uncorrectable errors in the aggregate
    (lifetime) counter whose rows were remapped are history, not a verdict.
version_added: "0.1.0"
author: "A100 LLM platform team"
options:
  expected_gpu_count:
    description:
      - GPUs the node should have; fewer give the node reason C(gpu_missing) (unhealthy). Not checked when
        omitted.
    type: int
  corrected_errors_threshold:
    description:
      - A GPU with more volatile (since the driver loaded) corrected ECC errors than this is C(degraded)
        (C(ecc_corrected_over_threshold)). Not checked when omitted.
    type: int
  fail_on_unhealthy:
    description:
      - Fail the task when the node's verdict is C(unhealthy). A C(degraded) node never fails the task.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - llm_platform
  - llm_platform.nvml
notes:
  - When NVML cannot start at all (driver not installed, driver/library version mismatch), the module does
    not fail unless O(fail_on_unhealthy) is set; it returns C(unhealthy) with node reason C(nvml_error) and
    the actionable message, since such a node cannot run GPU work.
seealso:
  - module: gpu_facts
"""

EXAMPLES = r"""
- name: Check GPU health
  gpu_health:
    expected_gpu_count: 4
    corrected_errors_threshold: 1000
  register: gpu_health

- name: Nodes to cordon
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }} is {{ gpu_health.verdict }}: {{ gpu_health.msg }}"
  when: not gpu_health.healthy

- name: Stop the play on a broken node
  gpu_health:
    expected_gpu_count: 4
    fail_on_unhealthy: true

# Ad hoc:
#   ansible -i inventories/lab gpu_nodes -m gpu_health -a expected_gpu_count=4
"""

RETURN = r"""
verdict:
  description: The node's verdict, the worst of its GPUs' and node-level reasons.
  returned: always
  type: str
  choices: [healthy, degraded, unhealthy]
  sample: unhealthy
healthy:
  description: Whether the verdict is C(healthy).
  returned: always
  type: bool
  sample: false
reasons:
  description: Node-level reason codes (C(gpu_missing), C(gpu_count_unexpected), C(nvml_error)).
  returned: always
  type: list
  elements: str
  sample: []
messages:
  description: Human-readable node-level findings, in the order of RV(reasons).
  returned: always
  type: list
  elements: str
gpus:
  description: One entry per GPU.
  returned: always
  type: list
  elements: dict
  contains:
    index: {description: NVML index., type: int, sample: 2}
    uuid: {description: GPU UUID (null if unreadable)., type: str}
    pci_bus_id: {description: PCI bus id (null if unreadable)., type: str}
    verdict: {description: "C(healthy), C(degraded) or C(unhealthy).", type: str, sample: unhealthy}
    reasons: {description: Reason codes., type: list, elements: str, sample: [ecc_uncorrectable_volatile]}
    messages: {description: Human-readable findings., type: list, elements: str}
gpu_count:
  description: GPUs NVML enumerates (null when NVML cannot start).
  returned: always
  type: int
  sample: 4
driver_version:
  description: NVIDIA driver version (null when NVML cannot start).
  returned: always
  type: str
  sample: "535.183.06"
msg:
  description: One-line summary.
  returned: always
  type: str
  sample: "unhealthy: GPU 2 ecc_uncorrectable_volatile"
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_health_rules import HEALTHY, UNHEALTHY
from ansible.module_utils.gpu_node_health import assess_node
from ansible.module_utils.nvml_session import require_pynvml


def summarise(verdict: str, node_reasons: list[str], gpus: list[dict[str, Any]]) -> str:
    parts = list(node_reasons)
    parts += [f"GPU {g['index']} {','.join(g['reasons'])}" for g in gpus if g["reasons"]]
    return verdict + (": " + "; ".join(parts) if parts else "")


def assess(module: AnsibleModule, nvml: Any) -> dict[str, Any]:
    params = module.params
    node = assess_node(nvml, params["expected_gpu_count"], params["corrected_errors_threshold"])
    return {
        "changed": False,
        **node,
        "healthy": node["verdict"] == HEALTHY,
        "msg": summarise(node["verdict"], node["reasons"], node["gpus"]),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "expected_gpu_count": {"type": "int"},
            "corrected_errors_threshold": {"type": "int"},
            "fail_on_unhealthy": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    for name in ("expected_gpu_count", "corrected_errors_threshold"):
        if module.params[name] is not None and module.params[name] < 0:
            module.fail_json(msg=f"{name} must be >= 0")
    nvml = require_pynvml(module)
    result = assess(module, nvml)
    if result["verdict"] == UNHEALTHY and module.params["fail_on_unhealthy"]:
        details = result["messages"] + [m for g in result["gpus"] for m in g["messages"]]
        module.fail_json(**{**result, "msg": "GPU node unhealthy: " + "; ".join(details)})
    module.exit_json(**result)


if __name__ == "__main__":
    main()
