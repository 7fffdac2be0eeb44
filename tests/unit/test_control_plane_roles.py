"""Roles etcd_backup and control_plane_metrics: bad values refused by their validation, naming the variable,
before anything changes (ansible-playbook on this machine, the inventory's shape of the lab); the settings and
units the roles write are what their programs read (role_render: the roles' own defaults and templates)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from playbook_text import flat
from role_render import RoleVars

ROOT = Path(__file__).resolve().parents[2]
HOSTS = {"gpu-node-1": "10.89.42.11", "gpu-node-2": "10.89.42.12", "gpu-node-3": "10.89.42.13"}


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def host(name: str) -> dict[str, Any]:
        return {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "node_ip": HOSTS[name],
        }

    path = tmp_path_factory.mktemp("inventory") / "hosts.json"
    path.write_text(
        json.dumps(
            {
                "all": {
                    "children": {
                        "k8s_cluster": {
                            "children": {
                                "control_plane": {"hosts": {"gpu-node-1": host("gpu-node-1")}},
                                "workers": {"hosts": {n: host(n) for n in ("gpu-node-2", "gpu-node-3")}},
                            }
                        }
                    }
                }
            }
        )
    )
    return path


def validate(inventory: Path, tmp_path: Path, **values: Any) -> subprocess.CompletedProcess[str]:
    """The two roles' validation on the control plane, as playbooks/kubernetes.yml's first play runs it."""
    playbook = tmp_path / "validate.yml"
    playbook.write_text(
        "- hosts: control_plane\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role:\n        name: '{{ item }}'\n        tasks_from: validate\n"
        "      loop: [control_plane_metrics, etcd_backup]\n"
    )
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(values))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory),
            str(playbook),
            "-e",
            f"@{extra}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_the_defaults_pass(inventory: Path, tmp_path: Path) -> None:
    done = validate(inventory, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (
            {"etcd_backup_copy_to_node": "gpu-node-1"},
            "etcd_backup_copy_to_node must be a host of the inventory other",
        ),
        (
            {"etcd_backup_copy_to_node": "gpu-node-9"},
            "etcd_backup_copy_to_node must be a host of the inventory other",
        ),
        ({"etcd_backup_copy_to_node": ""}, "at least one copy must leave the control plane"),
        (
            {"etcd_backup_on_calendar": "every hour"},
            'etcd_backup_on_calendar "every hour" is not a systemd calendar',
        ),
        ({"etcd_backup_keep": 0}, "etcd_backup_keep must be at least 1 (got 0)"),
        ({"etcd_backup_keep": "7"}, "etcd_backup_keep must be a whole number"),
        ({"etcd_backup_copy_to_path": "backups"}, "etcd_backup_copy_to_path empty or such a path outside"),
        ({"etcd_backup_copy_to_path": "/var/backups/etcd/copy"}, "outside etcd_backup_dir"),
        (
            {"control_plane_metrics_listen_address": "0.0.0.0:9446"},
            "control_plane_metrics_listen_address the node",
        ),
        ({"control_plane_metrics_port": 70000}, "control_plane_metrics_port must be 1..65535 (got 70000)"),
    ],
    ids=lambda v: json.dumps(v)[:50] if isinstance(v, dict) else "",
)
def test_bad_values_are_refused_naming_the_variable(
    inventory: Path, tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    done = validate(inventory, tmp_path, **values)
    assert done.returncode != 0
    assert named in flat(done.stdout), done.stdout[-3000:]


def program_keys(script: Path) -> set[str]:
    """The keys the backup program reads from its settings (config["x"], config.get("x"))."""
    keys = set()
    for node in ast.walk(ast.parse(script.read_text())):
        subscript = isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "config"
        if subscript and isinstance(node.slice, ast.Constant):  # type: ignore[attr-defined]
            keys.add(node.slice.value)  # type: ignore[attr-defined]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and getattr(node.func.value, "id", "") == "config"
        ):
            keys.add(node.args[0].value)  # type: ignore[attr-defined]
    return keys


def etcd_backup_role(**values: Any) -> RoleVars:
    hostvars = {name: {"node_ip": ip} for name, ip in HOSTS.items()}
    groups = {"control_plane": ["gpu-node-1"], "workers": ["gpu-node-2", "gpu-node-3"]}
    return RoleVars(
        "etcd_backup",
        inventory_hostname="gpu-node-1",
        node_ip=HOSTS["gpu-node-1"],
        groups=groups,
        hostvars=hostvars,
        control_plane_metrics_dir="/var/lib/control-plane-metrics",
        **values,
    )


def test_the_settings_are_what_the_backup_program_reads() -> None:
    (script,) = (ROOT / "roles" / "etcd_backup" / "files").glob("*.py")
    role = etcd_backup_role(etcd_backup_copy_to_path="/mnt/site-backups/etcd")
    settings = json.loads(role.render_template("config.json.j2"))
    assert program_keys(script) - {"copy_timeout_s"} <= set(settings), (
        "a setting the program reads is missing"
    )
    assert settings["copies"] == [
        {
            "kind": "node",
            "name": "gpu-node-2",  # the first worker by default
            "user": "etcdbackup",
            "address": "10.89.42.12",
            "ssh_key": "/etc/etcd-backup/id_ed25519",
            "known_hosts": "/etc/etcd-backup/known_hosts",
        },
        {"kind": "path", "name": "/mnt/site-backups/etcd", "path": "/mnt/site-backups/etcd"},
    ]
    assert settings["max_age_s"] == 3 * 3600 and settings["keep"] == 24
    assert settings["metrics_file"] == "/var/lib/control-plane-metrics/etcd_backup.prom"
    assert settings["cert"].endswith("/pki/etcd/healthcheck-client.crt")


def exec_start(unit: str) -> list[str]:
    (line,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    return line.split("=", 1)[1].split()


def test_the_units_run_the_programs_with_what_they_take() -> None:
    role = etcd_backup_role()
    backup = exec_start(role.render_template("etcd-backup.service.j2"))
    # (the program's path from the role's vars: this test imports Ansible's templar, no node-side test)
    assert backup == [
        "/usr/bin/python3",
        role["__etcd_backup_program"],
        "save",
        "--config",
        role["__etcd_backup_config"],
    ]
    assert role["__etcd_backup_config"] == "/etc/etcd-backup/config.json"
    prune = exec_start(role.render_template("etcd-backup-prune.service.j2"))
    assert prune[2:] == ["prune", "--dir", "/var/backups/etcd-copies/gpu-node-1", "--keep", "24"]
    assert "User=etcdbackup" in role.render_template("etcd-backup-prune.service.j2")
    assert "OnCalendar=hourly" in role.render_template("etcd-backup.timer.j2")

    metrics = RoleVars("control_plane_metrics", node_ip="10.89.42.11")
    exporter = exec_start(metrics.render_template("control-plane-metrics.service.j2"))
    exporter_dir = "/var/lib/control-plane-metrics"
    assert exporter[2:] == ["serve", "--listen", "10.89.42.11", "--port", "9446", "--dir", exporter_dir]
    check = exec_start(metrics.render_template("kubeadm-certificates-metrics.service.j2"))
    assert check[2:] == ["certificates", "--out", "/var/lib/control-plane-metrics/kubeadm_certificates.prom"]
    # each command line is one the program takes (its argparse, --help of the subcommand)
    for argv in (backup, prune, exporter, check):
        program = ROOT / "roles" / ("etcd_backup" if "etcd" in argv[1] else "control_plane_metrics") / "files"
        local = program / Path(argv[1]).name
        helped = subprocess.run(
            [sys.executable, str(local), argv[2], "--help"], capture_output=True, text=True
        )
        assert helped.returncode == 0, helped.stderr
        for flag in (a for a in argv[3:] if a.startswith("--")):
            assert re.search(rf"(^|\s){re.escape(flag)}\b", helped.stdout), f"{argv[2]} takes no {flag}"
