#!/usr/bin/python
"""Ansible module gpu_health: a healthy/degraded/unhealthy verdict per GPU and per node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Health verdict and action for a node's NVIDIA GPUs, from NVML and the kernel log's Xids
description:
  - Reads every GPU through NVML (C(pynvml) of C(nvidia-ml-py)) and the Xids the driver wrote to the kernel
    log, and gives each GPU, and the node, a verdict C(healthy), C(degraded) or C(unhealthy), an action, and
    reason codes. The node's verdict and action are its worst GPU's or node-level reason's. Never changes
    anything; it is the input for cordoning, resetting and rebooting (the GPU health agent and
    playbooks/remediate/).
  - "Actions, least first (module_utils/gpu_xid.py, from NVIDIA's Xid catalog and A100 memory error rules):
    C(none); C(restart_app) (the application that hit the error restarts, the node stays in service);
    C(reset_at_drain_window) (work goes on, reset the GPU at the next drain window); C(drain_p2p),
    C(reset_gpu), C(drain_and_reset) (cordon, drain the pods using the GPU, and its NVLink peers' for the
    drain actions, reset it: playbooks/remediate/gpu-reset.yml); C(reboot_node)
    (playbooks/remediate/node-reboot.yml); C(repair) (the node stays cordoned: the GPU is replaced). An action
    from C(drain_p2p) on makes the GPU C(unhealthy), C(restart_app) and C(reset_at_drain_window) C(degraded)."
  - "GPU reasons: C(ecc_uncorrectable_volatile) (uncorrectable ECC errors since the driver loaded: contained
    by Xid 94, restart_app; uncontained by Xid 95, or neither Xid nor NVML recovery action readable,
    reset_gpu), C(row_remap_pending) (reset_at_drain_window), C(row_remap_failure) (repair),
    C(row_remap_spares_exhausted) (a bank without spare rows: degraded), C(retired_pages_pending)
    (reset_at_drain_window), C(nvml_recovery_action) (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, drivers R565 and
    later), C(gpu_lost) (reboot_node), C(nvml_error), C(xid_<n>) (a burst of Xids of the GPU, judged by the
    Xid table: the Xid that decided it). Degraded only: C(ecc_corrected_over_threshold),
    C(temperature_slowdown), C(ecc_disabled), C(nvlink_inactive). Node level: C(gpu_missing) (reboot_node),
    C(gpu_count_unexpected), C(kernel_log_unreadable), C(nvml_error), and C(xid_<n>) for a GPU NVML no longer
    names."
  - Corrected ECC errors alone are not a failure. ECC corrected them and the data arrived intact; on A100
    the GPU also remaps the row, so memory heals itself. Cordoning on any non-zero ECC count (as
    C(nvidia-smi -q | grep) scripts do) takes healthy GPUs out of service. Old uncorrectable errors in the
    aggregate (lifetime) counter whose rows were remapped are history, not a verdict. Application Xids (13,
    31, 43, 45 among others) never make a GPU unhealthy.
  - A GPU reset (module gpu_reset) clears the GPU's Xids so far; a reboot empties the kernel log.
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
  kernel_log:
    description:
      - Where the Xids are read, C(/dev/kmsg) (needs root or CAP_SYSLOG) or a file of C(/dev/kmsg) records
        (the lab's, which shares one kernel among its nodes). Empty does not read Xids.
    type: str
    default: /dev/kmsg
  fail_on_unhealthy:
    description:
      - Fail the task when the node's verdict is C(unhealthy). A C(degraded) node never fails the task.
    type: bool
    default: false
  facts:
    description:
      - Also return the node's facts as M(gpu_facts) returns them (C(ansible_facts.nvidia)), from the same
        NVML session the verdict is judged on, instead of a second module call that starts NVML again (the
        status report, playbooks/report.yml).
      - None where NVML did not answer; the verdict's C(nvml_error) message says why.
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
  - A kernel log that cannot be read is a C(degraded) node reason, not a failure; an uncorrectable error is
    then judged as uncontained.
seealso:
  - module: gpu_facts
  - module: gpu_reset
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

- name: What to run for it
  ansible.builtin.debug:
    msg: "{{ gpu_health.action }}: {{ gpu_health.playbook }}"
  when: gpu_health.action != 'none'

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
action:
  description: The node's action, its worst GPU's or node-level reason's.
  returned: always
  type: str
  choices:
    [none, restart_app, reset_at_drain_window, drain_p2p, reset_gpu, drain_and_reset, reboot_node, repair]
  sample: reset_gpu
playbook:
  description: The remediation playbook that carries the action out (empty for none and restart_app).
  returned: always
  type: str
  sample: playbooks/remediate/gpu-reset.yml
xids:
  description: Xids (not cleared by a reset) of GPUs NVML does not name, as in RV(gpus[].xids).
  returned: always
  type: list
  elements: dict
reasons:
  description: >-
    Node-level reason codes (C(gpu_missing), C(gpu_count_unexpected), C(nvml_error), C(kernel_log_unreadable),
    C(xid_<n>)).
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
    action: {description: The GPU's action (see RV(action))., type: str, sample: reset_gpu}
    reasons: {description: Reason codes., type: list, elements: str, sample: [ecc_uncorrectable_volatile]}
    messages: {description: Human-readable findings., type: list, elements: str}
    xids:
      description: The GPU's Xids in the kernel log that no reset has cleared, oldest first.
      type: list
      elements: dict
      contains:
        xid: {description: The Xid., type: int, sample: 95}
        mnemonic: {description: "The catalog's mnemonic (UNKNOWN when not in the table).", type: str}
        action: {description: The table's action for this Xid alone., type: str, sample: reset_gpu}
        seq: {description: The kernel log's record number (null from sources without one)., type: int}
        text: {description: "The driver's message, from C(NVRM: Xid) on.", type: str}
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
ansible_facts:
  description: With O(facts=true), C(nvidia), the node's facts exactly as M(gpu_facts) returns them
    (module_utils/gpu_node_facts.py), read in the NVML session the verdict is judged on.
  returned: when O(facts=true) and NVML answered
  type: dict
"""

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_health_rules import HEALTHY, UNHEALTHY
from ansible.module_utils.gpu_host import device_processes, nvswitch_pci_devices
from ansible.module_utils.gpu_inventory import read_node, topology_matrix
from ansible.module_utils.gpu_kernel_log import DEFAULT_KERNEL_LOG
from ansible.module_utils.gpu_node_facts import node_facts
from ansible.module_utils.gpu_node_health import assess_node, read_xids
from ansible.module_utils.nvml_session import NvmlUnavailable, nvml_session, require_pynvml


