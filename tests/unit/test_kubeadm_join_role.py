"""roles/kubeadm_join: the join token never reaches a command line or the output. It travels in a
JoinConfiguration file (mode 0600) that is removed whatever the join's outcome; on the lab the reset worker's
rejoin (tests/lab/test_kubernetes_stage_on_lab.py) runs it for real. The JoinConfiguration gives the kubelet
node_ip as its node IP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import real_kube
import yaml

ROOT = Path(__file__).resolve().parents[2]
JOIN = ROOT / "roles/kubeadm_join/tasks/join.yml"


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


def join_configuration(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The JoinConfiguration the role writes, rendered with its defaults and vars for a worker."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role = JOIN.parents[1]
    variables: dict[str, Any] = {}
    # the role's dependency (meta/main.yml: kubernetes, the home of kubernetes_cri_socket), then the role
    for folder in (role.parent / "kubernetes", role):
        for name in ("defaults", "vars"):
            loaded = yaml.safe_load((folder / name / "main.yml").read_text()) or {}
            variables |= {k: trust_as_template(v) if isinstance(v, str) else v for k, v in loaded.items()}
    line = (
        "kubeadm join 10.89.42.11:6443 --token abcdef.0123456789abcdef"
        f" --discovery-token-ca-cert-hash sha256:{'a' * 64}"
    )
    variables |= {
        "inventory_hostname": "gpu-node-2",
        "node_ip": "10.89.42.12",
        "__kubeadm_join_command": {"stdout_lines": [line]},
    }
    content = named("Write the JoinConfiguration")["ansible.builtin.copy"]["content"]
    text = str(Templar(loader=DataLoader(), variables=variables).template(trust_as_template(content)))
    path = tmp_path / "join.yaml"
    path.write_text(text)
    return path, yaml.safe_load(text)


def test_the_join_configuration_gives_the_kubelet_node_ip(tmp_path: Path) -> None:
    """The worker's kubelet registers with node_ip as its InternalIP (Calico takes its address from it), not
    with whatever address the default route or the host name gives."""
    path, join = join_configuration(tmp_path)
    assert join["nodeRegistration"]["kubeletExtraArgs"] == [{"name": "node-ip", "value": "10.89.42.12"}]
    assert join["discovery"]["bootstrapToken"]["apiServerEndpoint"] == "10.89.42.11:6443"
    # the real kubeadm of the production pin accepts it: v1beta4's kubeletExtraArgs is name/value pairs
    result = real_kube.kubeadm("config", "validate", "--config", str(path))
    assert result.returncode == 0, result.stderr
