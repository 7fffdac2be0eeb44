"""module_utils.gpu_xid: the one table from Xid to action (NVIDIA's Xid catalog), the kernel-log line parser
and the incident rules (containment, Xid 154), on plain values."""

from __future__ import annotations

import pytest
from ansible.module_utils.gpu_xid import (
    ACTIONS,
    DRAIN_AND_RESET,
    DRAIN_P2P,
    NONE,
    REBOOT_NODE,
    REPAIR,
    RESET_AT_DRAIN_WINDOW,
    RESET_GPU,
    RESTART_APP,
    XIDS,
    XidEvent,
    cordons,
    incidents,
    notifies,
    parse_record,
    recovery_action,
    rule_of,
    worst_action,
)

# What this platform does for each Xid the issue names: the table must keep saying it.
ISSUE_XIDS = {
    13: NONE,  # application: Graphics Engine Exception
    31: NONE,  # application: GPU memory page fault
    43: NONE,  # application: GPU stopped processing (user app fault)
    45: NONE,  # preemptive cleanup after another error: follow the other Xid
    48: RESET_GPU,  # double-bit ECC, alone (with 94/95 the containment Xid decides)
    63: NONE,  # row remap recorded: NVML's pending flag asks for the reset
    64: RESET_GPU,  # row remap failed: NVML's failure flag makes it a repair
    74: DRAIN_AND_RESET,  # NVLink error
    79: REBOOT_NODE,  # fallen off the bus
    92: NONE,  # high single-bit rate: corrected errors
    94: RESTART_APP,  # contained memory error
    95: RESET_GPU,  # uncontained memory error
}
APP_INVESTIGATIONS = {"CHECK_APP/CUDA", "WORKFLOW_XID_13", "WORKFLOW_XID_31"}


@pytest.mark.parametrize(("xid", "action"), sorted(ISSUE_XIDS.items()))
def test_issue_xids_map_to_their_action(xid: int, action: str) -> None:
    assert XIDS[xid].action == action
    assert XIDS[xid].a100 is True


def test_every_xid_in_the_table_maps_to_an_action_the_platform_knows() -> None:
    assert len(XIDS) >= 90
    for xid, rule in XIDS.items():
        assert rule.action in ACTIONS, xid
        assert rule.mnemonic and rule.mnemonic == rule.mnemonic.upper(), xid
        assert isinstance(rule.a100, bool), xid
        assert rule.immediate, xid


@pytest.mark.parametrize("xid", sorted(XIDS))
def test_every_xid_follows_the_catalogs_immediate_action(xid: int) -> None:
    """The platform's action follows NVIDIA's "Resolution Bucket (Immediate Action)" column, row by row; the
    rows where it adds to the catalog say why (the workflows, and Xid 32, a PCIe fault not the app's)."""
    rule = XIDS[xid]
    bucket = rule.immediate
    if bucket == "RESET_GPU":
        assert rule.action == RESET_GPU
    elif bucket == "RESTART_BM":
        assert rule.action == REBOOT_NODE
    elif bucket == "IGNORE":
        assert rule.action == NONE
    elif bucket == "RESTART_APP":
        if rule.investigatory in APP_INVESTIGATIONS and xid != 32:
            assert rule.action == NONE, "the application's own fault: nothing to do on the node"
        else:
            assert rule.action == RESTART_APP, "the GPU was involved: an Event, no cordon"
    elif bucket == "CHECK_MECHANICALS":
        assert rule.action == REPAIR
    elif bucket in ("WORKFLOW_XID_45", "XID_154"):
        assert rule.action == NONE  # 45 follows the other Xid; 154's action is in its message
    elif bucket == "WORKFLOW_XID_48":
        assert rule.action == RESET_GPU  # solo; with 63/64 drain and reset, with 94/95 the containment
    elif bucket in ("WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR"):
        assert rule.action == DRAIN_AND_RESET
    elif bucket in ("UPDATE_SWFW", "CONTACT_SUPPORT", "CHECK_UVM", "RESTART_VM"):
        assert rule.action == RESTART_APP  # a human looks; nothing on the node itself to do now
    elif bucket == "(none)":
        # rows the catalog gives no bucket: 168 asks for ECC on or a new boot; 171/172 detail an Xid 48
        assert rule.action == {168: REBOOT_NODE, 171: RESET_GPU, 172: RESET_GPU}[xid]
    else:
        pytest.fail(f"Xid {xid}: catalog bucket {bucket!r} has no rule here")


