"""The task files a converged node skips whole are included under a gate (issue 19: a skipped task still
costs a worker per host, a skipped include one task instead of one per task). A gate may skip only what its
file's tasks would skip themselves: wherever one of them would run, the gate must hold. Here each gate is held
to its file's tasks over a grid of the states the roles' reads report (files_in_place's differ and stat,
packages_in_place's verdict, check mode, the reboot reasons, NVML's answer, ...), each condition evaluated by
Ansible's templar with the role's own defaults and vars, as the role would evaluate it:

- wherever the tasks ran before (the condition the file was entered under then: an import's or a block's
  `when`, or none) and one of them runs, the gate holds;
- every task of the file runs somewhere in its grid (the grid reaches each condition);
- on a converged node the gate is false (the file costs one skipped task).

A task that does not run registers a skipped result for the tasks after it, as Ansible does; one that runs
registers a changed result (the file is entered then anyway).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import filter_loader
from ansible.template import Templar, trust_as_template
from role_render import _load_plugins, _trusted

ROOT = Path(__file__).resolve().parents[2]
KERNEL = "6.8.0-45-generic"
BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
INITRAMFS = f"/boot/initrd.img-{KERNEL}"
# what a task that ran registers (enough of each module's result for the conditions and loops after it)
RAN = {
    "changed": True,
    "failed": False,
    "stat": {"exists": True},
    "stdout": "",
    "stdout_lines": [],
    "results": [],
}
SKIPPED = {"changed": False, "skipped": True}


@dataclass
class Gate:
    role: str
    including: str  # the task file holding the include
    included: str  # the file it includes
    was: (
        str | list[str] | bool
    )  # the condition the file's tasks ran under before the gate (an import's, a block's)
    dims: list[list[dict[str, Any]]]  # the grid: each scenario merges one entry of each
    converged: list[dict[str, Any]]  # a converged node's states: the gate is false there
    base: dict[str, Any] = field(default_factory=dict)
    task: str = ""  # the include's name, where the file is included more than once
    registered: dict[str, Any] = field(default_factory=dict)  # what a task registers when it runs, beyond RAN

    @property
    def id(self) -> str:
        return f"{self.role}:{self.included}"


def dim(name: str, *values: Any) -> list[dict[str, Any]]:
    return [{name: value} for value in values]


CHECK = dim("ansible_check_mode", False, True)

# nvidia_driver
DRIVER_BASE = {
    "ansible_facts": {
        "kernel": KERNEL,
        "packages": {"nvidia-headless-535": [{"version": "535.183.06-0ubuntu1"}]},
    },
    "__nvidia_driver_secure_boot": False,
    "__nvidia_driver_reboot_reasons": [],
    "ansible_check_mode": False,
}
IN_PLACE = {"in_place": True, "differ": []}
APT_DIFFERS = {"in_place": False, "differ": ["kmod"]}
NVML_DIFFERS = {"in_place": False, "differ": ["/opt/nvidia-ml-py"]}
SOURCES = dim("nvidia_driver_source", "cuda_repo", "ubuntu", "runfile")


def files_state(
    differ: list[str], blacklist: bool, initramfs: bool, older: bool, nouveau: bool
) -> dict[str, Any]:
    return {
        "differ": differ,
        "stat": {
            BLACKLIST: {"exists": blacklist, "mtime": 200.0} if blacklist else {"exists": False},
            INITRAMFS: {"exists": initramfs, "mtime": 100.0 if older else 300.0}
            if initramfs
            else {"exists": False},
            "/sys/module/nouveau": {"exists": nouveau},
        },
    }


FILES_STATES = [
    {"__nvidia_driver_files_state": files_state(differ, *flags)}
    for differ in ([], [BLACKLIST], ["/etc/apt/preferences.d/nvidia-driver.pref"])
    for flags in itertools.product((False, True), repeat=4)
]
CONVERGED_FILES = files_state([], blacklist=True, initramfs=True, older=False, nouveau=False)
OTHER_BRANCH = {
    "kernel": KERNEL,
    "packages": {"nvidia-headless-535": [{"version": "1"}], "nvidia-headless-580": [{"version": "1"}]},
}
GPU_WORKLOADS = dim("__nvidia_driver_gpu_workloads", [], ["python3[4242] on /dev/nvidia0"])
MISMATCH_WAS = [
    "__nvidia_driver_probe is defined",
    "__nvidia_driver_probe.msg is defined",
    "__nvidia_driver_probe.ansible_facts.nvidia is not defined",
    "'mismatch' in __nvidia_driver_probe.msg | lower",
]
NVML_WORKS = {"__nvidia_driver_probe": {"ansible_facts": {"nvidia": {"driver_version": "535.183.06"}}}}
NO_RECORD = {"units": [], "node_label": {}, "daemonsets": []}

# gpu_tuning
BOOT_DIR = "/usr/local/lib/gpu-tuning"
BOOT_DIFFERS = [
    [],
    ["/etc/gpu-tuning.json"],
    [BOOT_DIR],
    [f"{BOOT_DIR}/nvml_session.py"],
    [f"{BOOT_DIR}/gpu_tuning_apply.py"],
    ["/usr/local/sbin/gpu-tuning-apply"],
    ["/etc/systemd/system/gpu-tuning.service"],
    ["gpu-tuning.service"],
]

# cuda_toolkit
TOOLKIT_DIFFERS = dim(
    "__cuda_toolkit_files_state", {"differ": []}, {"differ": ["/etc/apt/preferences.d/cuda-toolkit.pref"]},
    {"differ": ["/etc/profile.d/cuda.sh"]},
)  # fmt: skip
TOOLKIT_PACKAGES = {
    "cuda-toolkit-12-1": [{"version": "12.1.1-1"}],
    "cuda-nvcc-12-1": [{"version": "12.1.105-1"}],
}

# control_plane_metrics
METRICS_DIFFERS = [
    [],
    ["/usr/local/lib/control-plane-metrics"],
    ["/var/lib/control-plane-metrics"],
    ["/usr/local/lib/control-plane-metrics/control_plane_metrics.py"],
    ["/var/lib/control-plane-metrics/kubeadm_certificates.prom"],
    ["/etc/systemd/system/control-plane-metrics.service"],
    ["/etc/systemd/system/kubeadm-certificates-metrics.service"],
    ["/etc/systemd/system/kubeadm-certificates-metrics.timer"],
    ["control-plane-metrics.service"],
    ["kubeadm-certificates-metrics.timer"],
]

# model_sync: a model's version as read-published-state.yml noted it
MODEL_SYNC_BASE = {
    "inventory_hostname": "gpu-node-1",
    "model_sync_source_node": "gpu-node-1",
    "model_sync_model": {
        "name": "qwen2-tiny",
        "version": "v1",
        "source": "/srv/inbox/qwen2-tiny",
        "publisher_manifest": "/srv/inbox/qwen2-tiny.sha256",
    },
    "__model_sync_verified": SKIPPED,
    "ansible_check_mode": False,
}
MODEL_SYNC_STATES = [
    dim("__model_sync_in_place", True, False),
    dim("__model_sync_version_exists", True, False),
    dim("__model_sync_current_target", "v1", "v0", ""),
    CHECK,
]
MODEL_SYNC_CONVERGED = [
    {
        "__model_sync_in_place": True,
        "__model_sync_version_exists": True,
        "__model_sync_current_target": "v1",
        "ansible_check_mode": check,
    }
    for check in (False, True)
]
# gpu_health_agent: its read (install-agent.yml) of the settings directory, the settings, the token, the unit
# file and the unit, and of the cluster CA and the agent's copy (stat)
AGENT_CA, AGENT_CA_COPY = "/etc/kubernetes/pki/ca.crt", "/etc/gpu-health-agent/ca.crt"
AGENT_CA_READS = (
    {
        AGENT_CA: {"exists": True, "checksum": "c"},
        AGENT_CA_COPY: {
            "exists": True,
            "isreg": True,
            "checksum": "c",
            "pw_name": "root",
            "gr_name": "gpu-health-agent",
            "mode": "0640",
        },
    },
    {AGENT_CA: {"exists": True, "checksum": "c"}, AGENT_CA_COPY: {"exists": False}},
)
AGENT_DIFFERS = (
    [],
    ["/etc/gpu-health-agent"],
    ["/etc/gpu-health-agent/config.json"],
    ["/etc/gpu-health-agent/token"],
    ["/etc/systemd/system/gpu-health-agent.service"],
    ["gpu-health-agent.service"],
    ["/opt/gpu-health-agent"],
)
MODEL_SYNC_PACKAGES = dim(
    "__model_sync_packages_found", {"differ": []}, {"differ": ["rsync"]}, {"differ": ["clamav"]},
    {"differ": ["/opt/model-tools"]},
)  # fmt: skip
MODEL_SYNC_DIRECTORIES = dim(
    "__model_sync_found", *({"differ": d} for d in ([], ["/models"], ["/models/.incoming"],
                                                     ["/models/.admission"], ["/var/lib/modelsync/.ssh"])),
)  # fmt: skip

# ... and its read of the agent's account (/etc/passwd, /etc/group), its home and its code (find `code`)
AGENT_MODULE_UTILS = yaml.safe_load((ROOT / "roles/gpu_health_agent/vars/main.yml").read_text())[
    "__gpu_health_agent_module_utils"
]
AGENT_CODE = "/opt/gpu-health-agent/lib/ansible/module_utils"


def agent_found(drift: str = "") -> list[dict[str, Any]]:
    """find `code`'s files on a converged node, or with DRIFT: a file appended to, a directory's mode, the
    whole home not there."""
    if drift == "no home":
        return []
    owned = {"pw_name": "root", "gr_name": "root"}
    lib = "/opt/gpu-health-agent/lib"
    dirs = [
        {"path": path, "isdir": True, "isreg": False, "mode": "0700" if drift == "dir" else "0755"} | owned
        for path in (lib, f"{lib}/ansible", AGENT_CODE)
    ]
    files = []
    for name in AGENT_MODULE_UTILS:
        content = (ROOT / "module_utils" / name).read_bytes()
        if drift == "file" and not files:
            content += b"#\n"
        checksum = hashlib.sha1(content).hexdigest()
        found = {"path": f"{AGENT_CODE}/{name}", "isdir": False, "isreg": True, "mode": "0644"}
        files.append(found | owned | {"checksum": checksum})
    return dirs + files


def agent_install_read(differ: list[str], found: list[dict[str, Any]], account: bool) -> dict[str, Any]:
    passwd = "root:x:0:0:root:/root:/bin/bash\n" + (
        "gpu-health-agent:x:998:998::/nonexistent:/usr/sbin/nologin\n" if account else ""
    )
    return {
        "differ": differ,
        "found": {"code": {"files": found}},
        "slurp": {
            "/etc/passwd": {"content": base64.b64encode(passwd.encode()).decode()},
            "/etc/group": {"content": base64.b64encode(b"root:x:0:\n").decode()},
        },
    }


# common: its read (tasks/main.yml) of its files, edits, chrony's unit, /proc/swaps and cloud-init's
# directory, and packages.yml's read of the base packages
_COMMON_DROPIN = "/etc/cloud/cloud.cfg.d/99-llm-platform-hostname.cfg"
_COMMON_DROPIN_SHA1 = hashlib.sha1(
    yaml.safe_load((ROOT / "roles/common/vars/main.yml").read_text())[
        "__common_cloud_init_dropin_content"
    ].encode()
).hexdigest()
COMMON_CLOUD_INIT = (
    {"/etc/cloud/cloud.cfg.d": {"exists": False}, _COMMON_DROPIN: {"exists": False}},
    {"/etc/cloud/cloud.cfg.d": {"exists": True, "isdir": True},
     _COMMON_DROPIN: {"exists": True, "isreg": True, "checksum": _COMMON_DROPIN_SHA1, "uid": 0, "gid": 0,
                      "mode": "0644"}},
    {"/etc/cloud/cloud.cfg.d": {"exists": True, "isdir": True}, _COMMON_DROPIN: {"exists": False}},
)  # fmt: skip
_SWAPS_HEADER = "Filename\tType\tSize\tUsed\tPriority\n"
COMMON_SWAPS = tuple(
    {"/proc/swaps": {"content": base64.b64encode(text.encode()).decode()}}
    for text in (_SWAPS_HEADER, _SWAPS_HEADER + "/swapfile\tfile\t1024\t0\t-2\n")
)
CHRONY_UNITS = (
    {"chrony": {"LoadState": "loaded", "ConditionResult": "yes", "ConditionTimestampMonotonic": "5"}},
    {"chrony": {"LoadState": "loaded", "ConditionResult": "no", "ConditionTimestampMonotonic": "5"}},
)


def common_read(differ: list[str], **read: Any) -> dict[str, Any]:
    return {"__common_files_state": {"differ": differ, "stat": COMMON_CLOUD_INIT[1], "slurp": COMMON_SWAPS[0],
                                     "units": CHRONY_UNITS[0]} | read}  # fmt: skip


# ... and its read of the operators' accounts (/etc/passwd), homes and authorized_keys
_OPS_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOnCallKey000000000000000000000000000000000 oncall@example"
OPS = {"name": "ops", "comment": "On-call operator", "ssh_public_keys": [_OPS_KEY]}
OPS_LISTS = ([], [OPS], [OPS, {"name": "leaver", "state": "absent"}], [OPS, {"name": "ops", "sudo": False}])


def ops_read(
    differ: list[str] = (), shell: str = "/bin/bash", keys: str = _OPS_KEY + "\n", account: bool = True
):
    passwd = "root:x:0:0:root:/root:/bin/bash\n" + (
        f"ops:x:1001:1001:On-call operator:/home/ops:{shell}\n" if account else ""
    )
    b64 = {name: base64.b64encode(text.encode()).decode() for name, text in (("p", passwd), ("k", keys))}
    return common_read(
        list(differ),
        slurp={"/etc/passwd": {"content": b64["p"]}, "/home/ops/.ssh/authorized_keys": {"content": b64["k"]}},
        stat={"/home/ops": {"exists": True, "isdir": True}},
    )


# kubeadm_control_plane
OPERATOR = {"name": "alice", "home": "/home/alice", "group": "1001", "why": "no kubeconfig"}
# what kubeadm kubeconfig user registered: one failed, one issued
ISSUED = [{"item": OPERATOR, "rc": 1, "stdout": ""}, {"item": OPERATOR, "rc": 0, "stdout": ""}]

GATES = [
    Gate(
        "nvidia_driver", "main.yml", "prepare-driver.yml", True,
        [dim("nvidia_driver_source", "cuda_repo", "runfile"),
         dim("__nvidia_driver_packages_found", IN_PLACE, APT_DIFFERS, NVML_DIFFERS), FILES_STATES,
         dim("__nvidia_driver_reboot_reasons", [], ["nouveau is loaded"]), CHECK],
        [{"nvidia_driver_source": "cuda_repo", "__nvidia_driver_packages_found": IN_PLACE,
          "__nvidia_driver_files_state": CONVERGED_FILES, "ansible_check_mode": check}
         for check in (False, True)],
        DRIVER_BASE,
    ),
    Gate(
        "nvidia_driver", "main.yml", "install-driver.yml", True,
        [SOURCES, dim("nvidia_driver_ubuntu_repo_url", "", "http://lab-mirror:8080/ubuntu-restricted/"),
         CHECK, dim("__nvidia_driver_packages_found", IN_PLACE, APT_DIFFERS),
         dim("cuda_repository_pending", False, True),
         dim("ansible_facts", DRIVER_BASE["ansible_facts"], OTHER_BRANCH)],
        [{"nvidia_driver_source": "cuda_repo", "__nvidia_driver_packages_found": IN_PLACE,
          "cuda_repository_pending": False}],
        DRIVER_BASE,
    ),
    Gate(
        "nvidia_driver", "prepare-driver.yml", "install-prerequisites.yml", True,
        [SOURCES, dim("nvidia_driver_kernel_module_build_deps", True, False),
         dim("__nvidia_driver_packages_found", IN_PLACE, APT_DIFFERS, NVML_DIFFERS)],
        [{"nvidia_driver_source": "cuda_repo", "__nvidia_driver_packages_found": IN_PLACE}],
        DRIVER_BASE,
    ),
    Gate(
        "nvidia_driver", "prepare-driver.yml", "remove-nouveau.yml", True,
        [dim("nvidia_driver_source", "cuda_repo", "runfile"),
         dim("__nvidia_driver_packages_found", IN_PLACE, APT_DIFFERS), FILES_STATES],
        [{"nvidia_driver_source": "cuda_repo", "__nvidia_driver_packages_found": IN_PLACE,
          "__nvidia_driver_files_state": CONVERGED_FILES}],
        DRIVER_BASE,
    ),
    Gate(
        "nvidia_driver", "install-driver.yml", "install-driver-packages.yml",
        "nvidia_driver_source != 'runfile'",
        [SOURCES, dim("nvidia_driver_ubuntu_repo_url", "", "http://lab-mirror:8080/ubuntu-restricted/"),
         CHECK, dim("__nvidia_driver_packages_found", IN_PLACE, APT_DIFFERS),
         dim("cuda_repository_pending", False, True),
         dim("ansible_facts", DRIVER_BASE["ansible_facts"], OTHER_BRANCH)],
        [{"nvidia_driver_source": "cuda_repo", "__nvidia_driver_packages_found": IN_PLACE,
          "cuda_repository_pending": False, "ansible_check_mode": check} for check in (False, True)],
        DRIVER_BASE,
    ),
    Gate(
        "nvidia_driver", "install-driver.yml", "install-from-runfile.yml",
        "nvidia_driver_source == 'runfile'",
        [SOURCES, dim("__nvidia_driver_runfile_needed", False, True)],
        [{"nvidia_driver_source": "cuda_repo"}],
        DRIVER_BASE,
    ),
    Gate(
        "nvidia_driver", "install-driver.yml", "hold-driver-packages.yml",
        "nvidia_driver_source != 'runfile'",
        [SOURCES, CHECK, dim("__nvidia_driver_packages_found", IN_PLACE, APT_DIFFERS)],
        [{"nvidia_driver_source": "cuda_repo", "__nvidia_driver_packages_found": IN_PLACE}],
        DRIVER_BASE,
    ),
    Gate(
        "nvidia_driver", "main.yml", "reboot-if-needed.yml", True,
        [dim("__nvidia_driver_reboot_reasons", [], ["nouveau is loaded"], ["driver 535.183.06 installed"]),
         dim("nvidia_driver_reboot", True, False), CHECK, GPU_WORKLOADS],
        [{"__nvidia_driver_reboot_reasons": []}],
        DRIVER_BASE,
        "Reboot when nouveau is loaded or the driver changed",
    ),
    Gate(
        "nvidia_driver", "fix-version-mismatch.yml", "handle-version-mismatch.yml", MISMATCH_WAS,
        [[{}, NVML_WORKS,
          {"__nvidia_driver_probe": {"msg": "Failed to initialize NVML: Driver/library version mismatch"}},
          {"__nvidia_driver_probe": {"msg": "NVML Shared Library Not Found"}}],
         dim("nvidia_driver_reload_on_mismatch", True, False), GPU_WORKLOADS, CHECK],
        [NVML_WORKS],
        DRIVER_BASE,
    ),
    Gate(
        "nvidia_driver", "start-gpu-clients.yml", "put-back-gpu-clients.yml",
        "not __nvidia_driver_gpu_clients_restore | nvidia_driver_record_empty",
        [dim("__nvidia_driver_gpu_clients_restore", NO_RECORD,
             NO_RECORD | {"units": ["gpu-health-agent.service"]},
             {"units": [], "node_label": {"nvidia.com/gpu.present": "true"},
              "daemonsets": ["kube-system/nvidia-device-plugin-daemonset"]}),
         CHECK, dim("__nvidia_driver_gpu_clients_missing", [], ["monitoring/dcgm-exporter"])],
        [{"__nvidia_driver_gpu_clients_restore": NO_RECORD}],
        DRIVER_BASE,
    ),
    Gate(
        "nvidia_driver", "install-fabricmanager.yml", "install-fabricmanager-package.yml",
        "__nvidia_driver_fabricmanager_wanted | bool",
        [dim("__nvidia_driver_fabricmanager_wanted", False, True), CHECK],
        [{"__nvidia_driver_fabricmanager_wanted": False}],
        DRIVER_BASE,
    ),
    Gate(
        "gpu_tuning", "install-boot-unit.yml", "write-boot-unit.yml", "gpu_tuning_boot_unit",
        [dim("gpu_tuning_boot_unit", True, False),
         dim("__gpu_tuning_boot_state", *({"differ": d} for d in BOOT_DIFFERS)), CHECK],
        [{"gpu_tuning_boot_unit": True, "__gpu_tuning_boot_state": {"differ": []}}],
        {"ansible_check_mode": False},
    ),
    Gate(
        "gpu_tuning", "install-boot-unit.yml", "remove-boot-unit.yml", "not gpu_tuning_boot_unit",
        [dim("gpu_tuning_boot_unit", True, False),
         dim("ansible_facts", {"services": {}}, {"services": {"gpu-tuning.service": {"state": "stopped"}}})],
        [{"gpu_tuning_boot_unit": True}],
    ),
    Gate(
        "cuda_toolkit", "main.yml", "install-toolkit.yml", True,
        [TOOLKIT_DIFFERS, dim("__cuda_toolkit_packages_found", {"in_place": True}, {"in_place": False}),
         dim("cuda_repository_pending", False, True), CHECK,
         dim("ansible_facts", {"packages": {}}, {"packages": TOOLKIT_PACKAGES})],
        [{"__cuda_toolkit_files_state": {"differ": []}, "__cuda_toolkit_packages_found": {"in_place": True},
          "cuda_repository_pending": False, "ansible_check_mode": check} for check in (False, True)],
        {"ansible_check_mode": False, "ansible_facts": {"packages": TOOLKIT_PACKAGES}},
    ),
    Gate(
        "cuda_toolkit", "main.yml", "write-profile-script.yml", True,
        [TOOLKIT_DIFFERS, dim("cuda_toolkit_profile_script", True, False)],
        [{"__cuda_toolkit_files_state": {"differ": []}}],
    ),
    Gate(
        "control_plane_metrics", "main.yml", "install-exporter.yml", True,
        [dim("__control_plane_metrics_state", *({"differ": d} for d in METRICS_DIFFERS)), CHECK],
        [{"__control_plane_metrics_state": {"differ": []}}],
        {"ansible_check_mode": False},
    ),
    Gate(
        "model_sync", "admit-on-source.yml", "admit.yml", True, MODEL_SYNC_STATES, MODEL_SYNC_CONVERGED,
        MODEL_SYNC_BASE,
    ),
    Gate(
        "model_sync", "sync-to-node.yml", "sync.yml", True, MODEL_SYNC_STATES, MODEL_SYNC_CONVERGED,
        MODEL_SYNC_BASE | {"inventory_hostname": "gpu-node-2"},
    ),
    Gate(
        "kubeadm_control_plane", "operator-kubeconfigs.yml", "operator-kubeconfigs-issue.yml", True,
        [CHECK, dim("__kubeadm_control_plane_operators_to_issue", [], [OPERATOR], [OPERATOR, OPERATOR])],
        [{"__kubeadm_control_plane_operators_to_issue": []}, {}],
        {"ansible_check_mode": False},
        registered={"__kubeadm_control_plane_issued": {"results": ISSUED}},
    ),
    Gate(
        "etcd_backup", "tools.yml", "tools-copy.yml", True,
        [CHECK, dim("__etcd_backup_tools_stale", True, False)],
        [{"__etcd_backup_tools_stale": False}],
        {"ansible_check_mode": False},
        registered={"__etcd_backup_mount": {"path": "/tmp/etcd-image-x"}, "__etcd_backup_unmount": {"rc": 0}},
    ),
    Gate(
        "etcd_backup", "copy-to-node.yml", "ssh-key.yml", True,
        [CHECK, dim("__etcd_backup_ssh_key_in_place", True, False)],
        [{"__etcd_backup_ssh_key_in_place": True}],
        {"ansible_check_mode": False},
    ),
    Gate(
        "gpu_health_agent", "main.yml", "configure-service.yml", True,
        [dim("__gpu_health_agent_service_state",
             *({"differ": d, "stat": ca} for d in AGENT_DIFFERS for ca in AGENT_CA_READS)),
         CHECK, [{}, {"__gpu_health_agent_user_task": RAN}, {"__gpu_health_agent_user_task": SKIPPED}],
         dim("__gpu_health_agent_token_b64", "", "dG9rZW4=")],
        [{"__gpu_health_agent_service_state": {"differ": [], "stat": AGENT_CA_READS[0]},
          "__gpu_health_agent_user_task": SKIPPED, "ansible_check_mode": check} for check in (False, True)],
        {"ansible_check_mode": False, "__gpu_health_agent_token_b64": "dG9rZW4="},
    ),
    Gate(
        "model_sync", "prepare-nodes.yml", "make-nodes.yml", True,
        [MODEL_SYNC_PACKAGES, MODEL_SYNC_DIRECTORIES, dim("__model_sync_account_in_place", True, False),
         dim("inventory_hostname", "gpu-node-1", "gpu-node-2")],
        [{"__model_sync_packages_found": {"differ": []}, "__model_sync_found": {"differ": []},
          "__model_sync_account_in_place": True, "inventory_hostname": host}
         for host in ("gpu-node-1", "gpu-node-2")],
        {"model_sync_source_node": "gpu-node-1",
         "__model_sync_tools": {"venv": "/opt/model-tools", "requirements": ["picklescan==0.0.16"]}},
    ),
    Gate(
        "gpu_health_agent", "install-agent.yml", "install-code.yml", True,
        [dim("__gpu_health_agent_service_state",
             *(agent_install_read(differ, agent_found(drift), account)
               for differ in ([], ["/opt/gpu-health-agent"], ["/etc/gpu-health-agent/config.json"])
               for drift in ("", "file", "dir", "no home") for account in (True, False))),
         dim("gpu_health_agent_device_groups", [], ["video"])],
        [{"__gpu_health_agent_service_state": agent_install_read([], agent_found(), True)},
         {"__gpu_health_agent_service_state": agent_install_read(["/etc/gpu-health-agent/config.json"],
                                                                 agent_found(), True)}],
        {"__gpu_health_agent_module_utils_dir": str(ROOT / "module_utils")},
    ),
    Gate(
        "common", "main.yml", "names.yml", True,
        [dim("common_hostname_manage", True, False),
         [common_read(differ, stat=stat) for differ in ([], ["/etc/hostname"], ["/etc/hosts"])
          for stat in COMMON_CLOUD_INIT],
         dim("ansible_facts", {"nodename": "gpu-node-1"}, {"nodename": "localhost"})],
        [common_read([], stat=stat) | {"ansible_facts": {"nodename": "gpu-node-1"}}
         for stat in COMMON_CLOUD_INIT[:2]],
        {"inventory_hostname": "gpu-node-1"},
    ),
    Gate(
        "common", "main.yml", "time_sync.yml", True,
        [[common_read(differ, units=units)
          for differ in ([], ["/etc/chrony/chrony.conf"], ["chrony"], ["/etc/chrony/chrony.conf", "chrony"])
          for units in CHRONY_UNITS]],
        [common_read([], units=units) for units in CHRONY_UNITS],
    ),
    Gate(
        "common", "main.yml", "swap.yml", "common_swap_disable | bool",
        [dim("common_swap_disable", True, False),
         [common_read(differ, slurp=swaps) for differ in ([], ["/etc/fstab"]) for swaps in COMMON_SWAPS]],
        [common_read([]) | {"common_swap_disable": swap} for swap in (True, False)],
    ),
    Gate(
        "common", "main.yml", "ssh_hardening.yml", True,
        [[common_read(differ) for differ in ([], ["/etc/ssh/sshd_config"],
                                             ["/etc/ssh/sshd_config.d/10-common-hardening.conf"])],
         dim("__common_packages_found", {"in_place": True}, {"in_place": False})],
        [common_read([]) | {"__common_packages_found": {"in_place": True}}],
    ),
    Gate(
        "common", "main.yml", "ops_users.yml", True,
        [dim("common_ops_users", *OPS_LISTS),
         [ops_read(), ops_read(shell="/bin/sh"), ops_read(keys=""), ops_read(account=False),
          ops_read(["/etc/sudoers.d/ops-ops"])],
         dim("common_ops_sudo_nopasswd", True)],
        [ops_read() | {"common_ops_users": ops} for ops in OPS_LISTS[:2]],
    ),
]  # fmt: skip


# ------------------------------------------------------------------------------------------ the role's files
def load(role: str, path: str) -> Any:
    return yaml.safe_load((ROOT / "roles" / role / path).read_text())


@cache
def role_vars(role: str) -> dict[str, Any]:
    variables: dict[str, Any] = {}
    for path in ("defaults/main.yml", "vars/main.yml"):
        variables |= load(role, path) or {}
    return variables


def conditions(when: Any) -> list[Any]:
    return [] if when is None else list(when) if isinstance(when, list) else [when]


def flat(entries: list[dict[str, Any]], outer: list[Any], outer_vars: dict[str, Any]) -> list[dict[str, Any]]:
    """Every task, blocks flattened: its `when` with its blocks' before it, its vars with its blocks'."""
    out = []
    for entry in entries or []:
        when = outer + conditions(entry.get("when"))
        variables = outer_vars | (entry.get("vars") or {})
        if "block" in entry:
            for part in ("block", "rescue", "always"):
                out += flat(entry.get(part) or [], when, variables)
        else:
            out.append(entry | {"when": when, "vars": variables})
    return out


def gate_task(gate: Gate) -> dict[str, Any]:
    (task,) = [
        t
        for t in flat(load(gate.role, f"tasks/{gate.including}"), [], {})
        if t.get("ansible.builtin.include_tasks") == gate.included and t["name"].startswith(gate.task)
    ]
    return task


def imports_inlined(role: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ENTRIES with each import_tasks replaced by the imported file's tasks, as a block under the import's
    `when` and vars (as Ansible imports them)."""
    out = []
    for entry in entries or []:
        imported = entry.get("ansible.builtin.import_tasks")
        if imported:
            tasks = imports_inlined(role, load(role, f"tasks/{imported}"))
            out.append({"block": tasks, "when": entry.get("when"), "vars": entry.get("vars")})
        elif "block" in entry:
            parts = ("block", "rescue", "always")
            out.append(entry | {p: imports_inlined(role, entry[p]) for p in parts if p in entry})
        else:
            out.append(entry)
    return out


