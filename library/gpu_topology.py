#!/usr/bin/python
"""Ansible module gpu_topology: assert the NVLink layout and GPU count of a node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_topology
short_description: Check NVIDIA GPU count and NVLink pairs through NVML
description:
  - Reads the GPUs' NVLinks through NVML (C(pynvml) of C(nvidia-ml-py)) and checks that every pair in
    O(nvlink_pairs) is joined by at least O(min_links_per_pair) active NVLinks, directly (NVLink bridges)
    or through NVSwitches (HGX boards), and that the node has O(gpu_count) GPUs.
  - Fails listing every missing or inactive pair and a wrong GPU count, so one run names everything to fix
    (with O(check=false) it returns them in RV(problems) instead).
  - Returns the topology matrix in the names of C(nvidia-smi topo -m). Never changes anything.
  - "With O(facts), O(check=false) and O(settings) it is the one NVML read a role needs (role gpu_tuning):
    the node's facts as M(gpu_facts) returns them, the layout's problems for the role to check, and what
    M(gpu_settings) would change, from one NVML session instead of a module call (and a start of NVML) each."
version_added: "0.1.0"
author: "A100 LLM platform team"
options:
  nvlink_pairs:
    description:
      - Pairs C([a, b]) of GPU indices that must have active NVLinks between them.
    type: list
    elements: list
    default: []
  min_links_per_pair:
    description:
      - Fewest active NVLinks each pair needs. A PCIe A100 pair with three NVLink bridges has 12, an HGX
        A100 pair through its NVSwitches 12 as well; use 12 to catch a single failed link.
    type: int
    default: 1
  gpu_count:
    description:
      - Number of GPUs the node must have. Not checked when omitted.
    type: int
  check:
    description:
      - Fail when a pair lacks links or the GPU count is wrong. V(false) only reports it, in RV(problems), for
        a caller that checks later (role gpu_tuning checks the layout after the driver role, which may start
        fabric manager and bring an HGX board's NVSwitch links up). A failure to read the GPUs still fails.
    type: bool
    default: true
  facts:
    description:
      - Also return the node's facts as M(gpu_facts) returns them (C(ansible_facts.nvidia),
        module_utils/gpu_node_facts.py), from the same NVML session.
    type: bool
    default: false
  settings:
    description:
      - The options M(gpu_settings) would be given; returns in RV(settings_pending) what it would change, or
        why it would fail or warn, by its own rules (module_utils/gpu_settings_core.py), so that a caller
        runs it only where something is to do.
    type: dict
    suboptions:
      power_limit_w:
        description: M(gpu_settings)'s option C(power_limit_w).
        type: int
      persistence_mode:
        description: M(gpu_settings)'s option C(persistence_mode).
        type: bool
      target_temperature_c:
        description: M(gpu_settings)'s option C(target_temperature_c).
        type: int
      gpus:
        description: M(gpu_settings)'s option C(gpus); default all.
        type: list
        elements: int
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - llm_platform
  - llm_platform.nvml
seealso:
  - module: gpu_facts
  - module: gpu_health
  - module: gpu_settings
"""

EXAMPLES = r"""
- name: The team's A100 PCIe servers - 4 GPUs, bridges joining 0-1 and 2-3, all 12 links up
  gpu_topology:
    gpu_count: 4
    nvlink_pairs: [[0, 1], [2, 3]]
    min_links_per_pair: 12

- name: An HGX A100 board - every GPU reaches every other through the NVSwitches
  gpu_topology:
    gpu_count: 8
    nvlink_pairs: [[0, 1], [0, 7], [2, 5], [3, 4], [6, 7]]
    min_links_per_pair: 12

- name: One read for facts, the layout (checked later) and whether the power cap is in place
  gpu_topology:
    gpu_count: 4
    nvlink_pairs: [[0, 1], [2, 3]]
    check: false
    facts: true
    settings:
      power_limit_w: 200
      persistence_mode: true
  register: gpu_read

- name: Apply the power cap only where it differs
  gpu_settings:
    power_limit_w: 200
    persistence_mode: true
  when: gpu_read.settings_pending | length > 0
"""

