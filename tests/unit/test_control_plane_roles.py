"""Roles etcd_backup and control_plane_metrics: bad values refused by their validation, naming the variable,
before anything changes (ansible-playbook on this machine, the inventory's shape of the lab); the settings and
units the roles write are what their programs read (role_render: the roles' own defaults and templates);
and etcd_backup's gates on its reads: a task skipped for what a read found is one the real module leaves as
it is (known_hosts, authorized_key: the shared verdicts of plugins/filter/ssh_key_files.py with the role's
values), a file read answers as the command it replaces (rrsync's -no-del, grep), and the tools run again
wherever they are not as recorded after they ran."""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import ansible.modules.known_hosts as real_known_hosts
import files_in_place
import pytest
import yaml
from ansible_collections.ansible.posix.plugins.modules import authorized_key as real_authorized_key
from conftest import run_module
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


def validate(
    inventory: Path, tmp_path: Path, hosts: str = "control_plane", **values: Any
) -> subprocess.CompletedProcess[str]:
    """The two roles' validation on HOSTS, as playbooks/kubernetes.yml's first play runs it."""
    playbook = tmp_path / "validate.yml"
    playbook.write_text(
        f"- hosts: {hosts}\n  gather_facts: false\n  tasks:\n"
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


def test_the_schedule_is_checked_where_a_timer_gets_it(inventory: Path, tmp_path: Path) -> None:
    """On the whole cluster, as the stage's validation play runs: the control plane (its timer) and the
    node that receives its copies (the prune timer) refuse a schedule systemd does not read; the other
    worker, which gets no timer of the role, does not run systemd-analyze."""
    done = validate(inventory, tmp_path, hosts="k8s_cluster", etcd_backup_on_calendar="every hour")
    out = flat(done.stdout)
    for host in ("gpu-node-1", "gpu-node-2"):
        assert re.search(rf"fatal: \[{host}\].*?is not a systemd calendar", out), done.stdout[-3000:]
    assert re.search(r"gpu-node-3 : ok=\d+ changed=0 unreachable=0 failed=0", out), done.stdout[-3000:]


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


# ------------------------------------------------------------------------- the gates on etcd_backup's reads
def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def ed25519_public(tmp_path: Path, name: str) -> str:
    """A real ed25519 public key, `ssh-ed25519 <key>` (as openssh_keypair returns it, and the host key's fact
    without its type)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(tmp_path / name)], check=True
    )
    return " ".join((tmp_path / f"{name}.pub").read_text().split()[:2])


def copy_role(host_facts: dict[str, Any] | None = None, **overrides: Any) -> RoleVars:
    """etcd_backup on the control plane with what earlier tasks registered (OVERRIDES), the copy node's facts
    HOST_FACTS."""
    hostvars: dict[str, Any] = {name: {"node_ip": ip} for name, ip in HOSTS.items()}
    hostvars["gpu-node-2"]["ansible_facts"] = host_facts or {}
    return RoleVars(
        "etcd_backup",
        inventory_hostname="gpu-node-1",
        node_ip=HOSTS["gpu-node-1"],
        groups={"control_plane": ["gpu-node-1"], "workers": ["gpu-node-2", "gpu-node-3"]},
        hostvars=hostvars,
        control_plane_metrics_dir="/var/lib/control-plane-metrics",
        **overrides,
    )


@pytest.mark.parametrize(
    ("text", "no_del"),
    [
        (b"#!/usr/bin/env python3\n# -no-del  Disable rsync's --delete* and --remove* options\n", True),
        (b"#!/usr/bin/perl\n# usage: rrsync [-ro|-wo] SUBDIR\n", False),
        (b"no_del, no-\ndel, nodel\n", False),
        (b"\x7fELF\x02\xff\xfe binary with no-del in it\x00\n", True),
        (b"", False),
    ],
)
def test_rrsync_no_del_is_read_as_grep_finds_it(tmp_path: Path, text: bytes, no_del: bool) -> None:
    """The -no-del verdict from the receiving node's read (files_in_place's slurp) is grep -q -e no-del's."""
    rrsync = tmp_path / "rrsync"
    rrsync.write_bytes(text)
    grep = subprocess.run(["grep", "-q", "-e", "no-del", str(rrsync)], check=False).returncode
    assert grep in (0, 1)
    failed, read = run_module(files_in_place, {"slurp": [str(rrsync)]})
    assert not failed, read["msg"]
    role = copy_role(__model_sync_rrsync=str(rrsync), __etcd_backup_copy_state=read)
    assert role["__etcd_backup_rrsync_no_del"] is no_del is (grep == 0)
    assert (" -wo -no-del " if no_del else " -wo /") in role["__etcd_backup_copy_key_options"]


