"""tests/lab/labctl.py: a node whose conmon and init were killed (the end of the session that started them) is
recorded exited the way conmon would have, so podman starts it again with its disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

import labctl


def test_what_is_left_is_killed_and_the_exit_file_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(labctl, "PODMAN_EXITS", tmp_path)
    init = subprocess.Popen(["sleep", "300"])
    state = {"Id": "e37f269f", "State": {"Status": "running", "ConmonPid": 999999999, "Pid": init.pid}}
    assert labctl.is_orphaned(state)  # its conmon is gone

    labctl.record_exit(state)

    assert init.wait(timeout=10) == -9  # SIGKILL
    assert (tmp_path / "e37f269f").read_text() == "137"


def test_a_live_container_is_not_orphaned() -> None:
    alive = {"Status": "running", "ConmonPid": 1, "Pid": 1}
    assert not labctl.is_orphaned({"State": alive})
    assert labctl.is_orphaned({"State": {**alive, "Status": "stopping"}})  # podman's stuck stop
    assert not labctl.is_orphaned({"State": {**alive, "Status": "exited"}})
