"""tests/lab/labctl.py: `labctl up` on a running lab asks podman less often, checking the same: the nodes'
boot state, files and DNS in the exec that installs the files, the containers' states in one inspect, the
images' labels and digests from one listing. What a broken lab shows (a node still booting, a node that does
not resolve the mirror, a missing container) still takes the old, full path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

import images
import labctl

NODE = labctl.NODES[0]


class Podman:
    """labctl.podman's stand-in: records each call, answers from ANSWERS (args prefix -> (rc, stdout))."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str]] | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.answers = answers or {}

    def __call__(self, *args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess:
        self.calls.append(args)
        for prefix, (rc, out) in self.answers.items():
            if args[: len(prefix)] == prefix:
                if check and rc:
                    raise labctl.LabError(f"podman {args} failed")
                return subprocess.CompletedProcess(args, rc, out, "")
        raise AssertionError(f"unexpected podman {args}")


@pytest.fixture
def node_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """`podman exec -i NODE sh -c SCRIPT` run here, with stand-ins for the node's systemctl, tar, getent:
    the real script, its answers set through the returned dict."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "systemctl": (
            '[ "$1" = is-system-running ] || exit 0\necho "$FAKE_STATE"\n[ "$FAKE_STATE" = running ]'
        ),
        "tar": 'cat >"$FAKE_TAR_OUT"; [ "$FAKE_TAR" != fail ] || { echo "tar: broken" >&2; exit 2; }',
        "getent": '[ "$FAKE_DNS" = yes ]',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    answers = {
        "FAKE_STATE": "running",
        "FAKE_DNS": "yes",
        "FAKE_TAR": "",
        "FAKE_TAR_OUT": str(tmp_path / "tar"),
    }
    real_run = subprocess.run

    def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        assert args[:4] == ["podman", "exec", "-i", NODE.name], args
        env = {**kwargs.pop("env"), **answers, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        return real_run(args[4:], env=env, **kwargs)

    monkeypatch.setattr(labctl.subprocess, "run", run)
    return answers


def test_one_exec_reads_the_boot_installs_the_files_and_asks_the_dns(
    node_commands: dict[str, str], tmp_path: Path
) -> None:
    found = labctl.install_node_files(NODE)
    assert found is not None and found["systemd"] == "running" and found["dns"] == "yes"
    assert found["gpu-state"] in ("yes", "no")
    assert (tmp_path / "tar").read_bytes() == labctl.node_files_archive()  # the files went in

    node_commands.update(FAKE_STATE="degraded", FAKE_DNS="no")  # a degraded node is up, as before
    found = labctl.install_node_files(NODE)
    assert found is not None and found["systemd"] == "degraded" and found["dns"] == "no"


def test_a_booting_node_gets_nothing_installed(node_commands: dict[str, str], tmp_path: Path) -> None:
    node_commands["FAKE_STATE"] = "starting"
    assert labctl.install_node_files(NODE) is None
    assert not (tmp_path / "tar").exists()


def test_a_failed_install_is_an_error(node_commands: dict[str, str]) -> None:
    node_commands["FAKE_TAR"] = "fail"
    with pytest.raises(labctl.LabError, match="installing the lab's node files failed: tar: broken"):
        labctl.install_node_files(NODE)


def test_a_booting_node_is_waited_for_then_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [None, {"systemd": "running", "gpu-state": "no", "dns": "no"}]
    calls: list[str] = []
    monkeypatch.setattr(labctl, "install_node_files", lambda node: calls.append("install") or answers.pop(0))
    monkeypatch.setattr(labctl, "wait_for_systemd", lambda node: calls.append("wait for systemd"))
    monkeypatch.setattr(labctl, "wait_for_ssh", lambda node: calls.append("ssh"))
    podman = Podman({("exec", NODE.name, "fake-nvml", "init"): (0, "")})
    monkeypatch.setattr(labctl, "podman", podman)

    assert labctl.bring_up_node(NODE) is False  # it does not resolve the mirror
    assert calls == ["install", "wait for systemd", "install", "ssh"]
    assert podman.calls == [("exec", NODE.name, "fake-nvml", "init", "--shape", labctl.GPU_SHAPE,
                             "--host", NODE.name)]  # fmt: skip


def test_the_dns_check_reuses_the_nodes_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    podman = Podman()
    monkeypatch.setattr(labctl, "podman", podman)
    labctl.ensure_network_dns({node.name: True for node in labctl.NODES})
    assert podman.calls == []


def test_a_node_that_did_not_resolve_starts_the_repair(monkeypatch: pytest.MonkeyPatch) -> None:
    podman = Podman({("network", "reload"): (0, ""), ("exec",): (0, "10.89.42.2 lab-mirror")})
    monkeypatch.setattr(labctl, "podman", podman)
    monkeypatch.setattr(labctl, "aardvark_alive", lambda: True)
    resolved = {node.name: True for node in labctl.NODES} | {NODE.name: False}
    labctl.ensure_network_dns(resolved)
    assert ("network", "reload", "--all") in podman.calls
    assert [call[1] for call in podman.calls if call[0] == "exec"] == [node.name for node in labctl.NODES]


def test_container_states_come_from_one_inspect_each_used_once(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [labctl.MIRROR_NAME, *(node.name for node in labctl.NODES)]
    records = [{"Name": name, "State": {"Status": "running"}} for name in names]
    podman = Podman({("container", "inspect", *names): (0, json.dumps(records)),
                     ("container", "inspect", NODE.name): (0, json.dumps(records[1:2]))})  # fmt: skip
    monkeypatch.setattr(labctl, "podman", podman)
    monkeypatch.setattr(labctl, "PREFETCHED_STATES", {})

    labctl.prefetch_container_states(names)
    assert [labctl.container_state(name)["Name"] for name in names] == names
    assert len(podman.calls) == 1
    assert labctl.container_state(NODE.name)["Name"] == NODE.name  # asked again: podman again
    assert len(podman.calls) == 2


def test_a_missing_container_makes_each_inspected_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [labctl.MIRROR_NAME, NODE.name]
    podman = Podman(
        {("container", "inspect", *names): (125, "[]"), ("container", "inspect", NODE.name): (1, "")}
    )
    monkeypatch.setattr(labctl, "podman", podman)
    monkeypatch.setattr(labctl, "PREFETCHED_STATES", {})

    labctl.prefetch_container_states(names)
    assert labctl.PREFETCHED_STATES == {}
    assert labctl.container_state(NODE.name) is None


def test_image_labels_and_digests_come_from_the_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    listing = {
        labctl.IMAGE: {"Id": "1", "Digest": "sha256:aa", "Labels": {"llm-lab.inputs": "9ba8"}},
        labctl.GATEWAY_IMAGE: {"Id": "2", "Digest": "sha256:bb", "Labels": None},
    }
    monkeypatch.setattr(images, "local_images", lambda: listing)
    assert labctl.image_label(labctl.IMAGE) == "9ba8"
    assert labctl.image_label(labctl.GATEWAY_IMAGE) == ""  # there, without the label: rebuilt
    assert labctl.image_label("localhost/absent:1") is None
    assert labctl.image_digest(labctl.GATEWAY_IMAGE) == "sha256:bb"
    with pytest.raises(labctl.LabError, match="no image localhost/absent:1"):
        labctl.image_digest("localhost/absent:1")