RETURN = r"""
topology:
  description: "C(topology[i][j]) as C(nvidia-smi topo -m) names it (C(X), C(NV<n>), C(PIX), C(PXB), C(PHB),
    C(NODE), C(SYS)); null when unknown."
  returned: success or failed check
  type: list
  elements: list
  sample: [["X", "NV12", "SYS", "SYS"], ["NV12", "X", "SYS", "SYS"], ["SYS", "SYS", "X", "NV12"],
    ["SYS", "SYS", "NV12", "X"]]
missing_pairs:
  description: The pairs of O(nvlink_pairs) without enough active NVLinks (or with a GPU absent).
  returned: success or failed check
  type: list
  elements: list
  sample: [[2, 3]]
pairs:
  description: Every requested pair with its active link count.
  returned: success or failed check
  type: list
  elements: dict
  contains:
    gpus: {description: The pair., type: list, elements: int, sample: [0, 1]}
    active_links: {description: Active NVLinks joining them (null if a GPU is absent)., type: int, sample: 12}
    ok: {description: Whether the pair meets O(min_links_per_pair)., type: bool}
    problem: {description: Why the pair fails; null when ok., type: str}
gpu_count:
  description: GPUs NVML enumerates.
  returned: success or failed check
  type: int
  sample: 4
problems:
  description: What the check found wrong (the GPU count, each failing pair); the check fails with these.
  returned: success or failed check
  type: list
  elements: str
  sample: ["expected 4 GPUs, found 3", "GPUs 2-3: 0 active NVLink(s), need at least 1"]
boot_id:
  description: The kernel's boot id when the GPUs were read (C(/proc/sys/kernel/random/boot_id)); null if
    unreadable. A caller that uses the read later tells by it whether the node rebooted since.
  returned: success or failed check
  type: str
  sample: 4f1c2a8e-0b6d-4e59-9a43-1d7f3b2c5e60
settings_pending:
  description:
    - With O(settings), what M(gpu_settings) given them would do besides finding everything in place, one
      entry per GPU and setting; empty where it would change nothing.
  returned: success or failed check, with O(settings)
  type: list
  elements: dict
  contains:
    gpu: {description: NVML index., type: int, sample: 0}
    setting:
      description: The option (null for a GPU absent or unreadable).
      type: str
      sample: power_limit_w
    action:
      description: "C(change); C(unsupported) (it fails or warns); C(out_of_range), C(absent) or C(unreadable)
        (it fails)."
      type: str
      sample: change
    before: {description: The value now (C(change) only)., type: raw, sample: 250.0}
    after: {description: The value it would set (C(change) only)., type: raw, sample: 200}
    message: {description: What it would say., type: str}
ansible_facts:
  description: With O(facts=true), C(nvidia), the node's facts exactly as M(gpu_facts) returns them.
  returned: success or failed check, with O(facts=true)
  type: dict
"""

import os
from types import ModuleType
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_host import device_processes, nvswitch_pci_devices
from ansible.module_utils.gpu_inventory import nvlink_count, read_node, topology_matrix
from ansible.module_utils.gpu_node_facts import node_facts
from ansible.module_utils.gpu_settings_core import SETTINGS, pending_settings
from ansible.module_utils.nvml_session import NvmlUnavailable, describe_error, nvml_session, require_pynvml

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    try:
        with open(BOOT_ID, encoding="ascii") as source:
            return source.read().strip() or None
    except OSError:
        return None


def validate_pairs(module: AnsibleModule) -> list[tuple[int, int]]:
    pairs = []
    for entry in module.params["nvlink_pairs"]:
        try:
            a, b = (int(x) for x in entry)
        except (TypeError, ValueError):
            module.fail_json(msg=f"nvlink_pairs: {entry!r} is not a pair of GPU indices such as [0, 1]")
        if a == b or a < 0 or b < 0:
            module.fail_json(msg=f"nvlink_pairs: {entry!r} must name two different GPU indices >= 0")
        pairs.append((a, b))
    if module.params["min_links_per_pair"] < 1:
        module.fail_json(msg="min_links_per_pair must be at least 1")
    return pairs


