"""The values roles hand their reads (files_in_place's edits, packages_in_place's venvs), rendered from the
roles' own variables, and the gates built on the reads' results: an edit the read calls in place is one its
task would leave as it is, and a read that finds something not as wanted lets the task run.

The no-op rules themselves are held to the builtin modules in test_files_in_place.py; here the roles' inputs.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any
from unittest import mock

import files_in_place
import pytest
import yaml
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from ansible_collections.community.general.plugins.modules import sudoers as real_sudoers_module
from conftest import run_module
from role_render import RoleVars

ROOT = Path(__file__).resolve().parents[2]
HOSTS = {"gpu-node-1": {"node_ip": "10.89.42.11"}, "gpu-node-2": {"ansible_host": "10.89.42.12"}}


def common(host: str = "gpu-node-1", **overrides: Any) -> RoleVars:
    return RoleVars(
        "common",
        inventory_hostname=host,
        groups={"k8s_cluster": list(HOSTS)},
        hostvars=HOSTS,
        **overrides,
    )


def edits_by_path(role: RoleVars) -> dict[str, dict[str, Any]]:
    return {edit["path"]: edit for edit in role["__common_edits"]}


def edit_in_place(edit: dict[str, Any], tmp_path: Path, content: str) -> bool:
    """The real module's verdict on ``edit`` (its owner, group and mode left out) over a file holding
    ``content``."""
    path = tmp_path / "edited"
    path.write_text(content)
    entry = {k: v for k, v in edit.items() if k not in ("owner", "group", "mode")} | {"path": str(path)}
    failed, result = run_module(files_in_place, {"edits": [entry]})
    assert not failed, result["msg"]
    return result["in_place"]


@pytest.mark.parametrize(
    ("content", "in_place"),
    [
        ("gpu-node-1", True),  # as podman writes it
        ("gpu-node-1\n", True),  # as hostnamectl writes it
        ("gpu-node-10\n", False),
        ("xgpu-node-1\n", False),
        ("gpu-node-1\n\n", False),
        ("# a comment\ngpu-node-1\n", False),
        ("other\n", False),
        ("", False),
    ],
)
def test_the_host_name_file_is_in_place_only_holding_the_name(tmp_path, content, in_place):
    edit = edits_by_path(common())[common()["__common_hostname_file"]]
    assert edit_in_place(edit, tmp_path, content) is in_place


def test_a_host_name_is_matched_literally():
    edit = edits_by_path(common("gpu.node"))["/etc/hostname"]
    assert re.search(edit["absent_regexp"], "gpu.node\n", re.MULTILINE) is None
    assert re.search(edit["absent_regexp"], "gpuxnode\n", re.MULTILINE) is not None


def test_no_host_name_edit_where_the_role_leaves_the_name_alone():
    assert "/etc/hostname" not in edits_by_path(common(common_hostname_manage=False))


def test_the_hosts_block_lists_every_cluster_node_between_the_tasks_markers(tmp_path):
    role = common()
    edit = edits_by_path(role)[role["__common_hosts_file"]]
    assert edit["block"] == "10.89.42.11 gpu-node-1\n10.89.42.12 gpu-node-2\n"
    assert (edit["owner"], edit["group"], edit["mode"]) == ("root", "root", "0644")
    begin, end = (edit["marker"].replace("{mark}", mark) for mark in ("BEGIN", "END"))
    written = f"127.0.0.1 localhost\n{begin}\n{edit['block']}{end}\n"
    assert edit_in_place(edit, tmp_path, written)
    assert not edit_in_place(edit, tmp_path, written.replace("10.89.42.12", "10.89.42.99"))
    assert not edit_in_place(edit, tmp_path, "127.0.0.1 localhost\n")


def test_the_sshd_include_line_and_the_swap_lines(tmp_path):
    role = common()
    edits = edits_by_path(role)
    include = edits[role["__common_sshd_config"]]
    assert edit_in_place(include, tmp_path, "# sshd\nInclude /etc/ssh/sshd_config.d/*.conf\nPort 22\n")
    assert not edit_in_place(include, tmp_path, "# sshd\nPort 22\n")
    swap = edits[role["__common_fstab"]]
    assert edit_in_place(swap, tmp_path, "/dev/sda1 / ext4 defaults 0 1\n# /swap.img none swap sw 0 0\n")
    assert not edit_in_place(swap, tmp_path, "/dev/sda1 / ext4 defaults 0 1\n/swap.img none swap sw 0 0\n")


def test_no_fstab_edit_where_swap_stays():
    assert "/etc/fstab" not in edits_by_path(common(common_swap_disable=False))


OPERATORS = [
    {"name": "ops", "ssh_public_keys": ["ssh-ed25519 AAAA"]},
    {"name": "auditor", "sudo": False},
    {"name": "leaver", "state": "absent"},
    {"name": "oncall", "state": "present", "sudo": True},
]


def sudoers_task() -> dict[str, Any]:
    tasks = yaml.safe_load((ROOT / "roles/common/tasks/ops_users.yml").read_text())
    (task,) = [t for t in tasks if t.get("name") == "Grant or revoke sudo"]
    return dict(task)


def sudoers_rules(**overrides: Any) -> dict[str, dict[str, Any]]:
    """The role's read of its operators' sudo rules (__common_ops_sudoers), by path."""
    return {
        rule["path"]: rule for rule in common(common_ops_users=OPERATORS, **overrides)["__common_ops_sudoers"]
    }


class SudoersExit(BaseException):
    """community.general.sudoers' exit: not an Exception, as its main() turns any Exception into a failure."""