def summarise(verdict: str, node_reasons: list[str], gpus: list[dict[str, Any]]) -> str:
    parts = list(node_reasons)
    parts += [f"GPU {g['index']} {','.join(g['reasons'])}" for g in gpus if g["reasons"]]
    return verdict + (": " + "; ".join(parts) if parts else "")


def read_facts(nvml: Any) -> tuple[Any, dict[str, Any] | None]:
    """The node as read_node reads it and its facts as gpu_facts returns them, in one NVML session; (None,
    None) where NVML does not answer (assess_node then reads again and tells why)."""
    # From /proc and /sys, before NVML opens any device, as gpu_facts reads them.
    holders = device_processes(exclude_pids={os.getpid()})
    switches = nvswitch_pci_devices()
    try:
        with nvml_session(nvml):
            reading = read_node(nvml)
            topology = topology_matrix(nvml, reading.gpus)
    except (NvmlUnavailable, nvml.NVMLError):  # assess_node reads again and reports why
        return None, None
    return reading, node_facts(reading, topology, holders, switches)


def assess(module: AnsibleModule, nvml: Any) -> dict[str, Any]:
    params = module.params
    events, log_error = read_xids(params["kernel_log"])
    reading, facts = read_facts(nvml) if params["facts"] else (None, None)
    node = assess_node(
        nvml,
        params["expected_gpu_count"],
        params["corrected_errors_threshold"],
        events,
        kernel_log_error=log_error,
        node=reading,
    )
    node.pop("settled")  # every burst is judged as final here (the agent waits for late containment Xids)
    return {
        "changed": False,
        **node,
        "healthy": node["verdict"] == HEALTHY,
        "msg": summarise(node["verdict"], node["reasons"], node["gpus"]),
        **({"ansible_facts": {"nvidia": facts}} if facts is not None else {}),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "expected_gpu_count": {"type": "int"},
            "corrected_errors_threshold": {"type": "int"},
            "kernel_log": {"type": "str", "default": DEFAULT_KERNEL_LOG},
            "fail_on_unhealthy": {"type": "bool", "default": False},
            "facts": {"type": "bool", "default": False},
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