def test_catalog_actions_that_never_cordon() -> None:
    for xid, rule in XIDS.items():
        if rule.immediate in ("IGNORE", "RESTART_APP", "WORKFLOW_XID_45"):
            assert not cordons(rule.action), f"Xid {xid} ({rule.immediate}) must never cordon a node"


def test_actions_are_ordered_by_what_they_take() -> None:
    assert ACTIONS == (
        NONE,
        RESTART_APP,
        RESET_AT_DRAIN_WINDOW,
        DRAIN_P2P,
        RESET_GPU,
        DRAIN_AND_RESET,
        REBOOT_NODE,
        REPAIR,
    )
    assert [a for a in ACTIONS if cordons(a)] == [DRAIN_P2P, RESET_GPU, DRAIN_AND_RESET, REBOOT_NODE, REPAIR]
    assert [a for a in ACTIONS if notifies(a)] == [RESTART_APP, RESET_AT_DRAIN_WINDOW]
    assert worst_action([]) == NONE
    assert worst_action([RESTART_APP, REPAIR, RESET_GPU]) == REPAIR


def test_unknown_xid_is_a_notice_not_a_cordon() -> None:
    rule = rule_of(999)
    assert rule.mnemonic == "UNKNOWN" and rule.action == RESTART_APP and rule.a100 is False


@pytest.mark.parametrize(
    ("value", "action"),
    [(0, NONE), (1, RESET_GPU), (2, REBOOT_NODE), (3, DRAIN_P2P), (4, DRAIN_AND_RESET), (7, REBOOT_NODE)],
)
def test_nvml_recovery_action_values(value: int, action: str) -> None:
    assert recovery_action(value) == action


# ------------------------------------------------------------------------------------------- the log line


@pytest.mark.parametrize(
    ("line", "xid", "bus", "pid", "name", "seq", "usec"),
    [
        # /dev/kmsg records: PRIORITY,SEQ,MICROSECONDS,FLAGS;MESSAGE
        (
            "4,1520,83736541234,-;NVRM: Xid (PCI:0000:b1:00): 95, pid=2871, name=python3, "
            "Uncontained: FBHUB. RST: Yes, D-RST: No",
            95,
            "00000000:B1:00.0",
            "2871",
            "python3",
            1520,
            83736541234,
        ),
        (
            "3,77,1000,-;NVRM: Xid (PCI:0000:17:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.",
            79,
            "00000000:17:00.0",
            "'<unknown>'",
            "<unknown>",
            77,
            1000,
        ),
        # dmesg / journalctl -k text, and older drivers without pid/name or the PCI: prefix
        (
            "[ 8372.123456] NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for "
            "remapping, reset gpu to activate.",
            63,
            "00000000:10:1C.0",
            "1896",
            None,
            None,
            None,
        ),
        (
            "Nov 22 18:29:55 host kernel: [ 966.503025] NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask "
            "00000120, intr 10000000",
            31,
            "00000000:01:00.0",
            None,
            None,
            None,
            None,
        ),
    ],
)
def test_kernel_log_lines_in_the_real_formats(
    line: str, xid: int, bus: str, pid: str | None, name: str | None, seq: int | None, usec: int | None
) -> None:
    event = parse_record(line)
    assert event is not None
    assert (event.xid, event.pci_bus_id, event.pid, event.process, event.seq, event.usec) == (
        xid,
        bus,
        pid,
        name,
        seq,
        usec,
    )
    assert event.text.startswith("NVRM: Xid (")