def real_sudoers(args: dict[str, Any], directory: Path) -> bool:
    """community.general.sudoers, its main() whole, with the task's ARGS in DIRECTORY instead of
    /etc/sudoers.d; whether it changed anything. visudo is not on every test machine: its check (validation)
    is left out here (it only refuses a rule, and decides nothing about a rule in place)."""

    def exit_json(self: basic.AnsibleModule, **result: Any) -> None:
        raise SudoersExit(result)

    def fail_json(self: basic.AnsibleModule, msg: str, **result: Any) -> None:
        raise AssertionError(msg)

    with (
        patch_module_args(args | {"sudoers_path": str(directory), "validation": "absent"}),
        mock.patch.object(basic.AnsibleModule, "exit_json", exit_json),
        mock.patch.object(basic.AnsibleModule, "fail_json", fail_json),
        pytest.raises(SudoersExit) as done,
    ):
        real_sudoers_module.main()
    return bool(done.value.args[0]["changed"])


def rule_in_place(rule: dict[str, Any], path: Path) -> bool:
    """files_in_place's verdict on the role's RULE, read at PATH."""
    failed, result = run_module(files_in_place, {"files": [rule | {"path": str(path)}]})
    assert not failed, result["msg"]
    return bool(result["in_place"])


@pytest.mark.parametrize("nopasswd", [True, False])
@pytest.mark.parametrize("operator", OPERATORS, ids=[o["name"] for o in OPERATORS])
def test_a_sudo_rule_is_in_place_exactly_as_the_module_leaves_it(
    tmp_path: Path, operator: dict[str, Any], nopasswd: bool
) -> None:
    task = sudoers_task()
    role = common(common_ops_users=OPERATORS, common_ops_sudo_nopasswd=nopasswd, item=operator)
    args = role.template(task["community.general.sudoers"])
    # the file the task manages is the one the role reads
    path = role["__common_ops_sudoers_file"]
    assert path == f"{args['sudoers_path']}/{args['name']}"
    rule = sudoers_rules(common_ops_sudo_nopasswd=nopasswd)[path]
    local = tmp_path / args["name"]
    if args["state"] == "present":
        assert real_sudoers(args, tmp_path) is True
        assert rule_in_place(rule, local) is True
        assert real_sudoers(args, tmp_path) is False
        # the other tags, another mode: both differ, and the module writes again
        written = local.read_text()
        other = written.replace("NOPASSWD: ", " ") if nopasswd else written.replace("= ", "=NOPASSWD: ")
        for text, mode in ((other, 0o440), (written, 0o640)):
            local.write_text(text)
            local.chmod(mode)
            assert rule_in_place(rule, local) is False
            assert real_sudoers(args, tmp_path) is True
        local.unlink()
        assert rule_in_place(rule, local) is False
    else:
        assert rule == {"path": path, "state": "absent"}
        assert rule_in_place(rule, local) is True
        assert real_sudoers(args, tmp_path) is False
        local.write_text(f"{operator['name']} ALL=NOPASSWD: ALL\n")
        assert rule_in_place(rule, local) is False
        assert real_sudoers(args, tmp_path) is True


