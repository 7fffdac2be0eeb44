"""tests/lab/labctl.py: the lab's files (the fake GPUs, Ubuntu's apt stamp hook) go onto a node as one tar
stream (one `podman exec` a node instead of eight): every file in it, byte for byte, at its path and mode,
owned by root."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

LAB = Path(__file__).resolve().parents[1] / "lab"
sys.path.insert(0, str(LAB))

import labctl  # noqa: E402


def test_the_archive_holds_every_file_at_its_path_and_mode() -> None:
    with tarfile.open(fileobj=io.BytesIO(labctl.node_files_archive())) as archive:
        entries = {member.name: member for member in archive.getmembers()}
        wanted = {target.lstrip("/"): (source, mode) for source, target, mode in labctl.NODE_FILES}
        assert set(entries) == set(wanted)
        for name, (source, mode) in wanted.items():
            member = entries[name]
            assert member.isfile() and member.mode == mode and member.uid == 0 and member.gid == 0, name
            data = archive.extractfile(member).read()
            expected = labctl.NODE_FILE_TEXT["/" + name] if source is None else (LAB / source).read_bytes()
            assert data == expected, name


def test_the_control_commands_are_executable_and_the_unit_is_where_systemd_reads_it() -> None:
    modes = {target: mode for _, target, mode in labctl.NODE_FILES}
    assert modes["/usr/local/sbin/fake-nvml"] & 0o111 == 0o111
    assert modes["/usr/local/sbin/lab-kube-fault"] & 0o111 == 0o111
    assert f"/etc/systemd/system/{labctl.BOOT_UNIT}" in modes
    assert labctl.NODE_FILE_TEXT["/usr/local/sbin/fake-nvml"].startswith(b"#!/bin/sh\n")
    # as Ubuntu's update-notifier-common has it: the stamp apt's cache_valid_time reads
    hook = labctl.NODE_FILE_TEXT["/etc/apt/apt.conf.d/15update-stamp"]
    assert (
        b"APT::Update::Post-Invoke-Success" in hook and b"/var/lib/apt/periodic/update-success-stamp" in hook
    )
