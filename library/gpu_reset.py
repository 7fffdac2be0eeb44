#!/usr/bin/python
"""Ansible module gpu_reset: reset NVIDIA GPUs that no process holds, and clear their Xids."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_reset
short_description: Reset NVIDIA GPUs once no process holds them (nvidia-smi -r), and clear their Xids
description:
  - "O(state=planned): for each GPU of O(gpus), its identity, its NVLink peers, the Kubernetes pods that use
    it (their containers' C(NVIDIA_VISIBLE_DEVICES), as the device plugin sets it, or a process holding its
    C(/dev/nvidia<minor>)) and the processes that hold it now. Changes nothing: the input for draining."
  - "O(state=reset): refuses, naming them, while any process other than the driver's own daemons
    (nvidia-persistenced, nv-fabricmanager) holds a GPU's device file or NVML lists a compute process on it,
    and refuses a GPU off the bus (a reset cannot reach it: reboot the node). Then resets each GPU with
    C(nvidia-smi --gpu-reset -i UUID): on Ampere GPUs one GPU can be reset alone, also with NVLink bridges,
    and on NVSwitch systems while the Fabric Manager runs (the nvidia-smi manual); nvidia-smi itself names the
    GPUs that must be reset together where that does not hold. Finally records, per GPU reset, the kernel
    log's last record number (module_utils/gpu_kernel_log.py): the Xids logged before are cleared, for
    gpu_health and the GPU health agent alike, until the next boot. Returns the node's health read again."
  - Never drains, cordons or stops anything (playbooks/remediate/gpu-reset.yml does that around it).
version_added: "0.1.0"
author: "A100 LLM platform team"
options:
  gpus:
    description: The GPUs, each by NVML index, UUID or PCI bus id.
    type: list
    elements: str
    required: true
  state:
    description: C(planned) only reads; C(reset) resets.
    type: str
    choices: [planned, reset]
    default: reset
  kernel_log:
    description:
      - "Where the Xids are read (C(/dev/kmsg), or the lab's file of its records): its last record number is
        what a reset clears up to. Empty clears nothing."
    type: str
    default: /dev/kmsg
attributes:
  check_mode:
    support: full
    details: Reads and refuses exactly as a real run; resets nothing and records nothing.
  diff_mode:
    support: none
extends_documentation_fragment:
  - llm_platform
  - llm_platform.nvml
notes:
  - Needs root (C(nvidia-smi -r) does; other users' processes are seen only by root).
  - "GPU reset is not guaranteed to work in all cases (nvidia-smi's manual): a GPU that does not come back
    healthy needs a reboot (playbooks/remediate/node-reboot.yml)."
seealso:
  - module: gpu_health
"""

EXAMPLES = r"""
- name: Which pods use GPU 2 and its NVLink peer
  gpu_reset:
    gpus: ["2"]
    state: planned
  register: plan

- name: Reset it (nothing may hold it)
  gpu_reset:
    gpus: ["{{ plan.gpus[0].uuid }}"]
"""

RETURN = r"""
gpus:
  description: The GPUs named, in order.
  returned: always
  type: list
  elements: dict
  contains:
    index: {description: NVML index., type: int}
    uuid: {description: UUID., type: str}
    pci_bus_id: {description: PCI bus id., type: str}
    minor: {description: "Minor number of its /dev/nvidia<minor>.", type: int}
    nvlink_peers: {description: NVML indexes of the GPUs joined to it by an active NVLink., type: list}
    pods: {description: UIDs of the pods that use it., type: list, elements: str}
    holders: {description: "Processes holding it now (pid, name, unit or pod).", type: list, elements: str}
peer_pods:
  description: UIDs of the pods that use one of the GPUs' NVLink peers (and not the GPUs themselves).
  returned: always
  type: list
  elements: str
reset:
  description: UUIDs of the GPUs reset (empty in check mode and for O(state=planned)).
  returned: always
  type: list
  elements: str
cleared_seq:
  description: The kernel log's record number up to which the reset GPUs' Xids are cleared (null if none).
  returned: always
  type: int
health:
  description: The node's gpu_health result after the reset (O(state=reset), not in check mode).
  returned: when reset
  type: dict
msg:
  description: One-line summary.
  returned: always
  type: str
"""

import os
from types import ModuleType
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_host import device_processes, gpu_pods, pod_uses_gpu
from ansible.module_utils.gpu_inventory import normalise_bus_id, read_node
from ansible.module_utils.gpu_kernel_log import DEFAULT_KERNEL_LOG, read_log, save_cleared
from ansible.module_utils.gpu_node_health import assess_node, read_xids
from ansible.module_utils.nvml_session import NvmlUnavailable, describe_error, nvml_session, require_pynvml


def _describe(proc: dict[str, Any]) -> str:
    where = f"pod {proc['pod_uid']}" if proc.get("pod_uid") else (proc.get("unit") or "no unit")
    return f"{proc['name']}[{proc['pid']}] ({where})"


