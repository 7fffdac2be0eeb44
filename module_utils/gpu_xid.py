"""Xid errors and what this platform does about each: the one table, the kernel-log line parser, and the rules
that turn a burst of Xids into one action. Pure functions, standard library only (the GPU health agent runs it
on nodes without Ansible; gpu_health and the remediation playbooks use it through the modules).

Sources (NVIDIA's own, checked 2026-12):

* The Xid catalog: "Analyzing Xid Errors with the Xid Catalog",
  https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html . Each row of ``XIDS`` copies its
  columns "Mnemonic", "Applies to A100", "Resolution Bucket (Immediate Action)" and "Resolution Bucket
  (Investigatory Action)"; ``action`` is what this platform does for it, derived from the immediate action
  (tests/unit/test_gpu_xid.py holds the derivation row by row). Rows whose description is "Unused" are left
  out; an Xid not in the table is UNKNOWN: a notice, never a cordon.
* The A100 memory error rules: "GPU Memory Error Management", Error Recovery and Response Flags
  (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html): a pending
  row remap needs a reset at the next chance while work continues; the recovery action flag (NVML field
  ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``) says none, GPU reset, node reboot, drain peer-to-peer, or drain
  and reset. The row-remap failure flag follows NVIDIA's RMA thresholds
  (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/rma-policy-thresholds-for-row-remapping.html).
* Bursts: NVIDIA groups the Xids of a node until three minutes of silence and judges them together
  (Fleet Intelligence, "XID Bursts", https://docs.nvidia.com/fleet-intel/user-guide/xid-bursts.md).

The field ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (id 230) and Xid 154 came with driver R565 (NVML's change
log, "Changes between v560 and v565"; DRAIN_AND_RESET with R570). nvidia-ml-py 12.535 does not define the
constant and a 535 driver does not report the field: there the action comes from the Xids and NVML's
row-remapping flags alone (module_utils/gpu_health_rules.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# ------------------------------------------------------------------------------------------------ actions
# What the platform does, least first; a GPU's action is its worst, the node's its worst GPU's.
NONE = "none"  # nothing: a metric (the application's own fault, or informational)
RESTART_APP = "restart_app"  # the application that hit it restarts: annotation + Node Event, no cordon
RESET_AT_DRAIN_WINDOW = "reset_at_drain_window"  # work goes on; reset the GPU at the next drain window
DRAIN_P2P = "drain_p2p"  # quiesce peer-to-peer: cordon, drain the GPU's pods and its NVLink peers'
RESET_GPU = "reset_gpu"  # cordon, drain the pods using the GPU, reset it, verify, uncordon
DRAIN_AND_RESET = "drain_and_reset"  # as reset_gpu, the pods of its NVLink peers drained too
REBOOT_NODE = "reboot_node"  # cordon, drain, reboot (reason in the node's log and an annotation)
REPAIR = "repair"  # cordon and stay cordoned; diagnostics for the vendor ticket
ACTIONS = (
    NONE,
    RESTART_APP,
    RESET_AT_DRAIN_WINDOW,
    DRAIN_P2P,
    RESET_GPU,
    DRAIN_AND_RESET,
    REBOOT_NODE,
    REPAIR,
)
_SEVERITY = {action: rank for rank, action in enumerate(ACTIONS)}

# The playbook that carries each action out (docs/runbook.md has a section per action).
ACTION_PLAYBOOK = {
    RESTART_APP: "",
    RESET_AT_DRAIN_WINDOW: "playbooks/remediate/gpu-reset.yml -e drain_window=true",
    DRAIN_P2P: "playbooks/remediate/gpu-reset.yml",
    RESET_GPU: "playbooks/remediate/gpu-reset.yml",
    DRAIN_AND_RESET: "playbooks/remediate/gpu-reset.yml",
    REBOOT_NODE: "playbooks/remediate/node-reboot.yml",
    REPAIR: "playbooks/remediate/collect-diagnostics.yml (the node stays cordoned)",
}
# Actions after which the GPU goes through gpu-reset.yml; those that also drain its NVLink peers' pods.
RESET_ACTIONS = (RESET_AT_DRAIN_WINDOW, DRAIN_P2P, RESET_GPU, DRAIN_AND_RESET)
PEER_DRAIN_ACTIONS = (DRAIN_P2P, DRAIN_AND_RESET)


def severity(action: str) -> int:
    return _SEVERITY[action]


def worst_action(actions: Iterable[str]) -> str:
    return max(actions, key=severity, default=NONE)


def cordons(action: str) -> bool:
    """Whether the action takes the node out of scheduling (the agent does it within the circuit breaker)."""
    return severity(action) >= severity(DRAIN_P2P)


def notifies(action: str) -> bool:
    """Whether the action is a notice: the node's annotation and a Node Event, the node stays in service."""
    return action in (RESTART_APP, RESET_AT_DRAIN_WINDOW)


