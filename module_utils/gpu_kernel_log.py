"""The Xids in the kernel log, read where the driver writes them, and what a GPU reset has cleared since.

The source is ``/dev/kmsg`` by default: the kernel's ring buffer, one record per read(2), each
"PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;MESSAGE" (Documentation/ABI/testing/dev-kmsg), readable with
CAP_SYSLOG where ``kernel.dmesg_restrict`` is 1 (Ubuntu's default). Any other path is read as a regular file
of lines in the same record format: that is how a lab whose nodes share one kernel points the product at the
kernel log its fake driver writes (inventories/lab, docs/lab.md), never at the machine's own.

A GPU reset (module gpu_reset) clears the GPU's Xids so far: it records the log's last sequence number per
GPU in CLEARED_FILE, and readers drop the Xids of that GPU at or below it. Sequence numbers restart with each
boot, and so does the kernel log; the file names the boot it belongs to (the kernel's boot id) and is ignored
after a reboot. Standard library only (the GPU health agent runs it).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

from ansible.module_utils.gpu_xid import XidEvent, parse_record

DEFAULT_KERNEL_LOG = "/dev/kmsg"
# Written by module gpu_reset (root), read by gpu_health and the agent: {"boot_id", "gpus": {bus id: seq}}.
CLEARED_FILE = "/var/lib/gpu-health/xid-cleared.json"
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
_READ_SIZE = 8192  # a /dev/kmsg record is at most 1 KiB of text plus its dictionary


def boot_id() -> str:
    try:
        with open(BOOT_ID_FILE, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _is_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


class KernelLog:
    """Incremental reader: each ``read_new()`` returns the Xids logged since the last call (the first call:
    every Xid still in the buffer). OSError when the source cannot be read (no /dev/kmsg, no CAP_SYSLOG); a
    regular file that does not exist yet is an empty log."""

    def __init__(self, path: str = DEFAULT_KERNEL_LOG) -> None:
        self.path = path
        self.device = _is_device(path)
        self._fd: int | None = None
        self._offset = 0
        self.last_seq: int | None = None
        # set when the file was found emptied since the last read (the lab's reboot): earlier Xids are gone
        self.restarted = False

    def _device_records(self) -> Iterator[str]:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        while True:
            try:
                chunk = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return  # nothing more for now
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten before we read them: go on with the next
                if exc.errno == errno.EINVAL:
                    continue  # a record longer than the buffer: skipped
                raise
            if not chunk:
                return
            yield chunk.decode("utf-8", "replace").split("\n", 1)[0]

    def _file_records(self) -> Iterator[str]:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 (closed below; a missing file is an empty log)
        except FileNotFoundError:
            self._offset = 0
            return  # nothing logged yet (the lab's file appears with its first record)
        with f:
            size = os.fstat(f.fileno()).st_size
            if size < self._offset:
                self._offset = 0  # truncated: a new boot of the lab's log
                self.restarted = True
            f.seek(self._offset)
            data = f.read()
        complete = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += complete
        yield from data[:complete].decode("utf-8", "replace").splitlines()

    def read_new(self) -> list[XidEvent]:
        records = self._device_records() if self.device else self._file_records()
        events = []
        for record in records:
            event = parse_record(record)
            seq = _seq(record)
            if seq is not None:
                self.last_seq = seq if self.last_seq is None else max(self.last_seq, seq)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _seq(record: str) -> int | None:
    head = record.split(";", 1)[0].split(",")
    return int(head[1]) if len(head) >= 3 and head[1].isdigit() and ";" in record else None


def read_log(path: str = DEFAULT_KERNEL_LOG) -> tuple[list[XidEvent], int | None]:
    """Every Xid in the log now, and the log's last sequence number (None when it has none)."""
    log = KernelLog(path)
    try:
        return log.read_new(), log.last_seq
    finally:
        log.close()


# --------------------------------------------------------------------------------- state across restarts
def read_boot_scoped(path: str) -> dict[str, Any]:
    """A JSON state file written in this boot ({} when absent, unreadable, or from another boot)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("boot_id") != boot_id():
        return {}
    return data


def write_boot_scoped(path: str, data: dict[str, Any], mode: int = 0o644) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({**data, "boot_id": boot_id()}, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_cleared(path: str | None = None) -> dict[str, int]:
    """GPU bus id -> the last kernel-log sequence number a reset cleared, for this boot."""
    gpus = read_boot_scoped(path or CLEARED_FILE).get("gpus") or {}
    return {str(bus): int(seq) for bus, seq in gpus.items() if isinstance(seq, int)}


def save_cleared(buses: Iterable[str], seq: int, path: str | None = None) -> None:
    gpus = load_cleared(path)
    gpus.update(dict.fromkeys(buses, int(seq)))
    write_boot_scoped(path or CLEARED_FILE, {"gpus": gpus})


def uncleared(events: Iterable[XidEvent], cleared: dict[str, int]) -> list[XidEvent]:
    """The events a reset has not cleared (an event without a sequence number always counts)."""
    return [e for e in events if e.seq is None or e.seq > cleared.get(e.pci_bus_id, -1)]