def test_the_sudo_task_runs_only_for_a_rule_the_read_found_otherwise() -> None:
    task = sudoers_task()
    rules = list(sudoers_rules())

    def runs(differ: list[str], operators: list[dict[str, Any]] = OPERATORS) -> list[str]:
        found = {"differ": differ}
        return [
            o["name"]
            for o in operators
            if common(common_ops_users=operators, __common_files_state=found, item=o).when(task["when"])
        ]

    assert runs([]) == []
    assert runs([rules[0], rules[2]]) == ["ops", "leaver"]
    # an operator listed twice is not read: each of its entries runs, as without the read
    twice = [*OPERATORS, {"name": "ops", "sudo": False}]
    assert "/etc/sudoers.d/ops-ops" not in [
        r["path"] for r in common(common_ops_users=twice)["__common_ops_sudoers"]
    ]
    assert runs([], twice) == ["ops", "ops"]


def nvidia_driver(differ: list[str], files_differ: list[str] | None = None) -> RoleVars:
    return RoleVars(
        "nvidia_driver",
        ansible_facts={"kernel": "5.15.0-105-generic"},
        __nvidia_driver_packages_found={"differ": differ, "in_place": not differ},
        __nvidia_driver_files_state={"differ": files_differ or []},
    )


def test_the_nvml_venv_alone_differing_leaves_the_driver_packages_in_place():
    venv = nvidia_driver([])["__nvidia_driver_nvml_venv"]
    role = nvidia_driver([venv])
    assert role["__nvidia_driver_apt_differ"] == []
    assert role["__nvidia_driver_packages_in_place"] is True
    assert role["__nvidia_driver_persistenced_unit_pending"] is False


def test_a_driver_package_differing_runs_the_package_and_persistenced_tasks():
    role = nvidia_driver(["nvidia-headless-535", nvidia_driver([])["__nvidia_driver_nvml_venv"]])
    assert role["__nvidia_driver_apt_differ"] == ["nvidia-headless-535"]
    assert role["__nvidia_driver_packages_in_place"] is False
    assert role["__nvidia_driver_persistenced_unit_pending"] is True


def test_the_pip_tasks_install_what_the_reads_read():
    """One home: the requirement the pip task installs is the one packages_in_place reads."""
    driver = nvidia_driver([])
    pin = driver["nvidia_driver_nvml_py_version"]
    assert driver["__nvidia_driver_nvml_requirement"] == f"nvidia-ml-py=={pin}"
    client = RoleVars("kubernetes_api_client")
    pin = client["kubernetes_api_client_version"]
    assert client["__kubernetes_api_client_requirement"] == f"kubernetes=={pin}"


TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


def taint_in_place(keep: bool, resources: list[dict[str, Any]]) -> bool:
    role = RoleVars(
        "kubeadm_control_plane",
        kubeadm_control_plane_keep_taint=keep,
        __kubeadm_control_plane_running={"resources": resources},
    )
    return role["__kubeadm_control_plane_taint_in_place"]


def node(*taints: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": list(taints)} if taints else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1"}, "spec": spec}


CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-proxy"}, "data": {}}


@pytest.mark.parametrize(
    ("keep", "resources", "in_place"),
    [
        (False, [CONFIGMAP, node()], True),
        (False, [node({"key": "gpu", "effect": "NoSchedule"})], True),
        (False, [node(TAINT)], False),
        (False, [node(TAINT | {"value": "x"})], False),
        (True, [node(TAINT)], True),
        (True, [node()], False),
        (True, [node(TAINT | {"value": "x"})], False),
        (True, [node(TAINT, TAINT)], False),
        (False, [CONFIGMAP], False),  # the Node was not found: the task runs (and says why it cannot)
        (True, [], False),
    ],
)
def test_the_control_plane_taint_task_runs_only_where_the_node_read_has_it_other_than_wanted(
    keep, resources, in_place
):
    assert taint_in_place(keep, resources) is in_place