def read_gpus(module: AnsibleModule, nvml: ModuleType) -> tuple[list[dict[str, Any]], list[str]]:
    """The named GPUs with their NVLink peers, pods and holders, and the pods of their NVLink peers; fails
    on an unknown or lost GPU."""
    node = read_node(nvml)
    wanted = []
    for name in module.params["gpus"]:
        key = str(name).strip()
        found = [
            r
            for r in node.gpus
            if key == str(r.index)
            or key.lower() == str(r.facts["uuid"] or "").lower()
            or normalise_bus_id(key) == r.facts["pci_bus_id"]
        ]
        if not found:
            module.fail_json(
                msg=f"gpus: no GPU {key} on this node ({len(node.gpus)} GPUs, by index, UUID or bus id)"
            )
        reading = found[0]
        if reading.error_reason:
            module.fail_json(
                msg=f"GPU {key} cannot be reset: {reading.error_message}. A GPU off the bus needs a reboot "
                "(playbooks/remediate/node-reboot.yml)."
            )
        wanted.append(reading)
    pods = gpu_pods()
    holders = [p for p in device_processes(exclude_pids={os.getpid()}) if not p["driver_daemon"]]
    gpus = []
    for reading in wanted:
        facts = reading.facts
        minor = int(nvml.nvmlDeviceGetMinorNumber(reading.handle))
        device = f"/dev/nvidia{minor}"
        compute = [p["pid"] for p in facts["processes"]]
        held = [_describe(p) for p in holders if device in p["devices"]]
        held += [
            f"pid {pid} (an NVML compute process)"
            for pid in compute
            if pid not in {h["pid"] for h in holders}
        ]
        gpus.append(
            {
                "index": reading.index,
                "uuid": facts["uuid"],
                "pci_bus_id": facts["pci_bus_id"],
                "minor": minor,
                "nvlink_peers": sorted(
                    {
                        link["remote_gpu_index"]
                        for link in facts["nvlinks"]
                        if link["active"] and link.get("remote_gpu_index") is not None
                    }
                ),
                "pods": sorted(
                    uid for uid, pod in pods.items() if pod_uses_gpu(pod, reading.index, facts["uuid"], minor)
                ),
                "holders": held,
            }
        )
    by_index = {r.index: r for r in node.gpus}
    peers = {p for g in gpus for p in g["nvlink_peers"]} - {g["index"] for g in gpus}
    own = {uid for g in gpus for uid in g["pods"]}
    peer_pods = set()
    for index in peers:
        peer = by_index.get(index)
        if peer is None or peer.error_reason:
            continue
        minor = int(nvml.nvmlDeviceGetMinorNumber(peer.handle))
        peer_pods |= {uid for uid, pod in pods.items() if pod_uses_gpu(pod, index, peer.facts["uuid"], minor)}
    return gpus, sorted(peer_pods - own)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gpus": {"type": "list", "elements": "str", "required": True},
            "state": {"type": "str", "choices": ["planned", "reset"], "default": "reset"},
            "kernel_log": {"type": "str", "default": DEFAULT_KERNEL_LOG},
        },
        supports_check_mode=True,
    )
    if not module.params["gpus"]:
        module.fail_json(msg="gpus: name at least one GPU (index, UUID or bus id)")
    nvml = require_pynvml(module)
    try:
        with nvml_session(nvml):
            gpus, peer_pods = read_gpus(module, nvml)
    except NvmlUnavailable as exc:
        module.fail_json(msg=str(exc))
    except nvml.NVMLError as exc:
        module.fail_json(msg=describe_error(exc, "Reading the GPUs"))
    result: dict[str, Any] = {
        "changed": False,
        "gpus": gpus,
        "peer_pods": peer_pods,
        "reset": [],
        "cleared_seq": None,
    }
    names = ", ".join(f"GPU {g['index']} ({g['uuid']})" for g in gpus)
    if module.params["state"] == "planned":
        module.exit_json(**result, msg=f"{names}: {sum(len(g['pods']) for g in gpus)} pod(s) use them")
    busy = [f"GPU {g['index']}: {', '.join(g['holders'])}" for g in gpus if g["holders"]]
    if busy:
        module.fail_json(
            **result,
            msg="Not resetting: processes hold the GPU(s): "
            + "; ".join(busy)
            + ". Drain the pods using them (playbooks/remediate/gpu-reset.yml does) and stop the cluster's "
            "own GPU clients, then run again.",
        )
    if module.check_mode:
        module.exit_json(**{**result, "changed": True}, msg=f"would reset {names}")
    smi = module.get_bin_path("nvidia-smi", required=True)
    for gpu in gpus:
        rc, out, err = module.run_command([smi, "--gpu-reset", "-i", gpu["uuid"]])
        if rc != 0:
            module.fail_json(
                **{**result, "changed": bool(result["reset"])},
                msg=f"nvidia-smi --gpu-reset -i {gpu['uuid']} failed (rc {rc}): {(out + err).strip()}. "
                "A GPU that cannot be reset needs a reboot (playbooks/remediate/node-reboot.yml).",
            )
        result["reset"].append(gpu["uuid"])
    result["changed"] = True
    kernel_log = module.params["kernel_log"]
    if kernel_log:
        try:
            _, last = read_log(kernel_log)
        except OSError as exc:
            module.warn(f"{kernel_log}: {exc.strerror or exc}: the GPUs' Xids are not cleared")
            last = None
        if last is not None:
            save_cleared([g["pci_bus_id"] for g in gpus], last)
            result["cleared_seq"] = last
    events, log_error = read_xids(kernel_log)
    try:
        health = assess_node(nvml, None, None, events, kernel_log_error=log_error)
    except nvml.NVMLError as exc:  # assess_node reports NVML errors itself; this is a safety net
        module.fail_json(**result, msg=describe_error(exc, "Reading the GPUs after the reset"))
    health.pop("settled")
    module.exit_json(
        **result, health=health, msg=f"reset {names}: the node is {health['verdict']} ({health['action']})"
    )


if __name__ == "__main__":
    main()
