"""tests/lab/labstate.py: the lab's state is per machine and each checkout reaches it as .lab; a checkout with
its own .lab directory, or LAB_STATE_DIR, keeps its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

import labstate


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("LAB_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))
    return tmp_path / "state-home" / "llm-lab"


def test_two_clones_share_the_machine_state(tmp_path: Path, machine: Path) -> None:
    first, second = tmp_path / "clone-1" / ".lab", tmp_path / "clone-2" / ".lab"
    first.parent.mkdir()
    second.parent.mkdir()
    assert labstate.state_dir(first) == machine.resolve()

    labstate.link_checkout(labstate.state_dir(first), first)
    (first / "ssh_config").write_text("Host gpu-node-1\n")

    assert first.is_symlink() and machine.is_dir()
    assert labstate.state_dir(second) == machine.resolve()
    labstate.link_checkout(labstate.state_dir(second), second)
    assert (second / "ssh_config").read_text() == "Host gpu-node-1\n"

    labstate.unlink_checkout(second)
    assert not second.exists() and (machine / "ssh_config").is_file()


def test_a_checkout_with_its_own_lab_directory_keeps_it(tmp_path: Path, machine: Path) -> None:
    own = tmp_path / "old-clone" / ".lab"
    own.mkdir(parents=True)
    assert labstate.state_dir(own) == own.resolve()
    labstate.link_checkout(labstate.state_dir(own), own)
    assert own.is_dir() and not own.is_symlink()
    labstate.unlink_checkout(own)  # a directory, not a link: left alone
    assert own.is_dir()


def test_lab_state_dir_names_the_state_and_no_link_is_made(
    tmp_path: Path, machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv("LAB_STATE_DIR", str(elsewhere))
    link = tmp_path / "clone" / ".lab"
    link.parent.mkdir()
    assert labstate.state_dir(link) == elsewhere.resolve()
    labstate.link_checkout(labstate.state_dir(link), link)
    assert elsewhere.is_dir() and not link.exists() and not machine.exists()