def ca_copy_in_place(tmp_path: Path, copy: bytes | None, mode: int = 0o640, source: bytes = b"CA\n") -> bool:
    """gpu_health_agent's gate of its CA copy, over what files_in_place's stat really reads of a CA and a copy
    (the copy's group: the test's own, given as the agent's user's group)."""
    ca, agent_copy = tmp_path / "ca.crt", tmp_path / "agent-ca.crt"
    ca.write_bytes(source)
    agent_copy.unlink(missing_ok=True)
    if copy is not None:
        agent_copy.write_bytes(copy)
        agent_copy.chmod(mode)
    failed, read = run_module(files_in_place, {"stat": [str(ca), str(agent_copy)]})
    assert not failed, read["msg"]
    stat = read["stat"][str(agent_copy)]
    role = RoleVars(
        "gpu_health_agent",
        gpu_health_agent_ca_file=str(ca),
        __gpu_health_agent_ca=str(agent_copy),
        __gpu_health_agent_service_state=read,
        # the owner the copy task gives it is root; this test runs as whoever it is
        gpu_health_agent_user=stat.get("gr_name", "root"),
    )
    if stat["exists"] and stat["pw_name"] != "root":
        pytest.skip("the copy's owner must be root, as the copy task makes it")
    return bool(role["__gpu_health_agent_ca_in_place"])


def test_the_agents_ca_copy_is_copied_only_where_it_differs(tmp_path: Path) -> None:
    assert ca_copy_in_place(tmp_path, b"CA\n") is True
    assert ca_copy_in_place(tmp_path, b"old CA\n") is False
    assert ca_copy_in_place(tmp_path, b"CA\n", mode=0o644) is False
    assert ca_copy_in_place(tmp_path, None) is False


@pytest.mark.parametrize("member", [True, False])
def test_the_kubelet_is_started_in_a_cluster_with_or_without_the_roles_read(member: bool) -> None:
    """kubernetes_node's kubelet task takes the node's membership from the role's read (tasks/main.yml) or,
    entered alone by tasks_from (playbooks/tasks/upgrade-kubernetes-node.yml), from its own stat."""
    kubeconfig = "/etc/kubernetes/kubelet.conf"
    with_read = RoleVars(
        "kubernetes_node",
        __kubernetes_kubelet_kubeconfig=kubeconfig,
        __kubernetes_node_pin_state={"stat": {kubeconfig: {"exists": member}}},
    )
    alone = RoleVars(
        "kubernetes_node",
        __kubernetes_kubelet_kubeconfig=kubeconfig,
        __kubernetes_node_kubelet_conf={"stat": {"exists": member}},
    )
    assert with_read["__kubernetes_node_in_cluster"] is member
    assert alone["__kubernetes_node_in_cluster"] is member


# ------------------------------------------------------------ reads folded into a role's files_in_place read
def task_named(path: str, name: str) -> dict[str, Any]:
    """The task of roles/<path> named ``name`` (blocks walked into)."""
    found: list[dict[str, Any]] = []

    def walk(items: list[dict[str, Any]]) -> None:
        for task in items or []:
            if task.get("name") == name:
                found.append(task)
            for key in ("block", "rescue", "always"):
                walk(task.get(key) or [])

    walk(yaml.safe_load((ROOT / "roles" / path).read_text()))
    (task,) = found
    return task


COMMON_READ = (
    "Find which of the role's files and edits differ from what it writes, and whether chrony is enabled"
    " and running"
)
CLOUD_INIT_COPY = "Keep cloud-init from changing the host name ({{ common_cloud_init_dropin }})"


def cloud_init_copy_runs(
    tmp_path: Path,
    directory: bool,
    dropin: bytes | None = None,
    mode: int = 0o644,
    link: bool = False,
    manage: bool = True,
) -> bool:
    """Whether common's cloud-init drop-in copy (names.yml) runs, over what the role's read (tasks/main.yml:
    its stat of cloud-init's configuration directory and of the drop-in, __common_stat) really finds."""
    config_dir = tmp_path / "cloud.cfg.d"
    dest = config_dir / "99-llm-platform-hostname.cfg"
    if directory:
        config_dir.mkdir()
    if dropin is not None:
        written = tmp_path / "written.cfg" if link else dest
        written.write_bytes(dropin)
        written.chmod(mode)
        if link:
            dest.symlink_to(written)
    values = {"common_cloud_init_dropin": str(dest), "common_hostname_manage": manage}
    paths = common(**values)["__common_stat"]
    assert paths == ([str(config_dir), str(dest)] if manage else [])
    failed, read = run_module(files_in_place, {"stat": paths})
    assert not failed, read["msg"]
    if dropin is not None and not link and read["stat"][str(dest)]["uid"] != 0:
        pytest.skip("the drop-in's owner must be root, as the copy task makes it")
    role = common(**values, __common_files_state=read)
    return role.when(task_named("common/tasks/names.yml", CLOUD_INIT_COPY)["when"])