def check(
    module: AnsibleModule,
    nvml: ModuleType,
    pairs: list[tuple[int, int]],
    host: tuple[list[dict[str, Any]], list[str]] | None = None,
) -> dict[str, Any]:
    """The layout's check, and with ``host`` (the /dev/nvidia* holders and NVSwitch PCI devices, read before
    NVML opened any device, as gpu_facts reads them) the node's facts; in the caller's NVML session."""
    node = read_node(nvml)
    topology = topology_matrix(nvml, node.gpus)
    by_index = {gpu.index: gpu for gpu in node.gpus}
    need = module.params["min_links_per_pair"]
    results = []
    problems = []
    for a, b in pairs:
        absent = [i for i in (a, b) if i not in by_index]
        unreadable = [i for i in (a, b) if i in by_index and by_index[i].error_reason]
        links = None
        problem: str | None
        if absent:
            problem = f"GPU {' and '.join(map(str, absent))} not present"
        elif unreadable:
            problem = "; ".join(by_index[i].error_message or f"GPU {i} unreadable" for i in unreadable)
        else:
            links = nvlink_count(by_index[a].facts, by_index[b].facts)
            problem = None if links >= need else f"{links} active NVLink(s), need at least {need}"
        results.append({"gpus": [a, b], "active_links": links, "ok": problem is None, "problem": problem})
        if problem:
            problems.append(f"GPUs {a}-{b}: {problem}")
    expected = module.params["gpu_count"]
    count = node.system["gpu_count"]
    if expected is not None and count != expected:
        problems.insert(0, f"expected {expected} GPUs, found {count}")
    result: dict[str, Any] = {
        "changed": False,
        "topology": topology,
        "missing_pairs": [r["gpus"] for r in results if not r["ok"]],
        "pairs": results,
        "gpu_count": count,
        "problems": problems,
        "boot_id": boot_id(),
    }
    settings = module.params["settings"]
    if settings is not None:
        requested = {name: settings[name] for name in SETTINGS if settings[name] is not None}
        result["settings_pending"] = pending_settings(nvml, requested, settings["gpus"])
    if host is not None:
        for gpu in node.gpus:
            if gpu.error_message:
                module.warn(gpu.error_message)
        result["ansible_facts"] = {"nvidia": node_facts(node, topology, *host)}
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nvlink_pairs": {"type": "list", "elements": "list", "default": []},
            "min_links_per_pair": {"type": "int", "default": 1},
            "gpu_count": {"type": "int"},
            "check": {"type": "bool", "default": True},
            "facts": {"type": "bool", "default": False},
            "settings": {
                "type": "dict",
                "options": {
                    "power_limit_w": {"type": "int"},
                    "persistence_mode": {"type": "bool"},
                    "target_temperature_c": {"type": "int"},
                    "gpus": {"type": "list", "elements": "int"},
                },
            },
        },
        supports_check_mode=True,
    )
    pairs = validate_pairs(module)
    # From /proc and /sys, before NVML opens any device, as gpu_facts reads them.
    host = (
        (device_processes(exclude_pids={os.getpid()}), nvswitch_pci_devices())
        if module.params["facts"]
        else None
    )
    nvml = require_pynvml(module)
    try:
        with nvml_session(nvml):
            result = check(module, nvml, pairs, host)
    except NvmlUnavailable as exc:
        module.fail_json(msg=str(exc))
    except nvml.NVMLError as exc:
        module.fail_json(msg=describe_error(exc, "Reading the GPU topology"))
    problems = result["problems"]
    if problems and module.params["check"]:
        module.fail_json(msg="GPU topology check failed: " + "; ".join(problems), **result)
    result["msg"] = (
        "GPU topology: " + "; ".join(problems)
        if problems
        else f"{result['gpu_count']} GPUs; all {len(pairs)} NVLink pair(s) have enough active links"
    )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
