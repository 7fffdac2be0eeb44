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
  - Fails listing every missing or inactive pair and a wrong GPU count, so one run names everything to fix.
  - Returns the topology matrix in the names of C(nvidia-smi topo -m). Never changes anything.
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
"""

from types import ModuleType
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_inventory import nvlink_count, read_node, topology_matrix
from ansible.module_utils.nvml_session import NvmlUnavailable, describe_error, nvml_session, require_pynvml


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


def check(module: AnsibleModule, nvml: ModuleType, pairs: list[tuple[int, int]]) -> dict[str, Any]:
    node = read_node(nvml)
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
    return {
        "changed": False,
        "topology": topology_matrix(nvml, node.gpus),
        "missing_pairs": [r["gpus"] for r in results if not r["ok"]],
        "pairs": results,
        "gpu_count": count,
        "problems": problems,
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nvlink_pairs": {"type": "list", "elements": "list", "default": []},
            "min_links_per_pair": {"type": "int", "default": 1},
            "gpu_count": {"type": "int"},
        },
        supports_check_mode=True,
    )
    pairs = validate_pairs(module)
    nvml = require_pynvml(module)
    try:
        with nvml_session(nvml):
            result = check(module, nvml, pairs)
    except NvmlUnavailable as exc:
        module.fail_json(msg=str(exc))
    except nvml.NVMLError as exc:
        module.fail_json(msg=describe_error(exc, "Reading the GPU topology"))
    problems = result.pop("problems")
    if problems:
        module.fail_json(msg="GPU topology check failed: " + "; ".join(problems), **result)
    result["msg"] = f"{result['gpu_count']} GPUs; all {len(pairs)} NVLink pair(s) have enough active links"
    module.exit_json(**result)


if __name__ == "__main__":
    main()