def test_no_rrsync_chosen_no_no_del() -> None:
    role = copy_role(__model_sync_rrsync="", __etcd_backup_copy_state={"slurp": {}})
    assert role["__etcd_backup_rrsync_no_del"] is False


def authorized_key_changes(role: RoleVars, keys: Path) -> tuple[bool, str]:
    """The real authorized_key task of copy-to-node.yml over KEYS, in check mode: whether it changes it, and
    what it would write."""
    failed, result = run_module(
        real_authorized_key,
        {
            "user": "root",
            "path": str(keys),
            "key": role["__etcd_backup_keypair.public_key"],
            "key_options": role["__etcd_backup_copy_key_options"],
            "exclusive": True,
            "manage_dir": True,
        },
        check_mode=True,
        diff=True,
    )
    assert not failed, result["msg"]
    return result.get("changed", False), result.get("diff", {}).get("after", "")


def key_role(
    tmp_path: Path, public_key: str, content: str | None, rrsync: str = "/usr/bin/rrsync"
) -> RoleVars:
    keys = tmp_path / "authorized_keys"
    keys.unlink(missing_ok=True)
    if content is not None:
        keys.write_text(content)
    read = {
        "slurp": {"/var/lib/etcdbackup/.ssh/authorized_keys": {"content": b64(content)} if content else {}}
    }
    read["slurp"][rrsync] = {"content": b64("# -no-del\n")}
    return copy_role(
        __model_sync_rrsync=rrsync,
        __etcd_backup_keypair={"public_key": public_key},
        __etcd_backup_copy_state=read,
    )


def test_the_key_is_authorized_only_where_authorized_keys_holds_other_than_its_line(tmp_path: Path) -> None:
    """The role's gate on the shared verdict (plugins/filter/ssh_key_files.py, held to the module in
    test_ssh_key_files.py), with the role's key and options."""
    public_key = ed25519_public(tmp_path, "copy")
    keys = tmp_path / "authorized_keys"
    # what the task writes into an empty file is what the gate calls in place, and the module then leaves it
    role = key_role(tmp_path, public_key, None)
    assert role["__etcd_backup_copy_key_in_place"] is False
    changed, written = authorized_key_changes(role, keys)
    assert changed and written == f"{role['__etcd_backup_copy_key_options']} {public_key} \n", written
    role = key_role(tmp_path, public_key, written)
    assert role["__etcd_backup_copy_key_in_place"] is True
    assert authorized_key_changes(role, keys)[0] is False
    # anything else there: the gate lets the task run (which may or may not change it)
    other = ed25519_public(tmp_path, "other")
    for content in (
        "# a comment\n" + written,
        written + "\n",
        written + other + "\n",
        written.replace(" -no-del", ""),
        written.replace(public_key, other),
        written.rstrip("\n"),
        written.replace(" \n", "\n"),
        "",
    ):
        assert key_role(tmp_path, public_key, content)["__etcd_backup_copy_key_in_place"] is False, content
    # options the module reads back otherwise (it joins them with single spaces): never in place
    spaced = key_role(tmp_path, public_key, written, rrsync="/opt/rr  sync")
    assert spaced["__etcd_backup_copy_key_in_place"] is False


def known_hosts_changes(role: RoleVars, known_hosts: Path) -> tuple[bool, str]:
    failed, result = run_module(
        real_known_hosts,
        {
            "path": str(known_hosts),
            "name": HOSTS["gpu-node-2"],
            "key": role["__etcd_backup_copy_host_key"],
            "state": "present",
        },
        check_mode=True,
        diff=True,
    )
    assert not failed, result["msg"]
    return result["changed"], result["diff"]["after"]


