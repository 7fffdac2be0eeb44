"""Role kubernetes_node's kernel modules and parameters (tasks/configure-kernel.yml): read once, by the role's
files_in_place call (tasks/main.yml: /proc/modules, and the finds of __kubernetes_node_finds), then
community.general.modprobe and ansible.posix.sysctl called only for what differs (issue 19).

The tasks' own `when` conditions, templated by Ansible's templar with the results the read returns on a
node: a converged node calls neither module; each kind of drift calls the module for exactly the item it
touches (or, where the read cannot tell which, for every item: the module then decides). The finds' answers
are held to ansible.builtin.find's in test_files_in_place_find.py.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

import pytest
import yaml
from role_render import ROOT, RoleVars, items_run

TASKS = {
    t["name"]: t
    for t in yaml.safe_load((ROOT / "roles/kubernetes_node/tasks/configure-kernel.yml").read_text())
}
LOAD = "Load the kernel modules now and at boot"
SET = "Set the kernel parameters now and at boot"  # tests/lab/drift.py names it too
DEFAULTS = RoleVars("kubernetes_node")
MODULES: list[str] = DEFAULTS["kubernetes_node_kernel_modules"]
SYSCTLS: dict[str, str] = DEFAULTS["kubernetes_node_sysctls"]
SYSCTL_FILE = DEFAULTS["__kubernetes_node_sysctl_file"]


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


FINDS = {find["name"]: find for find in DEFAULTS["__kubernetes_node_finds"]}


def found(files: dict[str, str]) -> dict[str, Any]:
    """A find's answer (files_in_place's found[<name>], as ansible.builtin.find's) listing these regular files
    (path: content)."""
    return {
        "files": [{"path": p, "checksum": sha1(c), "isreg": True, "mode": "0644"} for p, c in files.items()]
    }


def proc_modules(names: list[str]) -> dict[str, Any]:
    table = "".join(f"{name} 16384 0 - Live 0x0000000000000000\n" for name in names)
    return {"content": base64.b64encode(table.encode()).decode(), "encoding": "base64"}


def runs_for(task_name: str, items: list[Any], **registered: Any) -> list[Any]:
    """The loop items the task calls its module for, the reads having returned these."""
    return items_run("kubernetes_node", TASKS[task_name], items, **registered, ansible_check_mode=False)


CONVERGED_MODULE_FILES = {f"/etc/modules-load.d/{m}.conf": f"{m}\n" for m in MODULES}


def modules_called(
    loaded: list[str] = MODULES, files: dict[str, str] = CONVERGED_MODULE_FILES, links: tuple[str, ...] = ()
) -> list[str]:
    return runs_for(
        LOAD,
        MODULES,
        __kubernetes_node_pin_state={
            "slurp": {"/proc/modules": proc_modules(loaded)},
            "found": {
                "module_files": found(files),
                "modprobe_links": {"files": [{"path": p, "islnk": True} for p in links]},
                "sysctl_files": found({}),
            },
        },
    )


def test_a_converged_node_calls_modprobe_for_no_module() -> None:
    assert modules_called() == []


def test_a_module_not_loaded_is_loaded() -> None:
    assert modules_called(loaded=[m for m in MODULES if m != "ip_vs_sh"]) == ["ip_vs_sh"]


@pytest.mark.parametrize(
    "content",
    ["", "# ip_vs_wrr\n", "ip_vs_wrr\nip_vs\n"],
    ids=["emptied (find's contains drops it)", "commented out", "other content"],
)
def test_a_module_missing_from_its_boot_file_is_written_back(content: str) -> None:
    files = CONVERGED_MODULE_FILES | {"/etc/modules-load.d/ip_vs_wrr.conf": content}
    if not content:
        del files["/etc/modules-load.d/ip_vs_wrr.conf"]
    assert modules_called(files=files) == ["ip_vs_wrr"]


def test_options_given_in_modprobe_d_send_every_module_to_modprobe() -> None:
    # the read names the file, not the module: modprobe (params '') decides which options it comments out
    files = CONVERGED_MODULE_FILES | {"/etc/modprobe.d/site.conf": "options nf_conntrack hashsize=1\n"}
    assert modules_called(files=files) == MODULES


def test_a_link_in_modprobe_d_sends_every_module_to_modprobe() -> None:
    # find lstat()s: a link's target (options the site keeps elsewhere) is not read, modprobe follows it
    assert modules_called(links=("/etc/modprobe.d/site.conf",)) == MODULES


def modprobe_reads(line: str) -> bool:
    """Whether community.general.modprobe (plugins/modules/modprobe.py, its two regexes) sees one of the
    modules loaded at boot, or given options, on this line."""
    return any(
        re.match(rf"^ *{m} *(?:[#;].*)?\n?\Z", line)
        or re.match(rf"^options {m} \w+=\S+ *(?:[#;].*)?\n?\Z", line)
        for m in MODULES
    )


@pytest.mark.parametrize(
    "line",
    ["overlay\n", "  br_netfilter  # for pods\n", "ip_vs_rr;x\n", "options nf_conntrack hashsize=1\n",
     "options ip_vs conn_tab_bits=12 # site\n", "ip_vs_rrr\n", "# overlay\n", "options nvidia NVreg_X=1\n",
     "blacklist ip_vs\n", "install ip_vs /bin/true\n", "overlay2\n", "\n"],
)  # fmt: skip
def test_the_find_picks_the_files_modprobe_would_read_as_naming_a_module(line: str) -> None:
    contains = FINDS["module_files"]["contains"]
    # ansible.builtin.find, and files_in_place's find as it, match `contains` with re.match on each line
    assert bool(re.match(contains, line)) == modprobe_reads(line)


CONVERGED_SYSCTL_FILES = {f"/proc/sys/{k.replace('.', '/')}": f"{v}\n" for k, v in SYSCTLS.items()} | {
    SYSCTL_FILE: "".join(f"{k}={v}\n" for k, v in SYSCTLS.items())
}


def sysctls_called(
    files: dict[str, str] = CONVERGED_SYSCTL_FILES, read: dict[str, Any] | None = None
) -> list[str]:
    items = [{"key": k, "value": v} for k, v in SYSCTLS.items()]
    sysctl_files = found(files) if read is None else read
    called = runs_for(
        SET,
        items,
        __kubernetes_node_pin_state={
            "found": {"module_files": found({}), "modprobe_links": found({}), "sysctl_files": sysctl_files}
        },
    )
    return [item["key"] for item in called]


def test_a_converged_node_calls_sysctl_for_no_parameter() -> None:
    assert sysctls_called() == []


def test_a_parameter_changed_now_is_set_again() -> None:
    # tests/lab/drift.py's drift: sysctl -w net.bridge.bridge-nf-call-ip6tables=0
    files = CONVERGED_SYSCTL_FILES | {"/proc/sys/net/bridge/bridge-nf-call-ip6tables": "0\n"}
    assert sysctls_called(files) == ["net.bridge.bridge-nf-call-ip6tables"]


def test_a_parameter_not_there_is_set() -> None:
    files = dict(CONVERGED_SYSCTL_FILES)
    del files["/proc/sys/net/ipv4/ip_forward"]
    assert sysctls_called(files) == ["net.ipv4.ip_forward"]


@pytest.mark.parametrize(
    "content",
    [None, "net.ipv4.ip_forward=1\n",
     "net.bridge.bridge-nf-call-iptables=0\nnet.bridge.bridge-nf-call-ip6tables=1\nnet.ipv4.ip_forward=1\n"],
    ids=["missing", "a line removed", "a value changed"],
)  # fmt: skip
def test_a_boot_file_that_differs_sends_every_parameter_to_sysctl(content: str | None) -> None:
    files = dict(CONVERGED_SYSCTL_FILES)
    if content is None:
        del files[SYSCTL_FILE]
    else:
        files[SYSCTL_FILE] = content
    assert sysctls_called(files) == list(SYSCTLS)


def test_a_parameter_of_a_module_not_loaded_when_the_read_ran_is_set() -> None:
    # the read comes before the modules are loaded: br_netfilter's keys are not there on a new node, and
    # ansible.builtin.find (files_in_place's find likewise) skips a directory that is not there
    files = {path: value for path, value in CONVERGED_SYSCTL_FILES.items() if "/net/bridge/" not in path}
    read = found(files) | {
        "skipped_paths": {"/proc/sys/net/bridge": "'/proc/sys/net/bridge' is not a directory"}
    }
    assert sysctls_called(read=read) == [key for key in SYSCTLS if key.startswith("net.bridge.")]


def test_the_read_looks_where_the_parameters_and_their_file_are() -> None:
    args = FINDS["sysctl_files"]
    for path in CONVERGED_SYSCTL_FILES:
        dirname, _, basename = path.rpartition("/")
        assert dirname in args["paths"] and basename in args["patterns"]
    assert args["get_checksum"] is True


def test_the_roles_read_finds_what_the_tasks_compare() -> None:
    """The finds go to tasks/main.yml's files_in_place call, registered as configure-kernel.yml reads it."""
    (read,) = [
        task
        for task in yaml.safe_load((ROOT / "roles/kubernetes_node/tasks/main.yml").read_text())
        if "files_in_place" in task
    ]
    assert read["files_in_place"]["find"] == "{{ __kubernetes_node_finds }}"
    assert read["register"] == "__kubernetes_node_pin_state"
    read_result = {"found": {name: found({}) for name in FINDS}}
    assert (
        RoleVars("kubernetes_node", __kubernetes_node_pin_state=read_result)["__kubernetes_node_found"]
        == (read_result["found"])
    )
    assert list(FINDS) == ["module_files", "modprobe_links", "sysctl_files"]
    assert FINDS["modprobe_links"] == {
        "name": "modprobe_links",
        "paths": ["/etc/modprobe.d"],
        "file_type": "link",
    }
    assert set(FINDS["module_files"]["paths"]) == {"/etc/modules-load.d", "/etc/modprobe.d"}
