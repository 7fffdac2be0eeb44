"""roles/kubeadm_join: the join token never reaches a command line or the output. It travels in a
JoinConfiguration file (mode 0600) that is removed whatever the join's outcome; on the lab the reset worker's
rejoin (tests/lab/test_kubernetes_stage_on_lab.py) runs it for real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

JOIN = Path(__file__).resolve().parents[2] / "roles/kubeadm_join/tasks/join.yml"


def tasks() -> list[dict[str, Any]]:
    found = []

    def walk(items: list[dict[str, Any]]) -> None:
        for task in items:
            found.append(task)
            for key in ("block", "rescue", "always"):
                walk(task.get(key) or [])

    walk(yaml.safe_load(JOIN.read_text()))
    return found


def named(start: str) -> dict[str, Any]:
    (task,) = [t for t in tasks() if t.get("name", "").startswith(start)]
    return task


def test_kubeadm_join_reads_the_token_from_its_config_file_not_its_argv() -> None:
    join = named("Run kubeadm join")
    assert join["ansible.builtin.command"]["argv"] == [
        "kubeadm",
        "join",
        "--config",
        "{{ kubeadm_join_config_path }}",
    ]
    write = named("Write the JoinConfiguration")
    assert write["no_log"] is True and write["ansible.builtin.copy"]["mode"] == "0600"
    assert "token:" in write["ansible.builtin.copy"]["content"]


def test_every_task_that_holds_the_token_is_no_log() -> None:
    for start in (
        "Create a join token",
        "Write the JoinConfiguration",
        "Run kubeadm join",
    ):
        assert named(start).get("no_log") is True, start


def test_the_config_file_is_removed_whatever_happens() -> None:
    (block,) = [t for t in yaml.safe_load(JOIN.read_text()) if "block" in t]
    removed = [t["ansible.builtin.file"] for t in block["always"] if "ansible.builtin.file" in t]
    assert removed == [{"path": "{{ kubeadm_join_config_path }}", "state": "absent"}]