def test_the_host_key_is_trusted_only_where_known_hosts_does_not_hold_it(tmp_path: Path) -> None:
    """The role's gate on the shared verdict (plugins/filter/ssh_key_files.py, held to the module in
    test_ssh_key_files.py), with the role's host and key."""
    host_key = ed25519_public(tmp_path, "host").split()[1]
    known_hosts = tmp_path / "known_hosts"

    def role(content: str | None) -> RoleVars:
        known_hosts.unlink(missing_ok=True)
        if content is not None:
            known_hosts.write_text(content)
        read = {"/etc/etcd-backup/known_hosts": {"content": b64(content)} if content is not None else {}}
        return copy_role(
            host_facts={"ssh_host_key_ed25519_public": host_key}, __etcd_backup_state={"slurp": read}
        )

    fresh = role(None)
    assert fresh["__etcd_backup_known_hosts_in_place"] is False
    changed, written = known_hosts_changes(fresh, known_hosts)
    assert changed and written == f"{HOSTS['gpu-node-2']} ssh-ed25519 {host_key}\n"
    # the line the module adds, alone or where ssh-keygen -F finds it first: the module leaves the file
    for content in (written, "# x\n" + written, written + written, written.strip()):
        converged = role(content)
        assert converged["__etcd_backup_known_hosts_in_place"] is True, content
        assert known_hosts_changes(converged, known_hosts)[0] is False, content
    other = ed25519_public(tmp_path, "other").split()[1]
    for content in ("", written.replace(host_key, other), written.replace(host_key, other) + written):
        stale = role(content)
        assert stale["__etcd_backup_known_hosts_in_place"] is False, content
        assert known_hosts_changes(stale, known_hosts)[0] is True, content


def tools_in_place(tmp_path: Path, *, record: str | None, owner: str = "root") -> bool:
    """etcd_backup's verdict on its tools in TMP_PATH/bin, over what files_in_place really reads there (the
    owner and group given as OWNER's: the copy makes them root's; this test runs as whoever it is)."""
    role = copy_role(__etcd_backup_bin=str(tmp_path / "bin"))
    tools, record_path = role["__etcd_backup_tools"], role["__etcd_backup_tools_record"]
    Path(record_path).unlink(missing_ok=True)
    if record is not None:
        Path(record_path).write_text(record)
    failed, read = run_module(files_in_place, {"stat": tools, "slurp": [record_path]})
    assert not failed, read["msg"]
    for found in read["stat"].values():
        if found["exists"]:
            found["pw_name"] = found["gr_name"] = owner
    return copy_role(__etcd_backup_bin=str(tmp_path / "bin"), __etcd_backup_state=read)[
        "__etcd_backup_tools_in_place"
    ]


def recorded(tmp_path: Path) -> str:
    """The record tools-copy.yml writes after copying the tools now in TMP_PATH/bin (copy's checksums)."""
    tasks = yaml.safe_load((ROOT / "roles/etcd_backup/tasks/tools-copy.yml").read_text())
    (copying,) = [t for t in tasks if "block" in t and t["name"].startswith("Copy the tools")]
    (task,) = [t for t in copying["block"] if t["name"].startswith("Record their checksums")]
    role = copy_role(__etcd_backup_bin=str(tmp_path / "bin"))
    copied = [
        {"checksum": hashlib.sha1(Path(tool).read_bytes()).hexdigest()}
        for tool in role["__etcd_backup_tools"]
    ]
    role = copy_role(__etcd_backup_bin=str(tmp_path / "bin"), __etcd_backup_tools_copied={"results": copied})
    return str(role.template(task["ansible.builtin.copy"]["content"]))


