"""module_utils.gpu_kernel_log: Xids read from /dev/kmsg or a file of its records, incrementally, and the
clear points a GPU reset leaves."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils import gpu_kernel_log
from ansible.module_utils.gpu_kernel_log import (
    KernelLog,
    load_cleared,
    read_log,
    save_cleared,
    uncleared,
)

BUS = "00000000:B1:00.0"


def record(seq: int, xid: int | None, usec: int = 1_000) -> str:
    message = (
        f"NVRM: Xid (PCI:0000:b1:00): {xid}, pid=42, name=python3, something"
        if xid is not None
        else "NVRM: GPU at PCI:0000:b1:00: GPU-1234"
    )
    return f"4,{seq},{usec},-;{message}\n"


def test_a_file_of_kmsg_records_is_read_incrementally(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text(record(1, 13) + record(2, None) + " SUBSYSTEM=pci\n" + record(3, 95))
    reader = KernelLog(str(log))
    assert [(e.xid, e.seq) for e in reader.read_new()] == [(13, 1), (95, 3)]
    assert reader.last_seq == 3
    assert reader.read_new() == []
    with log.open("a") as f:
        f.write(record(4, 79) + "4,5,9,-;NVRM: Xid (PCI:0000:b1:00): 4")  # the last line is half written
    assert [e.xid for e in reader.read_new()] == [79]
    with log.open("a") as f:
        f.write("8, pid=1, name=x, y\n")
    assert [e.xid for e in reader.read_new()] == [48]
    # a new boot of the lab's log: truncated, read from the start again
    log.write_text(record(6, 94))
    assert [e.xid for e in reader.read_new()] == [94] and reader.restarted
    events, last = read_log(str(log))
    assert [e.xid for e in events] == [94] and last == 6


def test_the_device_is_read_one_record_per_read_past_lost_records(monkeypatch: pytest.MonkeyPatch) -> None:
    lost = OSError(errno.EPIPE, "Broken pipe")
    reads: list[Any] = [record(10, 48).encode(), lost, record(12, 94).encode() + b" DEVICE=+pci\n"]
    opened: list[str] = []

    def fake_read(fd: int, size: int) -> bytes:
        item = reads.pop(0) if reads else BlockingIOError()
        if isinstance(item, BaseException):
            raise item
        return item

    monkeypatch.setattr(gpu_kernel_log, "_is_device", lambda path: True)
    monkeypatch.setattr(gpu_kernel_log.os, "open", lambda path, flags: opened.append(path) or 99)
    monkeypatch.setattr(gpu_kernel_log.os, "read", fake_read)
    monkeypatch.setattr(gpu_kernel_log.os, "close", lambda fd: None)
    reader = KernelLog()
    assert reader.path == "/dev/kmsg" and reader.device
    assert [(e.xid, e.seq) for e in reader.read_new()] == [(48, 10), (94, 12)]
    assert reader.read_new() == []
    reads.append(record(13, 95).encode())
    assert [e.xid for e in reader.read_new()] == [95]
    assert opened == ["/dev/kmsg"]  # opened once, kept open between reads
    reader.close()


def test_an_unreadable_log_raises_a_missing_file_is_empty(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        KernelLog(str(tmp_path)).read_new()  # a directory
    assert KernelLog(str(tmp_path / "missing")).read_new() == []


def test_a_reset_clears_its_gpus_xids_for_this_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    monkeypatch.setattr(gpu_kernel_log, "BOOT_ID_FILE", str(boot))
    cleared_file = str(tmp_path / "state" / "xid-cleared.json")
    log = tmp_path / "kmsg"
    log.write_text(record(1, 95) + record(2, 13).replace("b1:00", "17:00"))
    events, last = read_log(str(log))
    assert load_cleared(cleared_file) == {}
    save_cleared([BUS], last or 0, cleared_file)
    assert load_cleared(cleared_file) == {BUS: 2}
    assert [(e.xid, e.pci_bus_id) for e in uncleared(events, load_cleared(cleared_file))] == [
        (13, "00000000:17:00.0")
    ]
    with log.open("a") as f:
        f.write(record(3, 95))
    events, _ = read_log(str(log))
    assert [e.seq for e in uncleared(events, load_cleared(cleared_file))] == [2, 3]
    boot.write_text("boot-2\n")  # rebooted: the old clear points mean nothing
    assert load_cleared(cleared_file) == {}
