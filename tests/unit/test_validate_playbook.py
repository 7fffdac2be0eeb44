"""playbooks/validate.yml: one run names every site value a real site.yml still needs, and every role's
refusal, then fails once; it changes nothing.

It runs against a copy of inventories/production with some values removed, its three hosts reached with the
local connection (the checks that read a server then read this machine, whose own refusals come on top).
The roles each stage validates are held equal to the stage playbooks' validation plays, and the README names
every site value of playbooks/vars/site-values.yml."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SITE_VALUES = yaml.safe_load((ROOT / "playbooks/vars/site-values.yml").read_text())["site_values"]
LOCAL = {
    "ansible_connection": "local",
    "ansible_python_interpreter": str(ROOT / ".venv/bin/python"),
    "ansible_become": False,
}


def site(tmp_path: Path) -> Path:
    """A site's copy of the sample inventory, some values removed (as a site that forgot them)."""
    inventory = tmp_path / "mysite"
    shutil.copytree(ROOT / "inventories/production", inventory)
    gpu = inventory / "group_vars/gpu_nodes.yml"
    gpu.write_text(
        re.sub(
            r"^(nvidia_driver_branch|nvidia_driver_expected_gpu_count): .*\n", "", gpu.read_text(), flags=re.M
        )
    )
    hosts = inventory / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("              node_ip: 10.0.0.13\n", ""))
    return inventory / "hosts.yml"