def test_the_tools_run_again_wherever_they_are_not_as_recorded(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("etcdctl", "etcdutl"):
        (bin_dir / name).write_bytes(name.encode() * 1000)
        (bin_dir / name).chmod(0o755)
    record = recorded(tmp_path)
    assert record.endswith("\n") and record.count("\n") == 2
    assert subprocess.run(["sha1sum", "-c", "--quiet", "-"], input=record, text=True).returncode == 0
    assert tools_in_place(tmp_path, record=record) is True
    assert tools_in_place(tmp_path, record=None) is False
    assert tools_in_place(tmp_path, record=record.replace("etcdutl\n", "etcdutl\nextra\n")) is False
    assert tools_in_place(tmp_path, record=record, owner="nobody") is False
    (bin_dir / "etcdutl").chmod(0o644)
    assert tools_in_place(tmp_path, record=record) is False
    (bin_dir / "etcdutl").chmod(0o755)
    (bin_dir / "etcdutl").write_bytes(b"changed")
    assert tools_in_place(tmp_path, record=record) is False
    (bin_dir / "etcdutl").unlink()
    assert tools_in_place(tmp_path, record=record) is False


# ------------------------------------------------------------------------- the copy's SSH key pair
def task_in(path: str, name: str) -> dict[str, Any]:
    (task,) = [t for t in yaml.safe_load((ROOT / path).read_text()) if t.get("name", "").startswith(name)]
    return task


def keypair_run(role: RoleVars, *, check_mode: bool = False) -> dict[str, Any]:
    """The real key task of ssh-key.yml on the role's pair (owner and group left out: this test runs as
    whoever it is; the verdict's owner is set by key_pair_read)."""
    from ansible_collections.community.crypto.plugins.modules import openssh_keypair

    args = dict(
        task_in("roles/etcd_backup/tasks/ssh-key.yml", "Generate the copy's SSH key")[
            "community.crypto.openssh_keypair"
        ]
    )
    args = {k: role.template(v) for k, v in args.items() if k not in ("owner", "group")}
    failed, result = run_module(openssh_keypair, args, check_mode=check_mode)
    assert not failed, result["msg"]
    return result


def key_pair_read(role: RoleVars, owner: str = "root") -> dict[str, Any]:
    """What the role's first read (tasks/main.yml) finds of the pair and its record (owner, group: OWNER)."""
    failed, read = run_module(
        files_in_place,
        {
            "stat": role["__etcd_backup_ssh_key_files"],
            "slurp": [role["__etcd_backup_ssh_key"] + ".pub", role["__etcd_backup_ssh_key_record"]],
        },
    )
    assert not failed, read["msg"]
    for found in read["stat"].values():
        if found["exists"]:
            found["pw_name"] = found["gr_name"] = owner
    return read


def test_the_key_pair_is_checked_again_wherever_it_is_not_as_the_module_last_left_it(tmp_path: Path) -> None:
    def role(**registered: Any) -> RoleVars:
        return copy_role(__etcd_backup_config_dir=str(tmp_path), **registered)

    fresh = role(__etcd_backup_state=key_pair_read(role()))
    assert fresh["__etcd_backup_ssh_key_in_place"] is False
    made = keypair_run(fresh)
    assert made["changed"]
    # the record task, on the stat the role reads after the module ran
    record_task = task_in("roles/etcd_backup/tasks/ssh-key.yml", "Record the checksums")
    after = key_pair_read(role())
    record = role(__etcd_backup_ssh_key_read=after).template(record_task["ansible.builtin.copy"]["content"])
    assert subprocess.run(["sha1sum", "-c", "--quiet", "-"], input=record, text=True).returncode == 0
    key, pub = fresh["__etcd_backup_ssh_key_files"]
    Path(fresh["__etcd_backup_ssh_key_record"]).write_text(record)

    def verdict(owner: str = "root") -> bool:
        return role(__etcd_backup_state=key_pair_read(role(), owner))["__etcd_backup_ssh_key_in_place"]

    # in place: the module leaves the pair as it is, and the key the role authorizes is the module's
    assert verdict() is True
    assert keypair_run(fresh, check_mode=True)["changed"] is False
    converged = role(__etcd_backup_state=key_pair_read(role()), __etcd_backup_keypair={"skipped": True})
    assert converged["__etcd_backup_copy_public_key"] == made["public_key"]
    assert role(__etcd_backup_keypair=made)["__etcd_backup_copy_public_key"] == made["public_key"]
    # what the module would change or check again: never in place
    assert verdict(owner="nobody") is False
    Path(pub).chmod(0o644)
    assert verdict() is False
    Path(pub).chmod(0o600)
    text = Path(pub).read_text()
    Path(pub).write_text(text.replace("etcd-backup@gpu-node-1", "someone@else"))
    assert verdict() is False
    assert keypair_run(fresh, check_mode=True)["changed"] is True
    Path(pub).write_text(text)
    assert verdict() is True
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(other)], check=True)
    original = Path(key).read_bytes()
    Path(key).write_bytes(other.read_bytes())
    assert verdict() is False
    Path(key).write_bytes(original)
    assert verdict() is True
    Path(fresh["__etcd_backup_ssh_key_record"]).unlink()
    assert verdict() is False
    Path(fresh["__etcd_backup_ssh_key_record"]).write_text(record)
    Path(pub).unlink()
    assert verdict() is False


