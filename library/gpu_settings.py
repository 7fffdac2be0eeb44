#!/usr/bin/python
"""Ansible module gpu_settings: power limit, persistence mode and target temperature of NVIDIA GPUs."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_settings
short_description: Set NVIDIA GPU power limit, persistence mode and target temperature through NVML
description:
  - Sets the power limit, persistence mode and GPU target temperature of some or all GPUs of a node
    through NVML (C(pynvml) of C(nvidia-ml-py)), changing only the values that differ.
  - Every requested value is checked against each GPU's constraints before anything is touched; a value
    outside them fails with a message naming the GPU and the allowed range.
  - In check mode reports what would change and changes nothing. With C(--diff) shows before and after
    per GPU.
  - NVML settings do not survive a reboot or a driver reload; run this module from the play that
    configures the node, so every converge puts them back.
  - "Needs root (C(become: true)); without it NVML answers Insufficient Permissions and the module says so."
version_added: "0.1.0"
author: "A100 LLM platform team"
options:
  power_limit_w:
    description:
      - Power limit in watts (what C(nvidia-smi -pl) sets). Must be within the GPU's constraints,
        150-250 W on an A100 PCIe 40 GB, 100-400 W on an A100 SXM4 40 GB.
    type: int
  persistence_mode:
    description:
      - Persistence mode on or off (what C(nvidia-smi -pm) sets). Keeps the driver initialised with no
        client, so GPU jobs start without the driver's set-up delay. Where C(nvidia-persistenced) runs, it
        owns this setting.
    type: bool
  target_temperature_c:
    description:
      - GPU target temperature in Celsius (what C(nvidia-smi --gpu-target-temp) sets), where the GPU
        supports it. Passively cooled data-centre GPUs such as the A100 do not; see O(unsupported).
    type: int
  gpus:
    description:
      - NVML indices of the GPUs to configure. Default all.
    type: list
    elements: int
  unsupported:
    description:
      - What to do when a GPU does not support a requested setting. C(fail) fails before anything is
        changed; C(warn) warns and skips that setting on that GPU.
    type: str
    choices: [fail, warn]
    default: fail
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
extends_documentation_fragment:
  - llm_platform
  - llm_platform.nvml
seealso:
  - module: gpu_facts
"""

EXAMPLES = r"""
- name: Cap every GPU at 200 W and turn persistence mode on
  gpu_settings:
    power_limit_w: 200
    persistence_mode: true
  become: true

- name: Only GPUs 2 and 3 back to the A100 PCIe default
  gpu_settings:
    power_limit_w: 250
    gpus: [2, 3]
  become: true

- name: Target temperature where supported, warn elsewhere
  gpu_settings:
    target_temperature_c: 80
    unsupported: warn
  become: true

# Ad hoc, dry run with a diff:
#   ansible -i inventories/lab gpu_nodes -b -m gpu_settings -a power_limit_w=200 --check --diff
"""

RETURN = r"""
gpus:
  description: The GPUs configured, with their values after the run (the intended values in check mode).
  returned: always
  type: list
  elements: dict
  contains:
    index: {description: NVML index., type: int, sample: 0}
    uuid: {description: GPU UUID., type: str}
    pci_bus_id: {description: PCI bus id., type: str, sample: "00000000:17:00.0"}
    power_limit_w: {description: Power limit in watts (null if unsupported)., type: float, sample: 200}
    persistence_mode: {description: Persistence mode (null if unsupported)., type: bool}
    target_temperature_c: {description: GPU target temperature (null if unsupported)., type: int}
    changed: {description: Names of the options changed on this GPU., type: list, elements: str}
diff:
  description: Per GPU (key C(gpu<index>)) the values before and after, where anything changes.
  returned: changed and diff mode
  type: dict
  sample:
    before: {gpu0: {power_limit_w: 250}}
    after: {gpu0: {power_limit_w: 200}}
msg:
  description: What was (or would be) changed.
  returned: always
  type: str
  sample: "power_limit_w 250 -> 200 W on GPUs 0, 1, 2, 3"
"""

