#!/usr/bin/python
"""Ansible module gpu_facts: NVIDIA driver, GPUs, NVLinks and topology as ansible_facts.nvidia."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts through NVML
description:
  - Reads the NVIDIA driver version, every GPU (identity, memory, persistence mode, power limits,
    temperatures, ECC mode and counters, remapped rows, retired pages, NVLinks, compute processes) and the
    GPU topology matrix through NVML (the C(pynvml) module of C(nvidia-ml-py)), and sets them as
    C(ansible_facts.nvidia).
  - Replaces C(nvidia-smi | grep | awk) pipelines, which break when a driver update changes the output.
  - A value the GPU or driver does not support is C(null). A GPU that cannot be read (for example a lost GPU)
    gets an C(error) message and null values, and the module warns; the other GPUs are still reported.
  - Also reports, from C(/proc) and C(/sys) and so without NVML, the processes holding C(/dev/nvidia*) open
    and whether the node has NVSwitches. With O(nvml=false) that is all it reads, which works before the
    driver is installed and during a driver/library version mismatch.
  - Never changes anything. Needs root to see other users' processes in C(device_processes); the rest does
    not need root.
version_added: "0.1.0"
author: "A100 LLM platform team"
options:
  nvml:
    description:
      - Read the driver and the GPUs through NVML. When NVML cannot start (no driver, version mismatch), the
        module fails with a message that says why and how to fix it.
      - V(false) reads only C(device_processes) and C(nvswitches) (from C(/proc) and C(/sys)), needs neither
        the driver nor C(pynvml), and never fails for want of them. C(ansible_facts.nvidia) then holds only
        those two keys.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - llm_platform
  - llm_platform.facts
  - llm_platform.nvml
seealso:
  - module: gpu_health
  - module: gpu_topology
  - module: gpu_settings
"""

EXAMPLES = r"""
- name: Gather GPU facts
  gpu_facts:

- name: Show driver and GPU count
  ansible.builtin.debug:
    msg: "driver {{ ansible_facts.nvidia.driver_version }}, {{ ansible_facts.nvidia.gpu_count }} GPUs"

- name: Every GPU must be an A100
  ansible.builtin.assert:
    that: ansible_facts.nvidia.gpus | map(attribute='name') | select('search', 'A100') | list | length
          == ansible_facts.nvidia.gpu_count

- name: Before the driver exists, or while NVML reports a version mismatch, list the GPU users
  gpu_facts:
    nvml: false
  become: true
  register: gpu_host

- name: Name the GPU workloads (the driver's own daemons left out)
  ansible.builtin.debug:
    msg: "{{ gpu_host.ansible_facts.nvidia.device_processes | rejectattr('driver_daemon')
             | map(attribute='name') | list }}"

# Ad hoc, from the project root:
#   ansible -i inventories/lab gpu_nodes -m gpu_facts
"""