def test_the_cloud_init_drop_in_is_written_only_where_cloud_init_is_and_it_differs(tmp_path: Path) -> None:
    """The stat of cloud-init's configuration directory is one of common's read (no task of its own): the
    drop-in is written only where that directory exists, and only where it is not as the copy leaves it."""
    content = common()["__common_cloud_init_dropin_content"].encode()
    cases: dict[str, tuple[dict[str, Any], bool]] = {
        "no cloud-init": ({"directory": False}, False),
        "no drop-in yet": ({"directory": True}, True),
        "in place": ({"directory": True, "dropin": content}, False),
        "other content": ({"directory": True, "dropin": b"preserve_hostname: false\n"}, True),
        "other mode": ({"directory": True, "dropin": content, "mode": 0o600}, True),
        "a link": ({"directory": True, "dropin": content, "link": True}, True),  # the copy replaces it
        "name left alone": ({"directory": True, "manage": False}, False),
    }
    for case, (kwargs, expected) in cases.items():
        folder = tmp_path / case.replace(" ", "-")
        folder.mkdir()
        assert cloud_init_copy_runs(folder, **kwargs) is expected, case
    # no stat task of its own, and no entry of __common_files: where cloud-init is not installed that entry
    # would differ on every run (tests/lab/drift.py finds no read not in place on a converged node)
    read = task_named("common/tasks/main.yml", COMMON_READ)["files_in_place"]
    assert read["stat"] == "{{ __common_stat }}"
    for name in ("main.yml", "names.yml"):
        assert "ansible.builtin.stat" not in (ROOT / "roles/common/tasks" / name).read_text(), name
    entries = yaml.safe_load((ROOT / "roles/common/vars/main.yml").read_text())["__common_files"]
    assert [entry["path"] for entry in entries if "cloud_init" in entry["path"]] == []


KUBELET_CONF = yaml.safe_load((ROOT / "roles/kubernetes/vars/main.yml").read_text())[
    "__kubernetes_kubelet_kubeconfig"
]
JOIN_GROUPS = {"control_plane": ["gpu-node-1"], "workers": ["gpu-node-2", "gpu-node-3"]}


def kubeadm_join_steps(host: str = "gpu-node-2", **state: Any) -> tuple[bool, bool | None]:
    """(whether kubeadm_join's stat runs, whether it then joins: None where the stat would decide) for a
    host whose earlier tasks of the run registered ``state``."""
    values = {
        "inventory_hostname": host,
        "groups": JOIN_GROUPS,
        "__kubernetes_kubelet_kubeconfig": KUBELET_CONF,
    }
    stat = task_named("kubeadm_join/tasks/main.yml", "Look for this node's kubelet kubeconfig")
    join = task_named("kubeadm_join/tasks/main.yml", "Join the cluster")
    assert stat["ansible.builtin.stat"]["path"] == "{{ __kubernetes_kubelet_kubeconfig }}"
    stats = RoleVars("kubeadm_join", **values, **state).when(stat["when"])
    if stats:
        return True, None
    return False, RoleVars("kubeadm_join", **values, **state).when(join["when"])


def test_kubeadm_join_takes_the_nodes_membership_from_kubernetes_nodes_read() -> None:
    """kubernetes_node's read (tasks/main.yml there) stats the kubelet kubeconfig on every node before
    kubeadm_join runs on the workers (playbooks/kubernetes.yml): a worker takes whether it joined from it; the
    stat runs where that read is not there or where something since can have written the file."""
    read = task_named(
        "kubernetes_node/tasks/main.yml",
        "Find whether the role's apt pin differs from what it writes, and the kubelet's unit",
    )
    assert read["files_in_place"]["stat"] == ["{{ __kubernetes_kubelet_kubeconfig }}"]

    def pin_state(exists: bool) -> dict[str, Any]:
        return {"__kubernetes_node_pin_state": {"differ": [], "stat": {KUBELET_CONF: {"exists": exists}}}}

    assert kubeadm_join_steps(**pin_state(True)) == (False, False)  # joined: nothing runs
    assert kubeadm_join_steps(**pin_state(False)) == (False, True)  # a fresh or reset worker joins
    # the role alone (no kubernetes_node before it), or that read skipped: its own stat
    assert kubeadm_join_steps() == (True, None)
    assert kubeadm_join_steps(__kubernetes_node_pin_state={"changed": False, "skipped": True}) == (True, None)
    # a host of control_plane too: kubeadm init (kubeadm_control_plane) runs between the read and the role
    assert kubeadm_join_steps("gpu-node-1", **pin_state(False)) == (True, None)
    # after a join of this run (join.yml registered its result, ran or skipped)
    assert kubeadm_join_steps(**pin_state(False), __kubeadm_join_result={"rc": 0}) == (True, None)
    # where the stat ran, it decides
    for exists in (True, False):
        role = RoleVars(
            "kubeadm_join",
            inventory_hostname="gpu-node-1",
            groups=JOIN_GROUPS,
            __kubernetes_kubelet_kubeconfig=KUBELET_CONF,
            **pin_state(not exists),
            __kubeadm_join_kubelet_conf={"stat": {"exists": exists}},
        )
        joins = role.when(task_named("kubeadm_join/tasks/main.yml", "Join the cluster")["when"])
        assert joins is (not exists)