from types import ModuleType
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_settings_core import SETTINGS, GpuState, apply, desire, read_gpu, summarise
from ansible.module_utils.nvml_session import (
    NvmlUnavailable,
    describe_error,
    is_unsupported,
    nvml_session,
    require_pynvml,
)


def run(module: AnsibleModule, nvml: ModuleType) -> dict[str, Any]:
    params = module.params
    requested = {name: params[name] for name in SETTINGS if params[name] is not None}
    count = nvml.nvmlDeviceGetCount()
    indices = list(range(count)) if params["gpus"] is None else list(dict.fromkeys(params["gpus"]))
    absent = [i for i in indices if not 0 <= i < count]
    if absent:
        module.fail_json(
            msg=f"No GPU {', '.join(map(str, absent))} on this node: it has {count} GPU(s), "
            f"indices 0-{count - 1}"
            if count
            else f"No GPU {', '.join(map(str, absent))}: this node has no GPUs"
        )

    gpus: list[GpuState] = []
    for index in indices:
        try:
            gpus.append(read_gpu(nvml, index))
        except nvml.NVMLError as exc:
            module.fail_json(msg=describe_error(exc, f"Reading GPU {index}"))

    # Validate everything before touching anything (the rules pending_settings applies too).
    out_of_range, not_supported = desire(gpus, requested)
    problems = [message for _gpu, _name, message in out_of_range]
    unsupported = [f"{gpu.label} does not support {name}" for gpu, name in not_supported]
    if unsupported and params["unsupported"] == "fail":
        problems.extend(unsupported)
    if problems:
        module.fail_json(msg="Nothing changed. " + "; ".join(problems), unsupported=unsupported)
    for warning in unsupported:
        module.warn(warning + "; skipped (unsupported=warn)")

    applied: dict[int, dict[str, tuple[Any, Any]]] = {}
    for gpu in gpus:
        for name, (before, after) in gpu.changes().items():
            if not module.check_mode:
                try:
                    apply(nvml, gpu, name, after)
                except nvml.NVMLError as exc:
                    done = summarise(gpus, applied) if applied else "nothing changed before it"
                    if is_unsupported(exc) and params["unsupported"] == "warn":
                        module.warn(describe_error(exc, f"Setting {name} on {gpu.label}") + " Skipped.")
                        continue
                    module.fail_json(
                        msg=describe_error(exc, f"Setting {name}={after} on {gpu.label}") + f" ({done})",
                        changed=bool(applied),
                    )
            applied.setdefault(gpu.index, {})[name] = (before, after)

    result: dict[str, Any] = {
        "changed": bool(applied),
        "msg": summarise(gpus, applied),
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "pci_bus_id": gpu.pci_bus_id,
                **{
                    name: applied.get(gpu.index, {}).get(name, (None, gpu.current[name]))[1]
                    for name in SETTINGS
                },
                "changed": sorted(applied.get(gpu.index, {})),
            }
            for gpu in gpus
        ],
    }
    if applied and module._diff:
        result["diff"] = {
            "before": {
                f"gpu{i}": {name: ba[0] for name, ba in changes.items()} for i, changes in applied.items()
            },
            "after": {
                f"gpu{i}": {name: ba[1] for name, ba in changes.items()} for i, changes in applied.items()
            },
        }
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "power_limit_w": {"type": "int"},
            "persistence_mode": {"type": "bool"},
            "target_temperature_c": {"type": "int"},
            "gpus": {"type": "list", "elements": "int"},
            "unsupported": {"type": "str", "choices": ["fail", "warn"], "default": "fail"},
        },
        required_one_of=[list(SETTINGS)],
        supports_check_mode=True,
    )
    nvml = require_pynvml(module)
    try:
        with nvml_session(nvml):
            result = run(module, nvml)
    except NvmlUnavailable as exc:
        module.fail_json(msg=str(exc))
    except nvml.NVMLError as exc:
        module.fail_json(msg=describe_error(exc, "Reading the GPUs"))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