def test_the_first_backup_is_taken_where_the_read_finds_what_find_found(tmp_path: Path) -> None:
    """The snapshots' find in the role's first read answers as the find task it replaced (paths, patterns)."""
    import ansible.modules.find as real_find

    backups = tmp_path / "etcd"
    role = copy_role(etcd_backup_dir=str(backups))
    read = task_in("roles/etcd_backup/tasks/main.yml", "Find which of the backup's files differ")
    (entry,) = role.template(read["files_in_place"]["find"])
    # the directory missing, there with no snapshot, with one
    for files in ([], ["etcd-snapshot-1.db", "etcd-snapshot-1.txt"], ["etcd-snapshot-1.json"]):
        if files or backups.exists():
            backups.mkdir(exist_ok=True)
        for name in files:
            (backups / name).write_text("{}")
        failed, found = run_module(files_in_place, {"find": [entry]})
        assert not failed, found["msg"]
        failed, old = run_module(real_find, {"paths": [str(backups)], "patterns": ["etcd-snapshot-*.json"]})
        assert not failed, old["msg"]
        assert found["found"]["snapshots"]["matched"] == old["matched"] == files.count("etcd-snapshot-1.json")


# ------------------------------------------------------------------------- the receiving account
PASSWD = "root:x:0:0:root:/root:/bin/bash\n{line}\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
SHADOW = "root:*:19000:0:99999:7:::\n{line}\nnobody:*:19000:0:99999:7:::\n"
ACCOUNT = "etcdbackup:x:998:998:etcd backup copies (rsync only):/var/lib/etcdbackup:/bin/sh"


def account_differs(tmp_path: Path, passwd_line: str, shadow_line: str) -> list[str]:
    """Which of the role's account files the receiving node's read (its edits) finds other than the user task
    leaves them, over /etc/passwd and /etc/shadow with the account's line given (or none: "")."""
    edits = copy_role()["__etcd_backup_copy_account_edits"]
    files = {"/etc/passwd": PASSWD.format(line=passwd_line), "/etc/shadow": SHADOW.format(line=shadow_line)}
    local = []
    for edit in edits:
        path = tmp_path / Path(edit["path"]).name
        path.write_text(files[edit["path"]].replace("\n\n", "\n"))
        local.append(edit | {"path": str(path)})
    failed, read = run_module(files_in_place, {"edits": local})
    assert not failed, read["msg"]
    return sorted(Path(p).name for p in read["differ"])