def inner_tasks(gate: Gate) -> list[dict[str, Any]]:
    """The included file's tasks (its imports' inlined); reboot-if-needed.yml's handler flush is its caller's
    too (test below)."""
    return [
        t
        for t in flat(imports_inlined(gate.role, load(gate.role, f"tasks/{gate.included}")), [], {})
        if t.get("ansible.builtin.meta") != "flush_handlers"
    ]


# ---------------------------------------------------------------------------------------- Ansible's verdicts
@cache
def loader() -> DataLoader:
    _load_plugins()
    for path in sorted(ROOT.glob("roles/*/filter_plugins")):
        filter_loader.add_directory(str(path))
    return DataLoader()


def templar(role: str, variables: dict[str, Any]) -> Templar:
    return Templar(loader=loader(), variables=_trusted(role_vars(role) | variables))


def holds(role: str, when: list[Any], variables: dict[str, Any]) -> bool:
    engine = templar(role, variables)
    return all(c if isinstance(c, bool) else engine.evaluate_conditional(trust_as_template(c)) for c in when)


def runs(role: str, task: dict[str, Any], variables: dict[str, Any]) -> bool:
    """Whether the task calls its module (or includes its file) at least once, with the state VARIABLES."""
    scope = variables | task["vars"]
    if "loop" not in task:
        return holds(role, task["when"], scope)
    items = templar(role, scope).template(_trusted(task["loop"]))
    loop_var = (task.get("loop_control") or {}).get("loop_var", "item")
    return any(holds(role, task["when"], scope | {loop_var: item}) for item in items)