RETURN = r"""
nvml_venv:
  description:
    - The virtualenv in which the GPU modules look for C(pynvml) when the target's Python lacks it, where
      the C(nvidia_driver) role installs C(nvidia-ml-py).
  returned: always
  type: str
  sample: /opt/nvidia-ml-py
ansible_facts:
  description: Facts under the key C(nvidia).
  returned: success
  type: complex
  contains:
    nvidia:
      description: NVIDIA driver and GPU facts.
      returned: success
      type: complex
      contains:
        driver_version:
          description: User-space driver version, as C(nvidia-smi) prints it.
          type: str
          sample: "535.183.06"
        cuda_driver_version:
          description: Highest CUDA version the driver supports.
          type: str
          sample: "12.2"
        nvml_version:
          description: NVML library version.
          type: str
          sample: "12.535.183.06"
        gpu_count:
          description: Number of GPUs NVML enumerates.
          type: int
          sample: 4
        gpus:
          description: One entry per GPU, in NVML index order.
          type: list
          elements: dict
          contains:
            index: {description: NVML index., type: int, sample: 0}
            uuid: {description: GPU UUID., type: str, sample: "GPU-5fb1e2a7-18cd-d813-b517-d285bf3138bb"}
            name: {description: Product name., type: str, sample: "NVIDIA A100-PCIE-40GB"}
            serial: {description: Board serial number (null if unsupported)., type: str}
            pci_bus_id: {description: PCI bus id (8-digit domain)., type: str, sample: "00000000:17:00.0"}
            memory_total_mib: {description: Total framebuffer memory in MiB., type: int, sample: 40960}
            memory_used_mib: {description: Used framebuffer memory in MiB., type: int, sample: 0}
            persistence_mode: {description: Whether persistence mode is on., type: bool}
            power:
              description: Power limits and draw in watts (NVML reports milliwatts).
              type: dict
              contains:
                limit_w: {description: Current power limit., type: float, sample: 250}
                default_limit_w: {description: Default power limit., type: float, sample: 250}
                min_limit_w: {description: Lowest settable limit., type: float, sample: 150}
                max_limit_w: {description: Highest settable limit., type: float, sample: 250}
                enforced_limit_w: {description: Limit the GPU enforces now., type: float, sample: 250}
                draw_w: {description: Current power draw., type: float, sample: 36.03}
            temperature:
              description: Temperatures in Celsius.
              type: dict
              contains:
                gpu_c: {description: GPU core temperature., type: int, sample: 33}
                slowdown_c: {description: Temperature at which the GPU slows down., type: int, sample: 89}
                shutdown_c: {description: Temperature at which the GPU shuts down., type: int, sample: 92}
                gpu_max_c: {description: Maximum operating temperature., type: int, sample: 85}
                target_c:
                  description: GPU target temperature (null if unsupported, as on A100).
                  type: int
            ecc:
              description: ECC mode and error counters (volatile since the driver loaded, aggregate lifetime).
              type: dict
              contains:
                enabled: {description: ECC mode now., type: bool}
                pending_enabled: {description: ECC mode after the next reset., type: bool}
                volatile_corrected: {description: Corrected errors since the driver loaded., type: int}
                volatile_uncorrected: {description: Uncorrectable errors since the driver loaded., type: int}
                aggregate_corrected: {description: Corrected errors over the GPU's life., type: int}
                aggregate_uncorrected: {description: Uncorrectable errors over the GPU's life., type: int}
            remapped_rows:
              description: Row remapping (A100 and later); null where the GPU does not remap rows.
              type: dict
              contains:
                correctable: {description: Rows remapped for correctable errors., type: int}
                uncorrectable: {description: Rows remapped for uncorrectable errors., type: int}
                pending: {description: A remap waits for a GPU reset., type: bool}
                failure: {description: A remap failed; the GPU needs replacing., type: bool}
                histogram:
                  description: >-
                    Memory banks by the spare rows they have left (nvmlDeviceGetRowRemapperHistogram); null
                    where the driver does not report it.
                  type: dict
                  contains:
                    max: {description: Banks with all their spare rows., type: int}
                    high: {description: Banks with most of them., type: int}
                    partial: {description: Banks with some., type: int}
                    low: {description: Banks with few., type: int}
                    none: {description: Banks with none left (the next remap there fails)., type: int}
            recovery_action:
              description: >-
                NVML's recovery action flag (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; 0 none, 1 GPU reset, 2 node
                reboot, 3 drain peer-to-peer, 4 drain and reset); null where the driver does not report it
                (before R565, as the 535 branch).
              type: int
            retired_pages:
              description: Page retirement on GPUs that retire pages; null on GPUs that remap rows (A100).
              type: dict
              contains:
                single_bit_ecc: {description: Pages retired for multiple single-bit errors., type: int}
                double_bit_ecc: {description: Pages retired for double-bit errors., type: int}
                pending: {description: Pages wait to be retired at the next reset., type: bool}
            nvlinks:
              description: The GPU's NVLinks.
              type: list
              elements: dict
              contains:
                link: {description: Link number., type: int}
                active: {description: Whether the link is up., type: bool}
                remote_pci_bus_id: {description: PCI bus id of the far end., type: str}
                remote_device_type: {description: "C(gpu), C(switch), C(ibmnpu) or C(unknown).", type: str}
                remote_gpu_index: {description: Far-end GPU's index here; null for an NVSwitch., type: int}
            processes:
              description: Compute processes on the GPU.
              type: list
              elements: dict
              contains:
                pid: {description: Process id., type: int}
                used_memory_mib: {description: GPU memory it uses., type: int}
            error:
              description: Why this GPU could not be read (for example a lost GPU); null when it was read.
              type: str
        nvml_venv:
          description:
            - RV(nvml_venv), also among the facts, so that a later play of the same run finds it without a
              second read (role gpu_health_agent).
          returned: always
          type: str
          sample: /opt/nvidia-ml-py
        device_processes:
          description:
            - Processes with a file descriptor open on C(/dev/nvidia*), from C(/proc) (works without NVML).
              Other users' processes are seen only as root. The module's own process is left out.
          returned: always
          type: list
          elements: dict
          contains:
            pid: {description: Process id., type: int, sample: 4242}
            name:
              description: Command name (C(/proc/PID/comm), at most 15 characters).
              type: str
              sample: python3
            user:
              description: Effective user (its uid as a string if it has no name; null if unreadable).
              type: str
              sample: root
            devices:
              description: The C(/dev/nvidia*) device files it holds, sorted.
              type: list
              elements: str
              sample: ["/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidiactl"]
            driver_daemon:
              description:
                - Whether it is one of the driver's own daemons (C(nvidia-persistenced), C(nv-fabricmanager)),
                  not a GPU workload.
              type: bool
            unit:
              description:
                - The systemd unit it runs in (the innermost C(.service) or C(.scope) of its cgroup), null
                  for a pod's process or when unknown.
              type: str
              sample: gpu-health-agent.service
            pod_uid:
              description:
                - The uid of the Kubernetes pod it runs in (from the kubelet's cgroup name), null otherwise.
              type: str
              sample: 2b7f3c1e-5d2a-4c7b-9f0e-1a2b3c4d5e6f
        nvswitches:
          description: Whether the node has NVSwitches (an HGX board, which needs fabric manager).
          returned: always
          type: dict
          contains:
            present:
              description:
                - True when the PCI bus has NVSwitches or NVML shows NVLinks to one. The PCI scan needs no
                  driver and sees NVSwitches before their links are up.
              type: bool
            pci_devices:
              description:
                - PCI addresses of the NVSwitches, NVIDIA (vendor C(0x10de)) devices of class C(0x0680) under
                  C(/sys/bus/pci/devices).
              type: list
              elements: str
              sample: ["0000:07:00.0", "0000:08:00.0"]
            nvml_links:
              description:
                - NVLinks NVML reports towards an NVSwitch, up or not, plus active links whose far end is no
                  GPU of this node on drivers that report no far-end type; null with O(nvml=false).
              type: int
              sample: 96
        topology:
          description:
            - "C(topology[i][j]) as C(nvidia-smi topo -m) names it: C(X) on the diagonal, C(NV<n>) for n
              active NVLinks (direct over bridges or through NVSwitches), else C(PIX), C(PXB), C(PHB),
              C(NODE) or C(SYS); null when unknown."
          type: list
          elements: list
          sample: [["X", "NV12", "SYS", "SYS"], ["NV12", "X", "SYS", "SYS"]]
"""

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpu_host import device_processes, nvswitch_pci_devices
from ansible.module_utils.gpu_inventory import read_node, topology_matrix
from ansible.module_utils.gpu_node_facts import node_facts, nvswitch_facts
from ansible.module_utils.nvml_session import (
    NVML_VENV,
    NvmlUnavailable,
    describe_error,
    nvml_session,
    require_pynvml,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"nvml": {"type": "bool", "default": True}},
        supports_check_mode=True,
    )
    # From /proc and /sys, before NVML opens any device, and whether or not NVML works.
    holders = device_processes(exclude_pids={os.getpid()})
    switches = nvswitch_pci_devices()
    if not module.params["nvml"]:
        facts: dict[str, Any] = {
            "device_processes": holders,
            "nvswitches": nvswitch_facts(switches, None),
            "nvml_venv": NVML_VENV,
        }
        module.exit_json(changed=False, nvml_venv=NVML_VENV, ansible_facts={"nvidia": facts})

    nvml = require_pynvml(module)
    try:
        with nvml_session(nvml):
            node = read_node(nvml)
            topology = topology_matrix(nvml, node.gpus)
    except NvmlUnavailable as exc:
        module.fail_json(msg=str(exc))
    except nvml.NVMLError as exc:
        module.fail_json(msg=describe_error(exc, "Reading the GPUs"))

    for gpu in node.gpus:
        if gpu.error_message:
            module.warn(gpu.error_message)
    facts = node_facts(node, topology, holders, switches)
    module.exit_json(changed=False, nvml_venv=NVML_VENV, ansible_facts={"nvidia": facts})


if __name__ == "__main__":
    main()