def validate(hosts: Path, *extra: str) -> tuple[int, str, dict[str, dict[str, int]]]:
    proc = subprocess.run(
        [
            ROOT / ".venv/bin/ansible-playbook",
            "-i",
            hosts,
            "playbooks/validate.yml",
            "-e",
            json.dumps(LOCAL),
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    recap = {
        m["host"]: {k: int(m[k]) for k in ("changed", "failed")}
        for m in re.finditer(
            r"^(?P<host>\S+)\s+: ok=\d+\s+changed=(?P<changed>\d+).*?failed=(?P<failed>\d+)", out, re.M
        )
    }
    return proc.returncode, " ".join(out.split()), recap


# set, but too short for the monitoring role (a refusal that must not show the value)
SECRET = "s3cr3t-pw"


@pytest.fixture(scope="module")
def forgetful_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict[str, dict[str, int]]]:
    hosts = site(tmp_path_factory.mktemp("validate"))
    # the sample's way to a secret, its vault variable left undefined
    unset_vault = {"llm_gateway_jwt_secret": "{{ vault_llm_gateway_jwt_secret }}"}
    return validate(hosts, "-e", json.dumps({"monitoring_grafana_admin_password": SECRET, **unset_vault}))


def test_one_run_names_every_missing_site_value(forgetful_site: tuple[int, str, Any]) -> None:
    rc, out, recap = forgetful_site
    assert rc != 0
    # removed from the copy, or never set in the sample (its serving values are commented out), or still its
    # placeholders (NTP servers, the operators' key)
    expected = [
        "set node_ip (gpu-node-3)",
        "set nvidia_driver_branch (group gpu_nodes)",
        "set nvidia_driver_expected_gpu_count (group gpu_nodes)",
        "set common_ntp_servers (group k8s_cluster)",
        "set common_ops_users (group k8s_cluster)",
        "set model_sync_models (group gpu_nodes)",
        "set vllm_serving_models (group control_plane)",
        "set vllm_serving_image_digest",
        "set llm_gateway_image_digest",
        "set llm_gateway_jwt_secret",
        "set monitoring_alert_webhook_url",
        "set monitoring_prometheus_image_digest",
        "set monitoring_alertmanager_image_digest",
        "set monitoring_grafana_image_digest",
        "set monitoring_dcgm_exporter_image_digest",
    ]
    missing = [name for name in expected if name not in out]
    assert missing == [], out[-6000:]
    unreadable = r"set llm_gateway_jwt_secret \(group control_plane\): .{0,120}?cannot be read"
    assert re.search(unreadable, out), out[-6000:]
    assert "set model_sync_source_node" not in out  # the sample sets it
    # once: only the summary fails; the roles' refusals were recorded, not fatal, and nothing changed
    assert recap["localhost"]["failed"] == 1, recap
    assert all(r["failed"] == 0 and r["changed"] == 0 for host, r in recap.items() if host != "localhost"), (
        recap
    )


def test_the_roles_refusals_of_every_stage_come_in_the_same_run(forgetful_site: tuple[int, str, Any]) -> None:
    _, out, _ = forgetful_site
    for role, says in [
        ("vllm_serving", "vllm_serving_image_digest must be the registry digest"),
        ("llm_gateway", r".{0,40}vault_llm_gateway_jwt_secret.{0,4} is undefined"),  # its type check, first
        ("monitoring", r"monitoring_alert_webhook_url must be the http\(s\) URL"),
    ]:
        assert re.search(f"refused on gpu-node-1: {role}: {says}", out), (role, out[-6000:])
    # the kubeadm checks ran on every node: node_ip of gpu-node-3 is unset
    assert re.search(r"refused on [^:]*gpu-node-3[^:]*: kubeadm_control_plane: node_ip of gpu-node-3", out), (
        out[-6000:]
    )


def test_secrets_are_named_never_shown(forgetful_site: tuple[int, str, Any]) -> None:
    _, out, _ = forgetful_site
    assert SECRET not in out
    assert "set monitoring_grafana_admin_password" not in out  # set, if badly: the role's check says so


STAGES = {
    "playbooks/common.yml": "Baseline",
    "playbooks/gpu.yml": "GPU nodes",
    "playbooks/kubernetes.yml": "Kubernetes",
    "playbooks/gpu-health-agent.yml": "GPU health agent",
    "playbooks/models.yml": "Models",
    "playbooks/serving.yml": "Serving",
}


def stage_roles(path: str) -> tuple[str, list[str]]:
    """The hosts and the roles a stage playbook validates before any change (its first play)."""
    play = yaml.safe_load((ROOT / path).read_text())[0]
    if "roles" in play and not play.get("tasks") and not play.get("pre_tasks"):
        return play["hosts"], [r["role"] for r in play["roles"]]  # common: its role validates first
    roles: list[str] = []
    for task in play.get("pre_tasks", []) + play.get("tasks", []):
        include = task.get("ansible.builtin.include_role")
        if include and include.get("tasks_from") == "validate":
            loop = task.get("loop", [include["name"]])
            if isinstance(loop, str):  # "{{ <stage>_stage_roles }}", a list of the play's vars
                loop = play["vars"][loop.strip("{} ")]
            roles += loop
    return play["hosts"], roles


@pytest.mark.parametrize("path", list(STAGES))
def test_validate_checks_the_roles_each_stage_checks(path: str) -> None:
    plays = yaml.safe_load((ROOT / "playbooks/validate.yml").read_text())
    (play,) = [p for p in plays if p["name"].startswith(STAGES[path] + " - validate")]
    assert path in play["name"]
    hosts, roles = stage_roles(path)
    assert (play["hosts"], play["tasks"][0]["loop"]) == (hosts, roles)


def included(play: dict[str, Any], role: str, tasks_from: str) -> bool:
    """Whether PLAY's tasks include TASKS_FROM of ROLE, directly or through tasks/validate-role.yml."""
    for task in play.get("pre_tasks", []) + play.get("tasks", []):
        include = task.get("ansible.builtin.include_role") or {}
        if (include.get("name"), include.get("tasks_from")) == (role, tasks_from):
            return True
        given = task.get("vars") or {}
        if task.get("ansible.builtin.include_tasks") == "tasks/validate-role.yml" and (
            given.get("validate_role"),
            given.get("validate_tasks_from"),
        ) == (role, tasks_from):
            return True
    return False


def test_validate_checks_the_version_a_running_cluster_runs_as_the_stage_does() -> None:
    """The Kubernetes stage's validation play refuses a kubernetes_version other than the running cluster's
    (role kubernetes, tasks/check-running-version.yml, not part of its validate.yml): validate.yml too."""
    stage = yaml.safe_load((ROOT / "playbooks/kubernetes.yml").read_text())[0]
    plays = yaml.safe_load((ROOT / "playbooks/validate.yml").read_text())
    (play,) = [p for p in plays if p["name"].startswith("Kubernetes - validate")]
    assert included(stage, "kubernetes", "check-running-version")
    assert included(play, "kubernetes", "check-running-version")


def test_the_readme_names_every_site_value() -> None:
    readme = (ROOT / "README.md").read_text()
    assert [v["name"] for v in SITE_VALUES if f"`{v['name']}`" not in readme] == []