DRIVER_READ = "Find which of the role's files differ from what it writes, and nvidia-persistenced's unit"
RECORD_SLURP = "Look for what an earlier run stopped and did not put back"
RECORD = {
    "units": [],
    "node_label": {"nvidia.com/gpu.present": "true"},
    "daemonsets": ["monitoring/dcgm-exporter"],
}


def record_taken(**state: Any) -> tuple[bool, dict[str, Any]]:
    """(whether start-gpu-clients.yml slurps the record itself, the record's read it takes) for a host where
    the earlier tasks left ``state``; where it slurps, the slurp finds RECORD (an earlier run's)."""
    slurp = task_named("nvidia_driver/tasks/start-gpu-clients.yml", RECORD_SLURP)
    slurps = RoleVars("nvidia_driver", **state).when(slurp["when"])
    left = (
        {"content": base64.b64encode(json.dumps(RECORD).encode()).decode(), "encoding": "base64"}
        if slurps
        else {"changed": False, "skipped": True}
    )
    role = RoleVars("nvidia_driver", **state, __nvidia_driver_gpu_clients_left=left)
    taken = role["__nvidia_driver_gpu_clients_found"]
    return slurps, dict(taken)


def test_the_gpu_clients_record_is_read_again_only_where_the_run_may_have_changed_it() -> None:
    """nvidia_driver's read slurps the record an interrupted run left; start-gpu-clients.yml (in the role's
    `always`) takes it from there unless this run stopped or put back clients since (which write and remove
    it), and slurps it itself where it is entered without that read (tasks_from)."""
    record = RoleVars("nvidia_driver")["__nvidia_driver_gpu_clients_record"]
    read = task_named("nvidia_driver/tasks/main.yml", DRIVER_READ)["files_in_place"]
    assert read["slurp"] == ["{{ __nvidia_driver_gpu_clients_record }}"]
    include = task_named(
        "nvidia_driver/tasks/main.yml",
        "Start the cluster's own GPU clients again (what this run or an interrupted one stopped)",
    )
    passed = RoleVars(
        "nvidia_driver", __nvidia_driver_files_state={"differ": [], "stat": {}, "slurp": {record: {}}}
    ).template(include["vars"]["__nvidia_driver_gpu_clients_record_read"])
    assert passed == {}
    note = task_named("nvidia_driver/tasks/start-gpu-clients.yml", "Note what to put back")
    restore = note["ansible.builtin.set_fact"]["__nvidia_driver_gpu_clients_restore"]
    assert "__nvidia_driver_gpu_clients_found.content" in restore

    encoded = {"content": base64.b64encode(json.dumps(RECORD).encode()).decode(), "encoding": "base64"}
    # a converged node: the read found no record, nothing since changed it; no slurp, nothing to put back
    assert record_taken(__nvidia_driver_gpu_clients_record_read={}) == (False, {})
    # an interrupted earlier run's record, found by the read
    assert record_taken(__nvidia_driver_gpu_clients_record_read=encoded) == (False, encoded)
    # this run stopped clients (stop-gpu-clients.yml wrote the record) or put them back (removed it)
    for stopped in (RECORD, {}):
        slurps, taken = record_taken(
            __nvidia_driver_gpu_clients_record_read={}, __nvidia_driver_gpu_clients_stopped=stopped
        )
        assert slurps and json.loads(base64.b64decode(taken["content"])) == RECORD
    # entered by tasks_from (upgrade-driver-node.yml, the remediation playbooks): no read passed
    assert record_taken()[0] is True
