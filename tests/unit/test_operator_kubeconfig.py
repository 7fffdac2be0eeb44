"""Operators' own kubeconfigs (roles/kubeadm_control_plane/tasks/operator-kubeconfigs.yml): the real kubeadm
of the production pin (real_kube.py) issues them with `kubeconfig user --config`, as the role runs it, from a
cluster CA it made itself (`init phase certs ca`), and the role's filter tells a personal kubeconfig from the
admin one, a stale CA or a certificate about to run out. On the lab: test_kubernetes_stage_on_lab.py."""

from __future__ import annotations

import base64
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import real_kube
import yaml

ROOT = Path(__file__).resolve().parents[2]

# certificatesDir: the cluster's PKI in the test's directory instead of /etc/kubernetes/pki
CONFIG = """\
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint: {{advertiseAddress: 10.89.42.11, bindPort: 6443}}
nodeRegistration: {{name: gpu-node-1}}
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: {version}
certificatesDir: {pki}
"""


def identity_filter() -> ModuleType:
    path = ROOT / "roles/kubeadm_control_plane/filter_plugins/kubeconfig_identity.py"
    spec = importlib.util.spec_from_file_location("kubeconfig_identity", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config(root: Path) -> str:
    """The kubeadm configuration of the cluster whose PKI is under ROOT."""
    path = root / "kubeadm-config.yaml"
    pki = root / "etc/kubernetes/pki"
    path.write_text(CONFIG.format(version=real_kube.kubernetes_version(), pki=pki))
    return str(path)


def make_ca(root: Path) -> Path:
    made = real_kube.kubeadm("init", "phase", "certs", "ca", "--config", config(root))
    assert made.returncode == 0, made.stderr
    return root / "etc/kubernetes/pki/ca.crt"


def kubeadm(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubeadm kubeconfig user --config F ARGS`, as the role runs it."""
    return real_kube.kubeadm("kubeconfig", "user", "--config", config(root), *args)


@pytest.fixture
def cluster(tmp_path: Path) -> tuple[Path, str]:
    return tmp_path, make_ca(tmp_path).read_text()


def test_kubeconfig_user_issues_a_personal_certificate_from_the_cluster_ca(cluster: tuple[Path, str]) -> None:
    root, ca = cluster
    made = kubeadm(root, "--client-name", "ops", "--validity-period", "48h")
    assert made.returncode == 0, made.stderr
    config = yaml.safe_load(made.stdout)
    assert config["current-context"] == "ops@kubernetes"
    assert config["users"][0]["name"] == "ops"
    who = identity_filter().kubeconfig_client_identity(made.stdout, ca)
    assert who["name"] == "ops" and who["groups"] == []
    assert who["issued_by_ca"] is True
    assert who["server"] == "https://10.89.42.11:6443"
    assert 1.99 < who["days_left"] <= 2.0  # 48 h from now
    assert not (root / "etc/kubernetes/ops.conf").exists()  # printed, nothing written


def test_orgs_are_the_certificate_organisations(cluster: tuple[Path, str]) -> None:
    root, ca = cluster
    made = kubeadm(root, "--client-name", "ops", "--org", "a,b", "--org", "c")
    assert made.returncode == 0, made.stderr
    assert identity_filter().kubeconfig_client_identity(made.stdout, ca)["groups"] == ["a", "b", "c"]


def test_a_missing_client_name_or_ca_or_a_bad_duration_is_an_error(tmp_path: Path) -> None:
    assert 'required flag(s) "client-name" not set' in kubeadm(tmp_path).stderr
    bad = kubeadm(tmp_path, "--client-name", "ops", "--validity-period", "8760")
    assert bad.returncode == 1, bad.stderr
    assert 'invalid argument "8760" for "--validity-period" flag: time: missing unit' in bad.stderr
    missing = kubeadm(tmp_path, "--client-name", "ops")
    assert missing.returncode == 1, missing.stderr
    assert "the CA files couldn't be loaded" in missing.stderr and "pki/ca.crt" in missing.stderr


def test_the_filter_tells_what_needs_a_new_kubeconfig(cluster: tuple[Path, str], tmp_path_factory) -> None:
    root, ca = cluster
    identity = identity_filter().kubeconfig_client_identity
    admin = kubeadm(root, "--client-name", "kubernetes-admin", "--org", "kubeadm:cluster-admins").stdout
    assert identity(admin, ca)["name"] == "kubernetes-admin"  # a copy of admin.conf: not the operator's own

    other_root = tmp_path_factory.mktemp("other-cluster")
    other_ca = make_ca(other_root).read_text()
    assert identity(admin, other_ca)["issued_by_ca"] is False  # the cluster was re-created since
    assert identity(admin, "")["issued_by_ca"] is False

    year = kubeadm(root, "--client-name", "ops").stdout
    in_2099 = identity(year, ca, now="2099-01-01T00:00:00+00:00")
    assert in_2099["days_left"] < 0  # long expired by then

    for broken in ("", "not: [yaml", "apiVersion: v1\nkind: Config\n", "users: 3"):
        assert identity(broken, ca) == {
            "name": "",
            "groups": [],
            "not_after": "",
            "days_left": 0.0,
            "issued_by_ca": False,
            "server": "",
        }


def crb(name: str, labels: dict[str, str] | None) -> dict[str, object]:
    metadata: dict[str, object] = {"name": name, **({"labels": labels} if labels is not None else {})}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": metadata}


MINE = {"app.kubernetes.io/managed-by": "kubeadm_control_plane"}
OPERATOR = "llm-platform.io/operator"
# every ClusterRoleBinding, as the role's read of the API finds them (all_of), beside the objects it reads
READ = [
    {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
    },
    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cp-1", "labels": {**MINE, OPERATOR: "x"}}},
    crb("cluster-admin", {"kubernetes.io/bootstrapping": "rbac-defaults"}),
    crb("kubeadm:cluster-admins", None),
    crb("labelled-none", {}),
    crb("mine-without-operator", MINE),
    crb("llm-platform:operator:eve", {"app.kubernetes.io/managed-by": "someone-else", OPERATOR: "eve"}),
    *[crb(f"llm-platform:operator:{who}", {**MINE, OPERATOR: who}) for who in ("ops", "alice", "bob")],
]


@pytest.mark.parametrize(
    ("reads", "runs_own_read", "held"),
    [
        # the role's run: its first read of the API (compare-running-config.yml) brought them
        ({"__kubeadm_control_plane_running": {"resources": READ}}, False, ["ops", "alice", "bob"]),
        # operator-kubeconfigs.yml alone (renew-certs.yml): its own read
        ({"__kubeadm_control_plane_operator_bindings": {"resources": READ}}, True, ["ops", "alice", "bob"]),
        # no cluster (--check on a fresh server): neither read runs
        ({"__kubeadm_control_plane_has_cluster": False, "__kubeadm_control_plane_running": {"skipped": True},
          "__kubeadm_control_plane_operator_bindings": {"skipped": True}}, False, []),
    ],
    ids=["role-run", "tasks-from-alone", "no-cluster"],
)  # fmt: skip
def test_only_the_bindings_of_operators_no_longer_listed_are_deleted(
    tmp_path: Path, reads: dict[str, object], runs_own_read: bool, held: list[str]
) -> None:
    """The role's bindings, of every ClusterRoleBinding one read found (labelled managed-by
    kubeadm_control_plane, with the llm-platform.io/operator key), as Ansible renders the role's variable;
    the delete loop over them; operator-kubeconfigs.yml reads them itself only where the role's first read did
    not (a run of the file alone)."""
    tasks = yaml.safe_load((ROOT / "roles/kubeadm_control_plane/tasks/operator-kubeconfigs.yml").read_text())
    (delete,) = [t for t in tasks if t["name"].startswith("Delete the bindings of operators")]
    (own_read,) = [t for t in tasks if t["name"] == "Read the operators' bindings the cluster holds"]
    assert own_read["k8s_live_objects"]["all_of"] == [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding"}
    ]
    (bind,) = [t for t in tasks if t["name"].startswith("Bind each operator")]
    assert "__kubeadm_control_plane_operator_bindings_held" in bind["when"][1]
    role_vars = yaml.safe_load((ROOT / "roles/kubeadm_control_plane/vars/main.yml").read_text())
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                "__kubeadm_control_plane_has_cluster": True,
                **reads,
                "__kubeadm_control_plane_operator_bindings_held": role_vars[
                    "__kubeadm_control_plane_operator_bindings_held"
                ],
                "kubeadm_control_plane_operators": ["ops", "carol"],
            },
            "tasks": [
                {"ansible.builtin.debug": {"msg": "own read"}, "when": own_read["when"]},
                {
                    "ansible.builtin.debug": {
                        "msg": "held {{ item.metadata.labels['llm-platform.io/operator'] }}"
                    },
                    "loop": "{{ __kubeadm_control_plane_operator_bindings_held }}",
                },
                {"ansible.builtin.debug": {"msg": "deleting {{ item }}"}, "loop": delete["loop"]},
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    run = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-c", "local", "play.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={
            "PATH": "/usr/bin:/bin",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FILTER_PLUGINS": str(ROOT / "plugins/filter"),
        },
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:]
    assert ('"own read"' in run.stdout) == runs_own_read, run.stdout[-2000:]
    assert re.findall(r'"held (\S+)"', run.stdout) == held, run.stdout[-2000:]
    deleted = sorted(set(re.findall(r'"deleting (\S+)"', run.stdout)))
    expected = ["llm-platform:operator:alice", "llm-platform:operator:bob"] if held else []
    assert deleted == expected, run.stdout[-2000:]


def test_the_role_reads_the_bindings_with_the_running_configuration_before_it_uses_them() -> None:
    """compare-running-config.yml's read (every ClusterRoleBinding, all_of) runs where the cluster is, before
    operator-kubeconfigs.yml, as the k8s_info of the bindings it replaces did."""
    tasks_dir = ROOT / "roles/kubeadm_control_plane/tasks"
    (read,) = [t for t in yaml.safe_load((tasks_dir / "compare-running-config.yml").read_text())
               if "k8s_live_objects" in t]  # fmt: skip
    assert read["register"] == "__kubeadm_control_plane_running"
    assert read["when"] == "__kubeadm_control_plane_has_cluster"
    assert {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding"} in read[
        "k8s_live_objects"
    ]["all_of"]
    main = [
        t.get("ansible.builtin.import_tasks") for t in yaml.safe_load((tasks_dir / "main.yml").read_text())
    ]
    assert main.index("compare-running-config.yml") < main.index("operator-kubeconfigs.yml")
    for between in main[
        main.index("compare-running-config.yml") + 1 : main.index("operator-kubeconfigs.yml")
    ]:
        assert "ClusterRoleBinding" not in (tasks_dir / between).read_text(), between


def passwd_vars(role_vars: dict[str, Any]) -> dict[str, Any]:
    """The role's vars the accounts are made of besides getent's read (/etc/passwd as first read)."""
    names = ("__kubeadm_control_plane_passwd", "__kubeadm_control_plane_passwd_files_first")
    return {name: role_vars[name] for name in names}


def test_the_role_decides_who_gets_a_new_kubeconfig_and_says_why(
    cluster: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The role's decision, rendered by Ansible with the filter, over every case a run can find."""
    root, ca = cluster
    other = tmp_path_factory.mktemp("other")
    make_ca(other)
    found = {
        "ok": kubeadm(root, "--client-name", "ok").stdout,
        "copy": kubeadm(root, "--client-name", "kubernetes-admin", "--org", "kubeadm:cluster-admins").stdout,
        "stale": kubeadm(other, "--client-name", "stale").stdout,
        "soon": kubeadm(root, "--client-name", "soon", "--validity-period", "240h").stdout,
        "grouped": kubeadm(root, "--client-name", "grouped", "--org", "system:masters").stdout,
        "none": "",
    }
    b64 = base64.b64encode
    entries = [
        {"item": name, "ansible_facts": {"getent_passwd": {name: ["x", "1", "1", "", f"/home/{name}"]}}}
        for name in found
    ]
    # as the role's one read answers: each kubeconfig's content, {} for one that is missing
    slurped = {
        f"/home/{name}/.kube/config": {"content": b64(text.encode()).decode()} if text else {}
        for name, text in found.items()
    }
    slurped["/etc/kubernetes/pki/ca.crt"] = {"content": b64(ca.encode()).decode()}
    tasks = yaml.safe_load((ROOT / "roles/kubeadm_control_plane/tasks/operator-kubeconfigs.yml").read_text())
    (decide,) = [t for t in tasks if t["name"].startswith("Decide which operators")]
    role_vars = yaml.safe_load((ROOT / "roles/kubeadm_control_plane/vars/main.yml").read_text())
    accounts = role_vars["__kubeadm_control_plane_operator_accounts"]
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                "__kubeadm_control_plane_operator_entries": {"results": entries},
                "__kubeadm_control_plane_operator_accounts": accounts,
                **passwd_vars(role_vars),
                "__kubeadm_control_plane_operator_reads": {"slurp": slurped},
                "__kubeadm_control_plane_has_cluster": True,
                "kubeadm_control_plane_operator_cert_renew_days": 30,
            },
            "tasks": [
                decide,
                {
                    "ansible.builtin.copy": {
                        "content": "{{ __kubeadm_control_plane_operators_to_issue | to_json }}",
                        "dest": str(tmp_path_factory.getbasetemp() / "decided.json"),
                    }
                },
            ],
        }
    ]
    folder = tmp_path_factory.mktemp("play")
    (folder / "play.yml").write_text(yaml.safe_dump(play))
    env = {
        "PATH": "/usr/bin:/bin",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FILTER_PLUGINS": str(ROOT / "roles/kubeadm_control_plane/filter_plugins"),
    }
    run = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "play.yml",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:]
    decided = {
        d["name"]: d["why"] for d in json.loads((tmp_path_factory.getbasetemp() / "decided.json").read_text())
    }
    assert set(decided) == {"copy", "stale", "soon", "grouped", "none"}, decided  # "ok" keeps its own
    assert decided["copy"] == "it authenticates as kubernetes-admin, not copy"
    assert decided["stale"] == "its certificate is not from this cluster CA"
    assert decided["soon"].startswith("its certificate ends in 10.0 days")
    assert decided["grouped"].startswith("its certificate carries groups system:masters")
    assert decided["none"] == "no kubeconfig with a client certificate"


def test_a_fresh_server_gets_each_operators_kube_directory(tmp_path: Path) -> None:
    """The role's own directory task over the accounts its read makes, where ~/.kube is not there yet (a new
    server's first run): made, the operator's and mode 0700. A key the accounts lack fails the task."""
    tasks = yaml.safe_load((ROOT / "roles/kubeadm_control_plane/tasks/operator-kubeconfigs.yml").read_text())
    (create,) = [t for t in tasks if t["name"] == "Create the operators' ~/.kube"]
    role_vars = yaml.safe_load((ROOT / "roles/kubeadm_control_plane/vars/main.yml").read_text())
    home = tmp_path / "home"
    home.mkdir()
    entry = {"item": "root", "ansible_facts": {"getent_passwd": {"root": ["x", "0", "0", "", str(home)]}}}
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                "__kubeadm_control_plane_operator_entries": {"results": [entry]},
                "__kubeadm_control_plane_operator_accounts": role_vars[
                    "__kubeadm_control_plane_operator_accounts"
                ],
                **passwd_vars(role_vars),
                "__kubeadm_control_plane_operator_reads": {"differ": [str(home / ".kube")]},
            },
            "tasks": [create],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    run = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-c", "local", "play.yml",
         "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"},
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    made = (home / ".kube").stat()
    assert (made.st_mode & 0o777, made.st_uid, made.st_gid) == (0o700, 0, 0)


def test_the_operators_homes_are_read_from_passwd_as_getent_answers() -> None:
    """The role's first read (render-config.yml) takes /etc/passwd and /etc/nsswitch.conf; where the name
    service reads the file first, the accounts made of it are those getent's read makes, and getent looks up
    only the operators the file does not hold."""
    import ansible.modules.getent as real_getent
    import files_in_place
    from conftest import run_module
    from role_render import RoleVars

    names = ["root", "daemon"]
    failed, read = run_module(files_in_place, {"slurp": ["/etc/passwd", "/etc/nsswitch.conf"]})
    assert not failed, read["msg"]
    entries = []
    for name in names:
        failed, found = run_module(real_getent, {"database": "passwd", "key": name})
        assert not failed, found["msg"]
        entries.append({"item": name, "ansible_facts": found["ansible_facts"]})

    def role(slurp: dict[str, Any], **registered: Any) -> RoleVars:
        return RoleVars(
            "kubeadm_control_plane",
            kubeadm_control_plane_operators=names,
            __kubeadm_control_plane_files_state={"slurp": slurp},
            **registered,
        )

    by_getent = role({}, __kubeadm_control_plane_operator_entries={"results": entries})
    assert by_getent["__kubeadm_control_plane_operators_unread"] == names
    accounts = by_getent["__kubeadm_control_plane_operator_accounts"]
    assert [a["name"] for a in accounts] == names
    by_file = role(read["slurp"], __kubeadm_control_plane_operator_entries={"results": []})
    if re.search(r"(?m)^passwd:[ \t]*files\s", Path("/etc/nsswitch.conf").read_text()):
        assert by_file["__kubeadm_control_plane_operators_unread"] == []
        assert by_file["__kubeadm_control_plane_operator_accounts"] == accounts

    def b64(text: str) -> dict[str, str]:
        return {"content": base64.b64encode(text.encode()).decode()}

    passwd = "root:x:0:0:root:/root:/bin/bash\nbad:line\nroot:x:0:0:again:/elsewhere:/bin/sh\n"
    for nsswitch, read_here in (
        ("passwd:         files systemd\n", True),
        ("passwd: files\n", True),
        ("# passwd: files\npasswd: sss files\n", False),
        ("passwd: compat\n", False),
        ("passwd: filesystem\n", False),
        ("", False),
    ):
        got = role({"/etc/passwd": b64(passwd), "/etc/nsswitch.conf": b64(nsswitch)})
        unread = ["daemon"] if read_here else names
        assert got["__kubeadm_control_plane_operators_unread"] == unread, nsswitch
        if read_here:  # the first line of a name, as getent's
            (root,) = got["__kubeadm_control_plane_operator_accounts"]
            assert root == {"name": "root", "home": "/root", "group": "0", "path": "/root/.kube"}