@pytest.mark.parametrize(
    "line",
    [
        "6,1,2,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.06",
        " SUBSYSTEM=pci",  # a /dev/kmsg continuation line
        "4,9,9,-;nvidia-nvswitch0: SXid (PCI:0000:c4:00.0): 12028, Non-fatal, Link 33",
        "",
    ],
)
def test_other_lines_are_no_xid(line: str) -> None:
    assert parse_record(line) is None


# ---------------------------------------------------------------------------------------------- incidents
S = 1_000_000  # microseconds


def ev(xid: int, at_s: float, bus: str = "00000000:B1:00.0", text: str = "") -> XidEvent:
    return XidEvent(xid, bus, text or f"NVRM: Xid (PCI:0000:b1:00): {xid}, x", 0, int(at_s * S), None, None)


def actions(events: list[XidEvent], now_s: float = 1000) -> dict[str, str]:
    return {i.pci_bus_id: i.action for i in incidents(events, now_usec=int(now_s * S))}


def test_contained_error_restarts_the_app_only() -> None:
    # A100 double-bit error contained to one process: 48, the row marked for remapping (63), then 94
    assert actions([ev(48, 10), ev(63, 10.001), ev(94, 10.002)]) == {"00000000:B1:00.0": RESTART_APP}


def test_uncontained_error_needs_the_reset() -> None:
    assert actions([ev(48, 10), ev(63, 10.001), ev(95, 10.002)]) == {"00000000:B1:00.0": RESET_GPU}


def test_double_bit_error_without_containment_follows_the_catalog_workflow() -> None:
    assert actions([ev(48, 10)]) == {"00000000:B1:00.0": RESET_GPU}  # solo
    assert actions([ev(48, 10), ev(63, 10.001)]) == {"00000000:B1:00.0": DRAIN_AND_RESET}  # with 63/64


def test_a_memory_xid_waits_for_its_containment_xid() -> None:
    (incident,) = incidents([ev(48, 10)], now_usec=int(10.5 * S))
    assert not incident.settled  # the driver logs 94/95 right after 48: not judged yet
    (incident,) = incidents([ev(48, 10), ev(94, 10.1)], now_usec=int(10.5 * S))
    assert incident.settled and incident.action == RESTART_APP
    (incident,) = incidents([ev(48, 10)], now_usec=int(13 * S))
    assert incident.settled and incident.action == RESET_GPU


def test_application_xids_do_nothing() -> None:
    assert actions([ev(13, 1), ev(31, 2), ev(43, 3), ev(45, 4)]) == {"00000000:B1:00.0": NONE}


def test_recovery_action_changed_decides() -> None:
    text = (
        "NVRM: Xid (PCI:0000:b1:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
        "(Node Reboot Required)"
    )
    assert actions([ev(94, 10), ev(154, 10.01, text=text)]) == {"00000000:B1:00.0": REBOOT_NODE}
    back = text.replace("from 0x0 (None) to 0x2 (Node Reboot Required)", "from 0x1 (GPU Reset) to 0x0 (None)")
    assert actions([ev(154, 10, text=back)]) == {"00000000:B1:00.0": NONE}


def test_gpus_and_bursts_are_judged_apart() -> None:
    got = incidents([ev(13, 1), ev(95, 1, bus="00000000:17:00.0"), ev(79, 500)], now_usec=1000 * S)
    assert [(i.pci_bus_id, i.action, [e.xid for e in i.events]) for i in got] == [
        ("00000000:17:00.0", RESET_GPU, [95]),
        ("00000000:B1:00.0", NONE, [13]),
        ("00000000:B1:00.0", REBOOT_NODE, [79]),  # more than 3 min after the last: a burst of its own
    ]