def scenarios(gate: Gate) -> list[dict[str, Any]]:
    return [
        {key: value for part in combination for key, value in part.items()}
        for combination in itertools.product(*gate.dims)
    ]


def which_run(gate: Gate, state: dict[str, Any]) -> list[str]:
    """The tasks of the file that run in STATE, in order, each seeing what the ones before it registered."""
    variables = gate.base | state
    ran = []
    for task in inner_tasks(gate):
        did = runs(gate.role, task, variables)
        if did:
            ran.append(task["name"])
        if "register" in task:
            variables = variables | {
                task["register"]: RAN | gate.registered.get(task["register"], {}) if did else SKIPPED
            }
    return ran


@cache
def grid(gate_id: str) -> list[tuple[dict[str, Any], list[str]]]:
    """Each state of the grid where the file was entered before its gate, with the tasks that run there."""
    (gate,) = [g for g in GATES if g.id == gate_id]
    return [
        (state, which_run(gate, state))
        for state in scenarios(gate)
        if holds(gate.role, conditions(gate.was), gate.base | state)
    ]


# ------------------------------------------------------------------ gates whose grid is made with the role
# containerd
CERTS_D = "/etc/containerd/certs.d"
REGISTRY_MARKER = ".managed-by-ansible-role-containerd"
REGISTRY_CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
MIRRORS = [
    {"registry": "quay.io", "endpoints": ["https://lab-mirror:5000"], "ca": REGISTRY_CA},
    {"registry": "docker.io", "endpoints": ["https://m1.example", "https://m2.example"]},
]
CONTAINERD_BASE = {
    "ansible_search_path": [str(ROOT / "roles/containerd")],
    "ansible_managed": "Ansible managed",
    "ansible_check_mode": False,
}


