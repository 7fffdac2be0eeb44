"""tests/lab/exec_heal.py: runc's refusal of an exec whose name=systemd cgroup is gone is recognised and the
cgroup made again; nothing else is touched."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

import exec_heal

REFUSAL = (
    "Error: runc: exec failed: unable to start container process: error adding pid 17651 to cgroups: "
    "failed to write 17651: openat2 {parent}/libpod-e37f269f/cgroup.procs: no such file or directory: "
    "OCI runtime attempted to invoke a command that was not found"
)


def test_the_missing_cgroup_is_made_again(tmp_path: Path) -> None:
    assert exec_heal.heal(REFUSAL.format(parent=tmp_path), parent=tmp_path)
    assert (tmp_path / "libpod-e37f269f").is_dir()
    # made already: still healed (the retry decides)
    assert exec_heal.heal(REFUSAL.format(parent=tmp_path), parent=tmp_path)


def test_other_failures_and_other_places_are_left_alone(tmp_path: Path) -> None:
    assert not exec_heal.heal("Error: no container with name or ID gpu-node-9 found", parent=tmp_path)
    assert not exec_heal.heal(None, parent=tmp_path)
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    assert not exec_heal.heal(REFUSAL.format(parent=elsewhere), parent=tmp_path)
    assert not (elsewhere / "libpod-e37f269f").exists()
    not_a_container = REFUSAL.format(parent=tmp_path).replace("libpod-e37f269f", "system.slice")
    assert not exec_heal.heal(not_a_container, parent=tmp_path)
    assert list(tmp_path.iterdir()) == [elsewhere]
