"""tests/lab/labctl.py: the lab refuses a host disk its kubelets would evict from (imagefs.available<15% of
the disk's size, plus a test run's margin), after pruning old builds of its own images, and says the
numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

import labctl

GIB = 2**30
DISK = 252 * GIB  # the CI machine's disk
THRESHOLD = int(DISK * 0.15) + labctl.LAB_DISK_MARGIN


class Disk:
    """podman info and os.statvfs of its storage, free space going up by what each prune frees."""

    def __init__(self, free: int, freed_by_prune: int = 0) -> None:
        self.free = free
        self.freed_by_prune = freed_by_prune
        self.pruned: list[tuple[str, ...]] = []

    def podman(self, *args: str, **_: bool) -> subprocess.CompletedProcess[str]:
        if args[:2] == ("image", "prune"):
            self.pruned.append(args)
            self.free += self.freed_by_prune
        return subprocess.CompletedProcess(["podman", *args], 0, "/var/lib/containers/storage\n", "")

    def statvfs(self, path: str) -> os.statvfs_result:
        assert path == "/var/lib/containers/storage"
        block = 4096
        return os.statvfs_result((block, block, DISK // block, 0, self.free // block, 0, 0, 0, 0, 255))


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    found = Disk(free=0)
    monkeypatch.setattr(labctl, "podman", found.podman)
    monkeypatch.setattr(labctl.os, "statvfs", found.statvfs)
    return found


def test_enough_free_space_prunes_nothing(disk: Disk) -> None:
    disk.free = THRESHOLD + GIB
    labctl.ensure_disk_headroom()
    assert disk.pruned == []


def test_old_lab_image_builds_are_pruned_first_and_that_can_be_enough(disk: Disk) -> None:
    disk.free, disk.freed_by_prune = THRESHOLD - GIB, GIB
    labctl.ensure_disk_headroom()
    # dangling images only (no --all), and only the lab's own
    assert [p[-1] for p in disk.pruned] == ["label=llm-lab.inputs", f"label={labctl.images.LABEL}"]
    assert all("-a" not in p and "--all" not in p for p in disk.pruned)


def test_a_disk_under_the_kubelets_threshold_is_refused_with_the_numbers(disk: Disk) -> None:
    disk.free = 38 * GIB  # what CI found: the nodes went DiskPressure
    with pytest.raises(labctl.LabError) as refused:
        labctl.ensure_disk_headroom()
    message = str(refused.value)
    assert "has 38.0 GiB free" in message and f"needs {THRESHOLD / GIB:.1f} GiB" in message, message
    assert "imagefs.available threshold, 15% of the disk" in message and "DiskPressure" in message, message
    # and what can go: Go's build cache is the largest thing a first `make lab` leaves (docs/lab.md)
    assert "`go clean -cache`" in message and "`podman image prune`" in message, message