def registry_node(mirrors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The find `registry` of a node where configure-registry-mirrors.yml wrote MIRRORS: each directory and
    file as its tasks write them (their own content vars, templated per entry)."""
    tasks = {t["name"]: t for t in flat(load("containerd", "tasks/configure-registry-mirrors.yml"), [], {})}
    entry = {"pw_name": "root", "gr_name": "root"}
    files = []
    for mirror in mirrors:
        base = f"{CERTS_D}/{mirror['registry']}"
        files.append(entry | {"path": base, "isdir": True, "isreg": False, "mode": "0755"})
        for name, leaf in (
            ("Mark the registry directories as the role's", REGISTRY_MARKER),
            ("Write the CA of each registry's mirrors", "ca.crt"),
            ("Write each registry's hosts.toml", "hosts.toml"),
        ):
            if leaf == "ca.crt" and "ca" not in mirror:
                continue
            content = templar("containerd", CONTAINERD_BASE | {"item": mirror}).template(
                _trusted(tasks[name]["vars"]["__containerd_registry_content"])
            )
            checksum = hashlib.sha1(content.encode()).hexdigest()
            files.append(entry | {"path": f"{base}/{leaf}", "isdir": False, "isreg": True, "mode": "0644",
                                  "checksum": checksum})  # fmt: skip
    return files


def registry_drifts(mirrors: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The converged find, then each drift the tasks put right, one at a time."""
    node = registry_node(mirrors)
    drifts = [node, [*node, {"path": f"{CERTS_D}/old.example/{REGISTRY_MARKER}", "isreg": True,
                             "isdir": False, "mode": "0644", "pw_name": "root", "gr_name": "root",
                             "checksum": "0"}]]  # fmt: skip
    for index, entry in enumerate(node):
        for change in ({"mode": "0700"}, {"pw_name": "nobody"}, {"checksum": "0"}, None):
            if change is None:
                drifts.append(node[:index] + node[index + 1 :])  # missing
            elif "checksum" not in change or "checksum" in entry:
                drifts.append([*node[:index], entry | change, *node[index + 1 :]])
    for mirror in mirrors:
        if "ca" not in mirror:  # a CA left behind by an entry that has none now
            drifts.append([*node, node[-1] | {"path": f"{CERTS_D}/{mirror['registry']}/ca.crt"}])
    return drifts


NOT_READ = {"differ": [], "found": {}}  # a read without the find `registry`: the file reads for itself
REGISTRY_STATES = [{"containerd_registry_mirrors": [], "__containerd_files_state": NOT_READ}] + [
    {"containerd_registry_mirrors": mirrors,
     "__containerd_files_state": {"differ": differ, "found": {"registry": {"files": files}}}}
    for mirrors in ([], MIRRORS, MIRRORS[:1], MIRRORS[1:])
    for differ in ([], [CERTS_D])
    for files in registry_drifts(mirrors)
]  # fmt: skip

KUBERNETES_VARS = yaml.safe_load((ROOT / "roles/kubernetes/defaults/main.yml").read_text()) | yaml.safe_load(
    (ROOT / "roles/kubernetes/vars/main.yml").read_text()
)
CONFIG_DIFFERS = [[], ["/etc/apt/preferences.d/containerd.pref"], [CERTS_D], ["/etc/containerd"],
                  ["/etc/containerd/conf.d"], ["/etc/containerd/config.toml"], ["/etc/crictl.yaml"],
                  ["containerd.service"]]  # fmt: skip

NVIDIA_PIN = "/etc/apt/preferences.d/nvidia-container-toolkit.pref"

# kubernetes_node
KUBECONFIG = "/etc/kubernetes/kubelet.conf"


def kube_read(differ: list[str], member: bool, active: str) -> dict[str, Any]:
    return {"differ": differ, "stat": {KUBECONFIG: {"exists": member}},
            "units": {"kubelet.service": {"ActiveState": active}}}  # fmt: skip


# {}: entered alone (tasks_from, playbooks/tasks/upgrade-kubernetes-node.yml), without the role's two reads
KUBE_READS = [{}] + [
    {"__kubernetes_node_pin_state": kube_read(differ, member, active),
     "__kubernetes_node_packages_found": found}
    for differ in ([], ["kubelet.service"], ["/etc/apt/preferences.d/kubernetes.pref"])
    for member in (False, True)
    for active in ("active", "activating", "inactive", "failed")
    for found in (IN_PLACE, APT_DIFFERS)
]  # fmt: skip
KUBE_CONVERGED = [
    {"__kubernetes_node_pin_state": kube_read([], member, active),
     "__kubernetes_node_repo": {"changed": False}, "__kubernetes_node_packages_found": IN_PLACE,
     "ansible_check_mode": check}
    for member, active in ((True, "active"), (True, "activating"), (False, "inactive"), (False, "active"))
    for check in (False, True)
]  # fmt: skip

GATES += [
    Gate(
        "containerd", "main.yml", "configure-registry-mirrors.yml", True,
        [REGISTRY_STATES],
        [{"containerd_registry_mirrors": m,
          "__containerd_files_state": {"differ": [], "found": {"registry": {"files": registry_node(m)}}}}
         for m in ([], MIRRORS, MIRRORS[:1])],
        CONTAINERD_BASE,
        registered={"__containerd_registry_found": {"found": {"registry": {"files": []}}}},
    ),
    Gate(
        "containerd", "main.yml", "configure-containerd.yml", True,
        [dim("__containerd_packages_found", {"in_place": True}, {"in_place": False}),
         dim("__containerd_files_state", *({"differ": d} for d in CONFIG_DIFFERS)),
         dim("__containerd_pending", False, True)],
        [{"__containerd_packages_found": {"in_place": True}, "__containerd_files_state": {"differ": d},
          "__containerd_pending": pending}
         for d in ([], ["/etc/apt/preferences.d/containerd.pref"], [CERTS_D]) for pending in (False, True)],
        CONTAINERD_BASE | KUBERNETES_VARS,
        registered={"__containerd_config_reread": {"differ": ["/etc/containerd/config.toml"]}},
    ),
    Gate(
        "containerd", "install-containerd.yml", "install-containerd-package.yml", True,
        [[{}, *({"__containerd_files_state": {"differ": d}}  # {}: entered alone, without the role's reads
                for d in ([], ["/etc/apt/preferences.d/containerd.pref"], [NVIDIA_PIN]))],
         dim("__containerd_packages_found", {"in_place": True}, {"in_place": False}),
         dim("__containerd_pending", False, True)],
        [{"__containerd_packages_found": {"in_place": True}, "__containerd_files_state": {"differ": d},
          "__containerd_pending": False} for d in ([], [NVIDIA_PIN])],
        CONTAINERD_BASE | KUBERNETES_VARS,
    ),
    Gate(
        "containerd", "add-nvidia-runtime.yml", "install-nvidia-toolkit.yml", True,
        [dim("__containerd_packages_found", {"in_place": True}, {"in_place": False}),
         dim("__containerd_files_state", {"differ": []}, {"differ": [NVIDIA_PIN]},
             {"differ": ["/etc/apt/preferences.d/containerd.pref"]}),
         CHECK, dim("__containerd_nvidia_repo", {"changed": False}, {"changed": True})],
        [{"__containerd_packages_found": {"in_place": True}, "__containerd_files_state": {"differ": d},
          "ansible_check_mode": check, "__containerd_nvidia_repo": {"changed": False}}
         for d in ([], ["/etc/apt/preferences.d/containerd.pref"]) for check in (False, True)],
        CONTAINERD_BASE | KUBERNETES_VARS,
    ),
    Gate(
        "kubernetes_node", "install-kube-packages.yml", "install-and-hold-kube-packages.yml", True,
        [KUBE_READS, CHECK,
         dim("__kubernetes_node_repo", {"changed": False}, {"changed": True})],
        KUBE_CONVERGED,
        {"ansible_check_mode": False} | KUBERNETES_VARS,
        registered={"__kubernetes_node_held": {"stdout_lines": []},
                    "__kubernetes_node_kubelet_conf": {"stat": {"exists": False}}},
    ),
]  # fmt: skip


@pytest.mark.parametrize("gate", GATES, ids=[g.id for g in GATES])
def test_the_gate_holds_wherever_a_task_of_its_file_would_run(gate: Gate) -> None:
    gate_when = gate_task(gate)["when"]
    for state, ran in grid(gate.id):
        assert not ran or holds(gate.role, gate_when, gate.base | state), (
            f"{gate.id}: the gate {gate_when} is false where {ran[0]!r} runs: {state}"
        )


@pytest.mark.parametrize("gate", GATES, ids=[g.id for g in GATES])
def test_every_task_of_a_gated_file_runs_somewhere_in_its_grid(gate: Gate) -> None:
    seen = {name for _, ran in grid(gate.id) for name in ran}
    assert {t["name"] for t in inner_tasks(gate)} - seen == set(), f"{gate.id}: the grid never reaches these"


@pytest.mark.parametrize("gate", GATES, ids=[g.id for g in GATES])
def test_a_converged_node_skips_the_file_at_its_gate(gate: Gate) -> None:
    for state in gate.converged:
        variables = gate.base | state
        if holds(gate.role, conditions(gate.was), variables):
            assert which_run(gate, state) == [], f"{gate.id}: not converged: {state}"
        assert not holds(gate.role, gate_task(gate)["when"], variables), f"{gate.id}: {state}"


def test_the_handlers_flush_before_the_reboot_file_whether_or_not_it_is_entered() -> None:
    """reboot-if-needed.yml flushes the handlers first (a new initramfs before a reboot; the persistenced
    restart while no reboot is pending): the role's block does it before its gated include, as the file did on
    every run."""
    first = load("nvidia_driver", "tasks/reboot-if-needed.yml")[0]
    assert first.get("ansible.builtin.meta") == "flush_handlers"
    block = next(t for t in load("nvidia_driver", "tasks/main.yml") if "always" in t)["block"]
    steps = [t.get("ansible.builtin.meta") or t.get("ansible.builtin.include_tasks") for t in block]
    assert steps[:2] == ["flush_handlers", "reboot-if-needed.yml"]
    assert block[1]["when"] == "__nvidia_driver_reboot_reasons | length > 0"


def test_a_register_of_a_gated_file_read_outside_it_is_read_as_skipped_where_it_was_not_entered() -> None:
    """The results an unentered file leaves undefined: the check mode repository verdict (nvidia_driver's
    vars) and the metrics exporter's handler read them as not changed."""
    for check in (False, True):
        driver = DRIVER_BASE | {"nvidia_driver_source": "ubuntu", "ansible_check_mode": check}
        assert (
            templar("nvidia_driver", driver).template(
                trust_as_template("{{ __nvidia_driver_repository_pending }}")
            )
            is False
        )
        (handler,) = load("control_plane_metrics", "handlers/main.yml")
        assert holds("control_plane_metrics", conditions(handler["when"]), {"ansible_check_mode": check})
