"""roles/pinned_manifest, the one home of the download of a cluster add-on's pinned manifest: the content it
hands the apply (pinned_manifest_b64, vars/main.yml) in each state its read and download leave, the gates of
its tasks, and the three roles that use it entering it statically, with their own values and no argument
validation task (its README: an import costs no task of its own on a no-op run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from role_render import RoleVars

ROOT = Path(__file__).resolve().parents[2]
PATH = "/etc/kubernetes/addons/demo/demo-v1.yaml"
DIR = "/etc/kubernetes/addons/demo"
SKIPPED = {"changed": False, "skipped": True}
# caller -> (task file, its values for the four parameters)
CALLERS = {
    "calico": (
        "tasks/main.yml",
        ["calico_manifest_url", "calico_manifest_sha256", "calico_manifest_dir", "__calico_manifest_path"],
    ),
    "nvidia_device_plugin": (
        "tasks/apply.yml",
        [
            "nvidia_device_plugin_manifest_url",
            "nvidia_device_plugin_manifest_sha256",
            "nvidia_device_plugin_manifest_dir",
            "__nvidia_device_plugin_manifest_path",
        ],
    ),
    "monitoring": (
        "tasks/main.yml",
        [
            "monitoring_dcgm_exporter_manifest_url",
            "monitoring_dcgm_exporter_manifest_sha256",
            "monitoring_dcgm_exporter_manifest_dir",
            "__monitoring_dcgm_manifest_path",
        ],
    ),
}


def tasks() -> dict[str, dict[str, Any]]:
    loaded = yaml.safe_load((ROOT / "roles/pinned_manifest/tasks/main.yml").read_text())
    return {next(k for k in task if "." in k or k == "files_in_place"): task for task in loaded}


def read(differ: list[str], content: str | None) -> dict[str, Any]:
    """files_in_place's answer: the paths not in place, the manifest's slurp ({} where nothing is there)."""
    slurp = {} if content is None else {"content": content, "encoding": "base64", "source": PATH}
    return {
        "differ": differ,
        "stat": {"/etc/kubernetes/admin.conf": {"exists": True}},
        "slurp": {PATH: slurp},
    }


@pytest.mark.parametrize(
    ("state", "found", "fresh", "b64"),
    [
        ("in place: the read's content", read([], "b2xk"), SKIPPED, "b2xk"),
        ("downloaded: the fresh read's", read([PATH], "b2xk"), {"content": "bmV3"}, "bmV3"),
        ("directory and file downloaded", read([DIR, PATH], None), {"content": "bmV3"}, "bmV3"),
        # --check: nothing was downloaded; a manifest with other bytes or mode is not the one to apply
        ("--check, missing", read([DIR, PATH], None), SKIPPED, ""),
        ("--check, other bytes or mode", read([PATH], "b2xk"), SKIPPED, ""),
        # the directory's mode alone differs: the manifest in it is the pinned one
        ("directory's mode only", read([DIR], "b2xk"), SKIPPED, "b2xk"),
    ],
)
def test_the_content_for_the_apply(
    state: str, found: dict[str, Any], fresh: dict[str, Any], b64: str
) -> None:
    role = RoleVars("pinned_manifest", pinned_manifest_read=found, __pinned_manifest_fresh=fresh)
    assert role["pinned_manifest_b64"] == b64, state


def test_the_read_slurps_the_manifest_alone() -> None:
    """vars/main.yml takes the manifest's path from the read's slurp: its one key."""
    read_task = tasks()["files_in_place"]["files_in_place"]
    assert read_task["slurp"] == ["{{ pinned_manifest_path }}"]
    assert read_task["stat"] == ["/etc/kubernetes/admin.conf"]


@pytest.mark.parametrize(
    ("module", "differ", "check", "dir_changed", "fetch", "runs"),
    [
        ("ansible.builtin.file", [DIR, PATH], False, False, True, True),
        ("ansible.builtin.file", [PATH], False, False, True, False),
        ("ansible.builtin.file", [DIR, PATH], True, False, False, False),
        ("ansible.builtin.get_url", [PATH], False, False, True, True),
        ("ansible.builtin.get_url", [PATH], True, False, True, True),
        # --check with the directory still to be made: get_url would have nowhere to write
        ("ansible.builtin.get_url", [DIR, PATH], True, True, True, False),
        ("ansible.builtin.get_url", [DIR, PATH], False, True, True, True),
        ("ansible.builtin.get_url", [PATH], False, False, False, False),
        ("ansible.builtin.get_url", [], False, False, True, False),
    ],
)
def test_the_directory_and_the_download_run_only_where_the_read_finds_them_not_in_place(
    module: str, differ: list[str], check: bool, dir_changed: bool, fetch: bool, runs: bool
) -> None:
    role = RoleVars(
        "pinned_manifest",
        pinned_manifest_dir=DIR,
        pinned_manifest_path=PATH,
        pinned_manifest_fetch=fetch,
        pinned_manifest_read=read(differ, None),
        ansible_check_mode=check,
        __pinned_manifest_dir={"changed": True} if dir_changed else SKIPPED,
    )
    assert role.when(tasks()[module]["when"]) is runs


@pytest.mark.parametrize(
    ("downloaded", "check", "runs"), [(True, False, True), (True, True, False), (False, False, False)]
)
def test_the_second_read_only_after_a_download(downloaded: bool, check: bool, runs: bool) -> None:
    role = RoleVars(
        "pinned_manifest",
        ansible_check_mode=check,
        __pinned_manifest_download={"changed": True} if downloaded else SKIPPED,
    )
    assert role.when(tasks()["ansible.builtin.slurp"]["when"]) is runs


@pytest.mark.parametrize("caller", CALLERS)
def test_each_caller_imports_it_with_its_own_values_and_no_validation_task(caller: str) -> None:
    path, values = CALLERS[caller]
    (task,) = [
        t
        for t in yaml.safe_load((ROOT / "roles" / caller / path).read_text())
        if "ansible.builtin.import_role" in t
    ]
    assert task["ansible.builtin.import_role"] == {"name": "pinned_manifest", "rolespec_validate": False}
    params = ["pinned_manifest_url", "pinned_manifest_sha256", "pinned_manifest_dir", "pinned_manifest_path"]
    assert [task["vars"][p] for p in params] == [f"{{{{ {v} }}}}" for v in values]
    # the device plugin and monitoring read on the first control plane, once, as before
    if caller != "calico":
        assert task["delegate_to"] == "{{ groups['control_plane'][0] }}" and task["run_once"] is True


@pytest.mark.parametrize(
    ("check", "admin_conf", "fetch"), [(False, False, True), (True, True, True), (True, False, False)]
)
def test_monitoring_makes_and_downloads_nothing_in_check_mode_before_the_cluster_exists(
    check: bool, admin_conf: bool, fetch: bool
) -> None:
    (task,) = [
        t
        for t in yaml.safe_load((ROOT / "roles/monitoring/tasks/main.yml").read_text())
        if "ansible.builtin.import_role" in t
    ]
    found = read([], "b2xk") | {"stat": {"/etc/kubernetes/admin.conf": {"exists": admin_conf}}}
    role = RoleVars("monitoring", pinned_manifest_read=found, ansible_check_mode=check)
    assert role.template(task["vars"]["pinned_manifest_fetch"]) is fetch


def test_no_role_keeps_a_copy_of_the_steps() -> None:
    """get_url of a pinned manifest, and the names the three roles registered, are pinned_manifest's now."""
    old = ("__calico_read", "__calico_fresh", "__nvidia_device_plugin_read.", "__nvidia_device_plugin_fresh",
           "__monitoring_read", "__monitoring_dcgm_fresh")  # fmt: skip
    for caller in CALLERS:
        for path in (ROOT / "roles" / caller).rglob("*.yml"):
            text = path.read_text()
            assert "ansible.builtin.get_url" not in text, path
            assert [name for name in old if name in text] == [], path
