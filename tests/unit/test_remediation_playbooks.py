"""The remediation playbooks of issue 11 (playbooks/remediate/): syntax, --check support, secrets kept out
of output and tarballs, and reuse of the roles' task files (include_role) instead of copies.

Their behaviour on the lab (faults injected and fixed) is tests/lab/test_remediation_on_lab.py."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
REMEDIATE = ROOT / "playbooks" / "remediate"
PLAYBOOKS = [
    "driver-mismatch.yml",
    "restart-device-plugin.yml",
    "resync-models.yml",
    "collect-diagnostics.yml",
    "etcd-restore.yml",
    "renew-certs.yml",
    "gpu-reset.yml",
    "node-reboot.yml",
]
TOKEN = re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}")


def load(name: str) -> list[dict[str, Any]]:
    return yaml.safe_load((REMEDIATE / name).read_text())


def tasks(play: dict[str, Any]) -> list[dict[str, Any]]:
    """Every task of a play, blocks flattened (with the block's keywords merged into its tasks)."""
    out: list[dict[str, Any]] = []

    def walk(items: list[dict[str, Any]], inherited: dict[str, Any]) -> None:
        for task in items or []:
            if "block" in task:
                keywords = {k: v for k, v in task.items() if k not in ("block", "rescue", "always", "name")}
                for part in ("block", "rescue", "always"):
                    walk(task.get(part, []), {**inherited, **keywords})
            else:
                out.append({**inherited, **task})

    for section in ("pre_tasks", "tasks", "post_tasks"):
        walk(play.get(section, []), {})
    return out


def all_tasks(name: str) -> list[dict[str, Any]]:
    return [t for play in load(name) for t in tasks(play)]


def module_of(task: dict[str, Any]) -> str:
    keywords = {
        "name", "when", "register", "loop", "loop_control", "vars", "delegate_to", "run_once", "become",
        "become_user", "changed_when", "failed_when", "check_mode", "no_log", "until", "retries", "delay",
        "tags", "notify", "environment", "args", "ignore_errors", "delegate_facts", "module_defaults",
        "ignore_unreachable",
    }  # fmt: skip
    modules = [k for k in task if k not in keywords]
    assert len(modules) == 1, f"cannot tell the module of {task.get('name')}: {modules}"
    return modules[0]


def test_syntax_check() -> None:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "inventories/lab/hosts.yml",
            "--syntax-check",
            *[f"playbooks/remediate/{name}" for name in PLAYBOOKS],
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", PLAYBOOKS)
def test_documented_and_summarised(name: str) -> None:
    text = (REMEDIATE / name).read_text()
    header = text.split("\n- name:")[0]
    assert "--check" in header and "docs/runbook.md" in header, f"{name}: the header says how to run it"
    names = [str(t.get("name", "")) for t in all_tasks(name)]
    assert any(n.startswith("Summary") or "Summary" in n for n in names), f"{name} ends with a summary"
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    assert f"playbooks/remediate/{name}" in runbook, f"docs/runbook.md tells when to run {name}"


@pytest.mark.parametrize("name", PLAYBOOKS)
def test_reads_run_in_check_mode(name: str) -> None:
    """--check tells the truth: what a playbook reads to decide (NVML, /proc, manifests, journals, HTTP) is
    read in check mode too, never skipped; a command that only reads says so (changed_when: false)."""
    for task in all_tasks(name):
        module = module_of(task)
        if module in ("gpu_facts", "ansible.builtin.uri") or (
            module == "model_manifest" and task[module].get("state") == "verify"
        ):
            assert task.get("check_mode") is False, f"{name}: '{task['name']}' must read in check mode"
        if module == "ansible.builtin.command" and task.get("changed_when") is False:
            assert task.get("check_mode") is False, f"{name}: '{task['name']}' reads: check_mode: false"


@pytest.mark.parametrize("name", PLAYBOOKS)
def test_api_client_settings_from_the_role_not_vars_files(name: str) -> None:
    """vars_files outrank group_vars: the API client's venv (and any role value) comes through include_role
    public, so an inventory's value wins as it does for the roles."""
    for play in load(name):
        assert "vars_files" not in play, f"{name}: {play['name']} uses vars_files"
        if "kubernetes_api_client_python" in str(play) and "tasks" in play:
            loads = [
                t["ansible.builtin.include_role"]
                for t in tasks(play)
                if module_of(t) == "ansible.builtin.include_role"
                and t["ansible.builtin.include_role"]["name"] == "kubernetes_api_client"
            ]
            if not loads:  # loaded with the other roles' settings, in one loop
                loads = [
                    {**t["ansible.builtin.include_role"], "name": "kubernetes_api_client"}
                    for t in tasks(play)
                    if module_of(t) == "ansible.builtin.include_role"
                    and "kubernetes_api_client" in t.get("loop", [])
                ]
            assert loads == [{"name": "kubernetes_api_client", "tasks_from": "validate", "public": True}], (
                name
            )


def test_driver_mismatch_reuses_the_driver_role_one_node_at_a_time() -> None:
    (play, _summary) = load("driver-mismatch.yml")
    assert play["serial"] == 1 and play["max_fail_percentage"] == 0
    included = [
        t["ansible.builtin.include_role"]
        for t in tasks(play)
        if module_of(t) == "ansible.builtin.include_role"
    ]
    assert {i["name"] for i in included} == {"nvidia_driver", "kubernetes_api_client"}
    included = [i for i in included if i["name"] == "nvidia_driver"]
    files = {i["tasks_from"] for i in included}
    assert {
        "validate",
        "read-gpu-facts",
        "find-gpu-workloads",
        "fix-version-mismatch",
        "reboot-if-needed",
    } <= files
    for f in files:
        assert (ROOT / "roles" / "nvidia_driver" / "tasks" / f"{f}.yml").is_file()
    # no copy of the role's reload or reboot: those modules appear only in the role
    modules = {module_of(t) for t in tasks(play)}
    assert not modules & {
        "community.general.modprobe",
        "ansible.builtin.reboot",
        "ansible.builtin.systemd_service",
    }
    assert "plan_only" in play["vars"] and play["vars"]["drain"] is False
    drains = [t for t in tasks(play) if module_of(t) == "kubernetes.core.k8s_drain"]
    assert drains and all("ansible_check_mode" in str(t.get("when")) or "uncordon" in str(t) for t in drains)


def test_restart_device_plugin_deletes_only_plugin_pods() -> None:
    plays = load("restart-device-plugin.yml")
    api = [t for t in tasks(plays[1]) if module_of(t).startswith("kubernetes.core.")]
    changes = [t for t in api if module_of(t) == "kubernetes.core.k8s"]
    assert len(changes) == 1
    change = changes[0]["kubernetes.core.k8s"]
    assert change["state"] == "absent" and change["kind"] == "Pod"  # the DaemonSet recreates it
    assert "k8s-device-plugin" in str(plays[1]["vars"]["device_plugin_image"])
    waits = [t for t in api if "until" in t]
    assert waits and "not ansible_check_mode" in str(waits[0]["when"])


def test_resync_models_reuses_the_model_stage() -> None:
    (play,) = load("resync-models.yml")
    assert play["roles"] == [{"role": "model_sync"}]
    included = [t for t in tasks(play) if module_of(t) == "ansible.builtin.include_role"]
    assert [i["ansible.builtin.include_role"] for i in included] == [
        {"name": "model_sync", "tasks_from": "validate", "public": True}
    ]
    text = (REMEDIATE / "resync-models.yml").read_text()
    assert "rsync -" not in text and "'rsync'" not in text, "the push is the role's, not a copy"
    assert (
        "vars_files" not in play
    )  # vars_files would outrank the inventory; role vars come with include_role
    moves = [t for t in tasks(play) if module_of(t) == "ansible.builtin.command"]
    assert all(t["ansible.builtin.command"]["argv"][0] == "mv" for t in moves), "moves aside, never deletes"


def test_collect_diagnostics_keeps_raw_output_out_of_the_log() -> None:
    """Every task whose result holds raw node/pod/HTTP output, and every write of collected content, is
    no_log; every write passes through diagnostics_scrub."""
    raw_sources = {"ansible.builtin.command", "kubernetes.core.k8s_log", "ansible.builtin.uri"}
    for task in all_tasks("collect-diagnostics.yml"):
        module = module_of(task)
        name = task["name"]
        if module in raw_sources and name != "Run nvidia-smi -q":
            assert task.get("no_log") is True, f"'{name}' holds raw output: no_log"
        if module == "ansible.builtin.copy":
            assert "diagnostics_scrub" in task[module]["content"], f"'{name}' writes unscrubbed content"
            assert task[module]["mode"] == "0600"
        if module == "ansible.builtin.set_fact" and "text" in str(task[module]):
            assert task.get("no_log") is True, f"'{name}' holds raw output: no_log"
    text = (REMEDIATE / "collect-diagnostics.yml").read_text()
    items = ["nvidia-smi", "gpu_facts", "NVRM: Xid", "kubelet", "containerd", "k8s_log"]
    for item in [*items, "/debug/dump_state", "/metrics", "index.json", "tar.gz"]:
        assert item in text, f"collect-diagnostics.yml collects {item}"


def _scrub() -> Any:
    spec = importlib.util.spec_from_file_location(
        "diagnostics_scrub", REMEDIATE / "filter_plugins" / "diagnostics_scrub.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()["diagnostics_scrub"]


def test_scrub_removes_every_kind_of_secret() -> None:
    scrub = _scrub()
    jwt_secret = "f3a9c2e1d4b5a6978877665544332211"
    sa_token = (
        "eyJhbGciOiJIUzI1NiIsImtpZCI6ImxhYiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6eDp5In0.c2lnbmF0dXJl"
    )
    key = "\n".join(
        [
            "-----BEGIN EC PRIVATE KEY-----",
            "MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oFuZ3Jk",
            "-----END EC PRIVATE KEY-----",
        ]
    )
    raw = "\n".join(
        [
            f"gateway started, jwt secret {jwt_secret}",
            "kubeadm join 10.89.42.11:6443 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash x",
            f"Authorization: Bearer {sa_token}",
            f"token: {sa_token}",
            key,
            '{"password": "hunter22", "client-key-data": "LS0tLS1CRUdJTg=="}',
            "vllm:prompt_tokens_total 1234",
            "vllm:num_requests_waiting 3",
        ]
    )
    clean = scrub(raw, [jwt_secret])
    for secret in (jwt_secret, "abcdef.0123456789abcdef", sa_token, "MHcCAQEE", "hunter22", "LS0tLS1CRUdJTg"):
        assert secret not in clean
    assert not TOKEN.search(clean)
    # what on-call needs stays
    assert "vllm:prompt_tokens_total 1234" in clean and "vllm:num_requests_waiting 3" in clean
    assert "kubeadm join 10.89.42.11:6443" in clean and "<redacted:bootstrap-token>" in clean
    assert scrub(None) == "" and scrub("nothing secret here") == "nothing secret here"


def test_runbook_covers_every_alert_and_names_existing_playbooks() -> None:
    """One section (or a row of the alerts table) per alert of the serving stage; every playbook the runbook
    names exists (alerts renamed or added by the monitoring role fail this until the runbook follows)."""
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    alerts = set()
    for rules in (ROOT / "roles" / "monitoring" / "files" / "prometheus").glob("*rules*"):
        for group in yaml.safe_load(rules.read_text())["groups"]:
            alerts |= {rule["alert"] for rule in group["rules"] if "alert" in rule}
    assert alerts, "no alert rules found"
    missing = sorted(a for a in alerts if f"`{a}`" not in runbook)
    assert not missing, f"docs/runbook.md has no section for {missing}"
    for path in set(re.findall(r"playbooks/[\w/.-]+\.yml", runbook)):
        assert (ROOT / path).is_file(), f"docs/runbook.md names {path}, which does not exist"


def test_etcd_restore_checks_the_snapshot_before_any_change() -> None:
    """Everything before the first change only reads (the snapshot's status in check mode too, a refusal
    naming `snapshot`); every change waits for a real run; the static Pods are stopped and started by the
    shared task files, started again whatever the restore did; the restore is etcd_backup.py's; the cluster is
    verified by kubernetes-verify.yml."""
    plays = load("etcd-restore.yml")
    steps = tasks(plays[0])
    names = [t["name"] for t in steps]
    refuse = names.index("Refuse a snapshot that is not good")
    status = steps[names.index("Check the snapshot (etcdutl snapshot status, and its recorded sha256)")]
    assert status["ansible.builtin.command"]["argv"][2] == "status" and status["check_mode"] is False
    for task in steps[:refuse]:
        assert module_of(task) in (
            "ansible.builtin.assert", "ansible.builtin.include_role", "ansible.builtin.set_fact",
            "ansible.builtin.find", "ansible.builtin.command",
        ), task["name"]  # fmt: skip
    assert "snapshot=" in str(steps[0]["ansible.builtin.assert"]["fail_msg"])
    (block,) = [t for t in plays[0]["tasks"] if "block" in t]
    assert block["when"] == "not ansible_check_mode"
    assert [
        t["ansible.builtin.include_tasks"] for t in block["block"] if "ansible.builtin.include_tasks" in t
    ] == ["tasks/static-pods-stop.yml"]
    assert [t["ansible.builtin.include_tasks"] for t in block["always"]] == ["tasks/static-pods-start.yml"]
    restore = [t for t in block["block"] if module_of(t) == "ansible.builtin.command"]
    assert restore[0]["ansible.builtin.command"]["argv"][2] == "restore"
    kubelets = steps[names.index("Restart every node's kubelet (it lists again)")]
    assert kubelets["when"] == "not ansible_check_mode"
    assert plays[1]["ansible.builtin.import_playbook"] == "../kubernetes-verify.yml"


def test_renew_certs_renews_restarts_and_reuses_the_operator_kubeconfigs() -> None:
    (play,) = load("renew-certs.yml")
    (block,) = [t for t in play["tasks"] if "block" in t]
    # a second run changes nothing; a renewal by hand whose restart was forgotten is restarted
    assert block["when"] == [
        "not ansible_check_mode",
        "renew_certs_needed | bool or renew_certs_stale | bool",
    ]
    (renew,) = [t for t in block["block"] if module_of(t) == "ansible.builtin.command"]
    assert renew["when"] == "renew_certs_needed | bool"
    assert renew["ansible.builtin.command"]["argv"][:4] == ["kubeadm", "certs", "renew", "all"]
    assert "--config" in renew["ansible.builtin.command"]["argv"]  # works with the API server's cert ended
    assert [t["ansible.builtin.include_tasks"] for t in block["always"]] == ["tasks/static-pods-start.yml"]
    included = [t["ansible.builtin.include_role"] for t in tasks(play) if "ansible.builtin.include_role" in t]
    assert {"name": "kubeadm_control_plane", "tasks_from": "operator-kubeconfigs"} in included
    text = (REMEDIATE / "renew-certs.yml").read_text()
    assert "kubeconfig user" not in text, "the operators' kubeconfigs are the role's, not a copy"
    for task in tasks(play):
        if (
            module_of(task) == "ansible.builtin.command"
            and task["ansible.builtin.command"]["argv"][1] == "certs"
        ):
            assert (task["ansible.builtin.command"]["argv"][2] == "renew") == (
                task.get("changed_when") is True
            )