# ----------------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class XidRule:
    mnemonic: str
    a100: bool  # the catalog's "Applies to A100"
    immediate: str  # "Resolution Bucket (Immediate Action)"; "(none)" where the catalog gives none
    investigatory: str  # "Resolution Bucket (Investigatory Action)"
    action: str  # what this platform does


def _x(mnemonic: str, a100: str, immediate: str, investigatory: str, action: str) -> XidRule:
    return XidRule(mnemonic, a100 == "YES", immediate, investigatory, action)


_A, _N = "YES", "NO"
# fmt: off
XIDS: dict[int, XidRule] = {
    8: _x("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    11: _x("ROBUST_CHANNEL_GR_ERROR_MISSING_HW", _A, "RESTART_APP", "CHECK_APP/CUDA", NONE),
    13: _x("ROBUST_CHANNEL_GR_EXCEPTION", _A, "RESTART_APP", "WORKFLOW_XID_13", NONE),
    14: _x("ROBUST_CHANNEL_FAKE_ERROR", _A, "IGNORE", "CONTACT_SUPPORT", NONE),
    25: _x("ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", _A, "RESTART_APP", "CHECK_APP/CUDA", NONE),
    31: _x("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", _A, "RESTART_APP", "WORKFLOW_XID_31", NONE),
    # the catalog: "primarily ... quality issues on PCI, ... generally not caused by user application actions"
    32: _x("ROBUST_CHANNEL_PBDMA_ERROR", _A, "RESTART_APP", "CHECK_APP/CUDA", RESTART_APP),
    37: _x("ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", _A, "IGNORE", "CHECK_APP/CUDA", NONE),
    38: _x("ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", _A, "IGNORE", "CONTACT_SUPPORT", NONE),
    39: _x("ROBUST_CHANNEL_CE0_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    40: _x("ROBUST_CHANNEL_CE1_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    41: _x("ROBUST_CHANNEL_CE2_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    43: _x("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", _A, "IGNORE", "CONTACT_SUPPORT", NONE),
    44: _x("ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", _A, "IGNORE", "CONTACT_SUPPORT", NONE),
    # "Solo: RESTART_FM; Not Solo: IGNORE (follow other Xid)": an application torn down after another error
    45: _x("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", _A, "WORKFLOW_XID_45", "RESTART_FM/IGNORE", NONE),
    46: _x("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", _A, "RESET_GPU", "CONTACT_SUPPORT", RESET_GPU),
    # WORKFLOW_XID_48: "Solo: RESET_GPU; w/ 63 or 64: DRAIN_AND_RESET"; on A100 94/95 follow and decide
    48: _x("ROBUST_CHANNEL_GPU_ECC_DBE", _A, "WORKFLOW_XID_48", "WORKFLOW_XID_48", RESET_GPU),
    54: _x("SILENT_RUNNING_PWR_REDUCED_CLOCKING", _A, "CHECK_MECHANICALS", "CONTACT_SUPPORT", REPAIR),
    60: _x("ROBUST_CHANNEL_SEC2_ERROR", _A, "RESTART_APP", "INVESTIGATE_SW", RESTART_APP),
    62: _x("PMU_HALT_ERROR", _A, "RESET_GPU", "CONTACT_SUPPORT", RESET_GPU),
    63: _x("INFOROM_DRAM_RETIREMENT_EVENT", _A, "IGNORE", "IGNORE", NONE),
    64: _x("INFOROM_DRAM_RETIREMENT_FAILURE", _A, "RESET_GPU", "CONTACT_SUPPORT", RESET_GPU),
    66: _x("ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", _A, "IGNORE", "INVESTIGATE_SW", NONE),
    67: _x("ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", _A, "IGNORE", "CONTACT_SUPPORT", NONE),
    68: _x("ROBUST_CHANNEL_NVDEC0_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    69: _x("ROBUST_CHANNEL_GR_CLASS_ERROR", _A, "RESTART_APP", "CHECK_APP/CUDA", NONE),
    70: _x("ROBUST_CHANNEL_CE3_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    71: _x("ROBUST_CHANNEL_CE4_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    72: _x("ROBUST_CHANNEL_CE5_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    # "A GPU reset or node reboot is needed"; the fault may be the peer's at the link's other end
    74: _x("NVLINK_ERROR", _A, "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", DRAIN_AND_RESET),
    75: _x("ROBUST_CHANNEL_CE6_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    76: _x("ROBUST_CHANNEL_CE7_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    77: _x("ROBUST_CHANNEL_CE8_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    78: _x("VGPU_START_ERROR", _A, "UPDATE_SWFW", "UPDATE_SWFW", RESTART_APP),
    79: _x("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", _A, "RESTART_BM", "CONTACT_SUPPORT", REBOOT_NODE),
    80: _x("PBDMA_PUSHBUFFER_CRC_MISMATCH", _A, "RESTART_APP", "CHECK_APP/CUDA", NONE),
    82: _x("ROBUST_CHANNEL_NVJPG0_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    83: _x("ROBUST_CHANNEL_NVDEC1_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    84: _x("ROBUST_CHANNEL_NVDEC2_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    85: _x("ROBUST_CHANNEL_CE9_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    86: _x("ROBUST_CHANNEL_OFA0_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    88: _x("ROBUST_CHANNEL_NVDEC3_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    89: _x("ROBUST_CHANNEL_NVDEC4_ERROR", _A, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    92: _x("EXCESSIVE_SBE_INTERRUPTS", _A, "IGNORE", "CONTACT_SUPPORT", NONE),
    93: _x("INFOROM_ERASE_LIMIT_EXCEEDED", _A, "IGNORE", "CONTACT_SUPPORT", NONE),
    # "contained to one application ... All other applications ... are unaffected. ... reset the GPU when
    # convenient": NVML's pending-remap flag asks for that reset
    94: _x("ROBUST_CHANNEL_CONTAINED_ERROR", _A, "RESTART_APP", "IGNORE (sympathetic)", RESTART_APP),
    95: _x("ROBUST_CHANNEL_UNCONTAINED_ERROR", _A, "RESET_GPU", "IGNORE (sympathetic)", RESET_GPU),
    96: _x("ROBUST_CHANNEL_NVDEC5_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    97: _x("ROBUST_CHANNEL_NVDEC6_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    98: _x("ROBUST_CHANNEL_NVDEC7_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    99: _x("ROBUST_CHANNEL_NVJPG1_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    100: _x("ROBUST_CHANNEL_NVJPG2_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    101: _x("ROBUST_CHANNEL_NVJPG3_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    102: _x("ROBUST_CHANNEL_NVJPG4_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    103: _x("ROBUST_CHANNEL_NVJPG5_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    104: _x("ROBUST_CHANNEL_NVJPG6_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    105: _x("ROBUST_CHANNEL_NVJPG7_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    106: _x("SMBPBI_TEST_MESSAGE", _A, "IGNORE", "IGNORE", NONE),
    107: _x("SMBPBI_TEST_MESSAGE_SILENT", _A, "IGNORE", "IGNORE", NONE),
    108: _x("NVLINK_REMOTE_TRANSLATION_ERROR", _A, "IGNORE", "XID_137_FLOW", NONE),
    109: _x("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", _A, "RESET_GPU", "CONTACT_SUPPORT", RESET_GPU),
    110: _x("SEC_FAULT_ERROR", _N, "RESET_GPU", "INVESTIGATE_SW", RESET_GPU),
    119: _x("GSP_RPC_TIMEOUT", _A, "RESET_GPU", "INVESTIGATE_SW", RESET_GPU),
    120: _x("GSP_ERROR", _A, "RESET_GPU", "INVESTIGATE_SW", RESET_GPU),
    121: _x("C2C_ERROR", _N, "IGNORE", "CONTACT_SUPPORT", NONE),
    126: _x("ROBUST_CHANNEL_CE10_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    127: _x("ROBUST_CHANNEL_CE11_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    128: _x("ROBUST_CHANNEL_CE12_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    129: _x("ROBUST_CHANNEL_CE13_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    130: _x("ROBUST_CHANNEL_CE14_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    131: _x("ROBUST_CHANNEL_CE15_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    132: _x("ROBUST_CHANNEL_CE16_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    133: _x("ROBUST_CHANNEL_CE17_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    134: _x("ROBUST_CHANNEL_CE18_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    135: _x("ROBUST_CHANNEL_CE19_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    136: _x("ALI_TRAINING_FAIL", _N, "RESET_GPU", "INVESTIGATE_LINK_SI", RESET_GPU),
    137: _x("NVLINK_PRIV_ERR", _A, "IGNORE", "XID_137_FLOW", NONE),
    139: _x("ROBUST_CHANNEL_OFA1_ERROR", _N, "RESTART_APP", "CONTACT_SUPPORT", RESTART_APP),
    140: _x("UNRECOVERABLE_ECC_ERROR_ESCAPE", _A, "RESET_GPU", "CONTACT_SUPPORT", RESET_GPU),
    141: _x("ROBUST_CHANNEL_FAST_PATH_ERROR", _N, "IGNORE", "CONTACT_SUPPORT", NONE),
    142: _x("ROBUST_CHANNEL_NVENC3_ERROR", _N, "CONTACT_SUPPORT", "", RESTART_APP),
    143: _x("GPU_INIT_ERROR", _N, "RESET_GPU", "CONTACT_SUPPORT", RESET_GPU),
    144: _x("NVLINK_SAW_ERROR", _N, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", DRAIN_AND_RESET),
    145: _x("NVLINK_RLW_ERROR", _N, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", DRAIN_AND_RESET),
    146: _x("NVLINK_TLW_ERROR", _N, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", DRAIN_AND_RESET),
    147: _x("NVLINK_TREX_ERROR", _N, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", DRAIN_AND_RESET),
    148: _x("NVLINK_NVLPW_CTRL_ERROR", _N, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", DRAIN_AND_RESET),
    149: _x("NVLINK_NETIR_ERROR", _N, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", DRAIN_AND_RESET),
    150: _x("NVLINK_MSE_ERROR", _N, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", DRAIN_AND_RESET),
    151: _x("ROBUST_CHANNEL_KEY_ROTATION_ERROR", _N, "RESTART_VM", "CONTACT_SUPPORT", RESTART_APP),
    152: _x("ROBUST_CHANNEL_DLA_SMMU_ERROR", _N, "IGNORE", "CONTACT_SUPPORT", NONE),
    153: _x("ROBUST_CHANNEL_DLA_TIMEOUT", _N, "IGNORE", "CONTACT_SUPPORT", NONE),
    # "summarizes the recovery action required for other Xids": the action is in its message (incidents())
    154: _x("GPU_RECOVERY_ACTION_CHANGED", _A, "XID_154", "N/A Informational only", NONE),
    155: _x("NVLINK_SW_DEFINED_ERROR", _N, "RESET_GPU", "INVESTIGATE_SW_USER", RESET_GPU),
    156: _x("RESOURCE_RETIREMENT_EVENT", _N, "RESET_GPU", "IGNORE", RESET_GPU),
    157: _x("RESOURCE_RETIREMENT_FAILURE", _N, "IGNORE", "CONTACT_SUPPORT", NONE),
    158: _x("GPU_FATAL_TIMEOUT", _A, "RESET_GPU", "CONTACT_SUPPORT", RESET_GPU),
    159: _x("ROBUST_CHANNEL_CHI_NON_DATA_ERROR", _N, "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO", RESTART_APP),
    160: _x("CHANNEL_RETIREMENT_EVENT", _N, "IGNORE", "INVESTIGATE_SW", NONE),
    161: _x("CHANNEL_RETIREMENT_FAILURE", _N, "IGNORE", "INVESTIGATE_SW", NONE),
    # no bucket in the catalog: "Either ECC should be enabled ... or boot re-attempted"
    168: _x("REDUCED_GPU_MEMORY_CAPACITY", _A, "(none)", "", REBOOT_NODE),
    # no bucket: "Additional to Xid 48 providing more details": judged as an Xid 48
    171: _x("UNCORRECTABLE_DRAM_ERROR", _A, "(none)", "", RESET_GPU),
    172: _x("UNCORRECTABLE_SRAM_ERROR", _A, "(none)", "", RESET_GPU),
}
# fmt: on
UNKNOWN = XidRule("UNKNOWN", False, "", "", RESTART_APP)


def rule_of(xid: int) -> XidRule:
    """The table's row, or UNKNOWN (a notice for a human, never a cordon)."""
    return XIDS.get(xid, UNKNOWN)


# The recovery action NVML reports (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, read by gpu_inventory; the
# value Xid 154 names): nvmlDeviceGpuRecoveryAction_t. Values this table does not know (IMEX domains, bus
# reset, system reboot on later GPUs) are taken as a reboot.
RECOVERY_ACTIONS = {
    0: ("NONE", NONE),
    1: ("GPU_RESET", RESET_GPU),
    2: ("NODE_REBOOT", REBOOT_NODE),
    3: ("DRAIN_P2P", DRAIN_P2P),
    4: ("DRAIN_AND_RESET", DRAIN_AND_RESET),
}


def recovery_action(value: int) -> str:
    return RECOVERY_ACTIONS.get(int(value), ("", REBOOT_NODE))[1]


def recovery_action_name(value: int) -> str:
    return RECOVERY_ACTIONS.get(int(value), (f"UNKNOWN_{value}", ""))[0]


# ------------------------------------------------------------------------------------------- the log line
# The kernel prints "NVRM: Xid (PCI:0000:b1:00): 95, pid=2871, name=python3, Uncontained: ...": the bus id
# without function (older drivers: without "PCI:"), the Xid, then (newer drivers) pid= and name=. /dev/kmsg
# prefixes each record with "PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;" (Documentation/ABI/testing/dev-kmsg).
_KMSG = re.compile(r"^(?P<priority>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<message>.*)$")
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?\): "
    r"(?P<xid>\d+)(?:,|$)(?P<rest>.*)$"
)
_PID = re.compile(r"^\s*pid=(?P<pid>[^,]*)(?:,\s*name=(?P<name>[^,]*))?,")
_RECOVERY_TO = re.compile(
    r"recovery action changed from 0x[0-9a-fA-F]+ \([^)]*\) to 0x(?P<value>[0-9a-fA-F]+)"
)


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci_bus_id: str  # normalised as NVML prints it: 00000000:B1:00.0
    text: str  # the message from "NVRM: Xid" on
    seq: int | None  # /dev/kmsg's sequence number (None from other sources)
    usec: int | None  # /dev/kmsg's timestamp: microseconds since boot
    pid: str | None
    process: str | None

    @property
    def rule(self) -> XidRule:
        return rule_of(self.xid)


def pci_bus_id(bus: str) -> str:
    """'0000:b1:00' -> '00000000:B1:00.0', the form NVML's busId and gpu_facts use."""
    domain, bus_number, device = bus.upper().split(":")
    return f"{int(domain, 16):08X}:{bus_number}:{device}.0"


def parse_record(line: str) -> XidEvent | None:
    """One kernel-log record or line to an XidEvent, or None when it is not an Xid."""
    seq = usec = None
    message = line.rstrip("\n")
    record = _KMSG.match(message)
    if record:
        seq, usec, message = int(record["seq"]), int(record["usec"]), record["message"]
    start = message.find("NVRM: Xid (")
    if start < 0:
        return None
    message = message[start:]
    found = _XID.match(message)
    if not found:
        return None
    pid = process = None
    who = _PID.match(found["rest"])
    if who:
        pid, process = who["pid"].strip(), (who["name"].strip() if who["name"] is not None else None)
    return XidEvent(int(found["xid"]), pci_bus_id(found["bus"]), message, seq, usec, pid, process)


def recovery_action_in(event: XidEvent) -> str | None:
    """The action an Xid 154 announces ("... recovery action changed from 0x0 (None) to 0x2 (...)")."""
    found = _RECOVERY_TO.search(event.text)
    return recovery_action(int(found["value"], 16)) if found else None


# -------------------------------------------------------------------------------------------- incidents
# Xids of one GPU less than this apart are one incident (NVIDIA's bursts: three minutes of silence).
INCIDENT_GAP_US = 180 * 1_000_000
# On A100 a double-bit error is logged as 48 (and 63 or 64 for the row), then 94 or 95 says whether it was
# contained: an incident with such a memory Xid and no containment Xid yet is judged only after this long.
SETTLE_US = 2 * 1_000_000
CONTAINMENT_XIDS = (94, 95)
MEMORY_XIDS = (48, 63, 64, 171, 172)
RECOVERY_ACTION_XID = 154


@dataclass
class Incident:
    pci_bus_id: str
    events: list[XidEvent] = field(default_factory=list)
    action: str = NONE
    why: str = ""
    settled: bool = True

    @property
    def xids(self) -> list[int]:
        return [e.xid for e in self.events]


def _judge(incident: Incident, now_usec: int | None, settle_us: int) -> None:
    xids = set(incident.xids)
    others = [e.rule.action for e in incident.events if e.xid not in (*MEMORY_XIDS, *CONTAINMENT_XIDS)]
    announced = [
        a for e in incident.events if e.xid == RECOVERY_ACTION_XID for a in [recovery_action_in(e)] if a
    ]
    contained = [x for x in CONTAINMENT_XIDS if x in xids]
    memory = [x for x in MEMORY_XIDS if x in xids]
    if announced:
        # the driver's own verdict on the incident (R565 and later); the application that hit a contained
        # or uncontained error died either way
        decided = announced[-1]
        why = f"Xid 154: recovery action {decided}"
        floor = [RESTART_APP] if contained else []
    elif contained:
        decided = worst_action(XIDS[x].action for x in contained)
        why = f"Xid {'/'.join(map(str, contained))} decides the memory error"
        floor = []
    elif memory:
        # WORKFLOW_XID_48: solo a reset; with the row remapping Xids 63/64 drain and reset
        decided = (
            DRAIN_AND_RESET
            if 48 in xids and ({63, 64} & xids)
            else worst_action(XIDS[x].action for x in memory)
        )
        why = f"Xid {'/'.join(map(str, memory))} without a containment Xid"
        floor = []
        last = max((e.usec for e in incident.events if e.usec is not None), default=None)
        if now_usec is not None and last is not None and now_usec - last < settle_us:
            incident.settled = False
    else:
        decided, why, floor = NONE, "", []
    incident.action = worst_action([decided, *floor, *others])
    if not why:
        rules = [
            f"Xid {e.xid} {e.rule.mnemonic} ({e.rule.immediate or 'not in the catalog'})"
            for e in incident.events
        ]
        why = "; ".join(dict.fromkeys(rules))
    incident.why = why


def incidents(
    events: Iterable[XidEvent], now_usec: int | None = None, settle_us: int = SETTLE_US
) -> list[Incident]:
    """The events grouped per GPU into bursts, each judged: its action and why, and whether it is settled
    (an incident still waiting for its containment Xid is not; ``now_usec``: the kernel log's clock now,
    None to judge everything as final). Sorted by GPU, then time."""
    by_gpu: dict[str, list[XidEvent]] = {}
    for event in events:
        by_gpu.setdefault(event.pci_bus_id, []).append(event)
    found: list[Incident] = []
    for bus in sorted(by_gpu):
        ordered = sorted(by_gpu[bus], key=lambda e: (e.usec is None, e.usec or 0, e.seq or 0))
        current: Incident | None = None
        last: int | None = None
        for event in ordered:
            if current is None or (
                event.usec is not None and last is not None and event.usec - last > INCIDENT_GAP_US
            ):
                current = Incident(bus)
                found.append(current)
            current.events.append(event)
            last = event.usec if event.usec is not None else last
    for incident in found:
        _judge(incident, now_usec, settle_us)
    return found