def test_the_account_is_made_again_wherever_the_user_module_would_change_it(tmp_path: Path) -> None:
    """The module compares the comment, home and shell of the account's passwd entry, and its shadow password
    stripped of '!' with the task's '!' (ansible.builtin.user); it makes a missing account."""
    shadow = "etcdbackup:!:19000::::::"
    assert account_differs(tmp_path, ACCOUNT, shadow) == []
    for locked in ("etcdbackup:!!:19000::::::", "etcdbackup::19000::::::", "etcdbackup:!:19000:0:99999:7:::"):
        assert account_differs(tmp_path, ACCOUNT, locked) == [], locked
    for password in ("etcdbackup:$6$salt$hash:19000::::::", "etcdbackup:!$6$salt$hash:19000::::::", ""):
        assert account_differs(tmp_path, ACCOUNT, password) == ["shadow"], password
    for line in (
        "",
        ACCOUNT.replace("/bin/sh", "/bin/bash"),
        ACCOUNT.replace("(rsync only)", "rsync only"),
        ACCOUNT.replace("/var/lib/etcdbackup", "/home/etcdbackup"),
        ACCOUNT.replace(":x:", ":$6$salt$hash:"),
        ACCOUNT + "\n" + ACCOUNT.replace("/bin/sh", "/bin/bash"),
        ACCOUNT.replace("etcdbackup:", "etcdbackupx:", 1),
    ):
        assert account_differs(tmp_path, line, shadow) == ["passwd"], line
    # read only where the name service reads the files first, and with the account's home there
    read = {
        "differ": [],
        "stat": {"/var/lib/etcdbackup": {"exists": True, "isdir": True}},
        "slurp": {"/etc/nsswitch.conf": {"content": b64("passwd:  files systemd\nshadow:  files\n")}},
    }
    assert copy_role(__etcd_backup_copy_state=read)["__etcd_backup_copy_account_in_place"] is True
    for other in (
        {"differ": ["/etc/shadow"]},
        {"stat": {"/var/lib/etcdbackup": {"exists": False}}},
        {"slurp": {"/etc/nsswitch.conf": {"content": b64("passwd:  sss files\nshadow:  files\n")}}},
        {"slurp": {"/etc/nsswitch.conf": {"content": b64("passwd:  files\nshadow:  compat\n")}}},
        {"slurp": {}},
    ):
        role = copy_role(__etcd_backup_copy_state=read | other)
        assert role["__etcd_backup_copy_account_in_place"] is False, other


STANZA = "Package: {name}\nStatus: {status}\nPriority: optional\nArchitecture: amd64\nVersion: 3.2.7\n"


@pytest.mark.parametrize(
    ("stanzas", "installed"),
    [
        ([("rsync", "install ok installed")], True),
        ([("jq", "install ok installed"), ("rsync", "hold ok installed"), ("zstd", "purge ok")], True),
        ([("rsync", "deinstall ok installed")], True),
        ([("rsync", "install ok half-configured")], False),
        ([("rsync", "install ok unpacked")], False),
        ([("rsync", "deinstall ok config-files")], False),
        ([("rsync", "install reinstreq half-installed")], False),
        ([("rsync-doc", "install ok installed"), ("librsync2", "install ok installed")], False),
        ([], False),
    ],
)
def test_rsync_is_installed_where_dpkg_says_so(
    tmp_path: Path, stanzas: list[tuple[str, str]], installed: bool
) -> None:
    """The control plane's read of rsync in dpkg's status file: the apt task is skipped only where a stanza of
    rsync says installed without an error flag (anything else: the apt task runs and decides)."""
    status = tmp_path / "status"
    status.write_text("\n".join(STANZA.format(name=n, status=s) for n, s in stanzas))
    edit = copy_role()["__etcd_backup_rsync_read"]
    failed, read = run_module(files_in_place, {"edits": [edit | {"path": str(status)}]})
    assert not failed, read["msg"]
    assert (read["differ"] == []) is installed


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("roles/etcd_backup/tasks/main.yml", "Find which of the backup's files differ"),
        ("roles/etcd_backup/tasks/copy-to-node.yml", "Find which of the receiving node's files differ"),
    ],
)
def test_the_reads_take_what_the_role_gives_them(path: str, name: str) -> None:
    """Both reads' reads for the role's logic (stat, slurp, edits, find), as the role templates them, are
    taken by the module (the files and units are tested on their own)."""
    role = copy_role(__model_sync_rrsync="/usr/bin/rrsync")
    task = task_in(path, name)["files_in_place"]
    args = {key: role.template(task[key]) for key in ("stat", "slurp", "edits", "find") if key in task}
    assert all(isinstance(args[key], list) for key in args), args
    failed, read = run_module(files_in_place, args)
    assert not failed, read["msg"]
