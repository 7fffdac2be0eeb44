"""The roles that put inventory values into Kubernetes objects beyond the serving stage's (the device
plugin's RuntimeClass and GPU node label, the GPU health agent's namespace and port) refuse a value the API
server would refuse, before any change, naming the variable (plugins/filter/kubernetes_values.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def validate(tmp_path: Path, role: str, variables: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    inventory = {"all": {"children": {"control_plane": {"hosts": {"localhost": None}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": variables,
            "tasks": [{"ansible.builtin.include_role": {"name": role, "tasks_from": "validate"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    return subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            *("-i", str(tmp_path / "hosts.yml"), "-c", "local", str(tmp_path / "play.yml")),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={"ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("role", "variables", "says"),
    [
        (
            "nvidia_device_plugin",
            {"nvidia_device_plugin_runtime_class": "NVIDIA"},
            "nvidia_device_plugin_runtime_class: 'NVIDIA' is not a DNS-1123 label",
        ),
        (
            "nvidia_device_plugin",
            {"nvidia_device_plugin_node_label": {"nvidia.com/gpu.present": True}},
            "nvidia_device_plugin_node_label: label value True must be a string",
        ),
        (
            "gpu_health_agent",
            {"gpu_health_agent_namespace": "GPU-Health"},
            "gpu_health_agent_namespace: 'GPU-Health' is not a DNS-1123 label",
        ),
    ],
    ids=["runtime-class", "node-label-bool", "agent-namespace"],
)
def test_a_value_the_api_server_refuses_is_refused_naming_it(
    tmp_path: Path, role: str, variables: dict[str, Any], says: str
) -> None:
    result = validate(tmp_path, role, variables)
    assert result.returncode != 0
    assert says in " ".join(result.stdout.split()), result.stdout[-2000:]


@pytest.mark.parametrize("role", ["nvidia_device_plugin", "gpu_health_agent"])
def test_the_defaults_pass(tmp_path: Path, role: str) -> None:
    result = validate(tmp_path, role, {})
    assert result.returncode == 0, result.stdout[-2000:]
