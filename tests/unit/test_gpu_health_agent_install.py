"""Role gpu_health_agent installs its code (tasks/install-agent.yml) from one read of the node: the role's
files_in_place call finds what is under /opt/gpu-health-agent with checksums, modes and owners (its find
`code`, answered as ansible.builtin.find answers: test_files_in_place_find.py), then a file or copy call only
for each directory and file that differs (issue 19). The tasks' own `when`, evaluated as Ansible evaluates it,
against what the find returns for a node in each state.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
import yaml
from role_render import ROOT, RoleVars, items_run

# install-agent.yml reads, then includes install-code.yml under a gate (test_include_gates.py holds it)
TASKS = {
    t["name"]: t
    for path in ("install-agent.yml", "install-code.yml")
    for t in yaml.safe_load((ROOT / "roles/gpu_health_agent/tasks" / path).read_text())
}
READ = "Find which of the agent's settings files differ from what the role writes, and its unit"
DIRS = "Create the code directories"
CODE = "Install the agent and the project's module_utils it imports"
ROLE = RoleVars("gpu_health_agent")
HOME, LIB, CODE_DIR = (
    ROLE[v] for v in ("__gpu_health_agent_home", "__gpu_health_agent_lib", "__gpu_health_agent_code")
)
FILES: list[str] = ROLE["__gpu_health_agent_module_utils"]


def entry(path: str, *, mode: str, content: str | None = None, owner: str = "root") -> dict[str, Any]:
    """One entry of ansible.builtin.find's files (file_type any, get_checksum)."""
    found = {"path": path, "mode": mode, "isdir": content is None, "isreg": content is not None,
             "pw_name": owner, "gr_name": "root"}  # fmt: skip
    if content is not None:
        found["checksum"] = hashlib.sha1(content.encode()).hexdigest()
    return found


def converged() -> dict[str, dict[str, Any]]:
    dirs = {p: entry(p, mode="0755") for p in (LIB, f"{LIB}/ansible", CODE_DIR)}
    files = {
        f"{CODE_DIR}/{name}": entry(
            f"{CODE_DIR}/{name}", mode="0644", content=(ROOT / "module_utils" / name).read_text()
        )
        for name in FILES
    }
    return dirs | files


def calls(task: str, node: dict[str, dict[str, Any]] | None) -> list[str]:
    """The items the task calls its module for; node None: the home was not there when the read ran (a new
    node), and find skips a path that is not a directory."""
    if node is None:
        found = {"files": [], "matched": 0, "skipped_paths": {HOME: f"'{HOME}' is not a directory"}}
    else:
        found = {"files": list(node.values()), "matched": len(node), "skipped_paths": {}}
    items = ROLE.template(TASKS[task]["loop"]) if task == DIRS else FILES
    read = {"found": {"code": found}}
    return items_run("gpu_health_agent", TASKS[task], items, __gpu_health_agent_service_state=read,
                     __gpu_health_agent_module_utils_dir=str(ROOT / "module_utils"))  # fmt: skip


def test_the_find_reads_checksums_modes_and_owners_of_everything_under_home() -> None:
    read = TASKS[READ]
    assert read["register"] == "__gpu_health_agent_service_state"
    (find,) = read["files_in_place"]["find"]
    assert find["name"] == "code"
    assert ROLE.template(find["paths"]) == [HOME]
    assert find["file_type"] == "any" and find["recurse"] is True and find["get_checksum"] is True
    # one read for the code and the settings, before the tasks that use it (configure-service.yml's too)
    names = list(TASKS)
    assert names.index(READ) < names.index(DIRS) < names.index(CODE)
    service = yaml.safe_load((ROOT / "roles/gpu_health_agent/tasks/configure-service.yml").read_text())
    assert not [task for task in service if "files_in_place" in task or "ansible.builtin.find" in task]
    # the files come from the project's module_utils, as the copy's src says
    copy = TASKS[CODE]
    role_vars = yaml.safe_load((ROOT / "roles/gpu_health_agent/vars/main.yml").read_text())
    assert role_vars["__gpu_health_agent_module_utils_dir"].startswith(
        "{{ lookup('ansible.builtin.config', 'DEFAULT_MODULE_UTILS_PATH')"
    )
    assert copy["ansible.builtin.copy"]["src"] == "{{ __gpu_health_agent_module_utils_dir }}/{{ item }}"


def test_a_converged_node_sends_no_file_or_copy_call() -> None:
    assert calls(DIRS, converged()) == []
    assert calls(CODE, converged()) == []


def test_without_the_home_when_read_everything_goes_to_the_modules() -> None:
    assert calls(DIRS, None) == [LIB, f"{LIB}/ansible", CODE_DIR]
    assert calls(CODE, None) == FILES


@pytest.mark.parametrize(
    "drift",
    ["appended", "mode", "owner", "missing", "a directory"],
)
def test_a_file_that_differs_is_installed_again_and_only_it(drift: str) -> None:
    node = converged()
    path = f"{CODE_DIR}/gpu_xid.py"
    if drift == "appended":
        node[path] = entry(
            path, mode="0644", content=(ROOT / "module_utils/gpu_xid.py").read_text() + "# junk\n"
        )
    elif drift == "mode":
        node[path]["mode"] = "0600"
    elif drift == "owner":
        node[path]["pw_name"] = "nobody"
    elif drift == "missing":
        del node[path]
    else:
        node[path] = entry(path, mode="0644")
    assert calls(CODE, node) == ["gpu_xid.py"]
    assert calls(DIRS, node) == []


def test_a_directory_that_differs_is_made_again_and_only_it() -> None:
    node = converged()
    node[f"{LIB}/ansible"]["mode"] = "0700"
    assert calls(DIRS, node) == [f"{LIB}/ansible"]
    del node[CODE_DIR]
    assert calls(DIRS, node) == [f"{LIB}/ansible", CODE_DIR]


# ------------------------------------------------------------ the agent's user and home, from the same read
USER_TASK = "Create the agent's system user {{ gpu_health_agent_user }}"
HOME_TASK = "Create {{ __gpu_health_agent_home }}"
PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\n"
    "gpu-health-agent:x:998:998::/nonexistent:/usr/sbin/nologin\n"
    "labadmin:x:1000:1000::/home/labadmin:/bin/bash\n"
)
GROUP = "root:x:0:\nvideo:x:44:gpu-health-agent\nrender:x:109:labadmin,gpu-health-agent\nsudo:x:27:labadmin\n"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def user_task_runs(
    passwd: str | None, group: str | None = GROUP, device_groups: list[Any] | None = None
) -> bool:
    """Whether the user task runs over the read's slurp of /etc/passwd and /etc/group (None: not there)."""
    slurp = {
        "/etc/passwd": {"content": b64(passwd)} if passwd is not None else {},
        "/etc/group": {"content": b64(group)} if group is not None else {},
    }
    role = RoleVars(
        "gpu_health_agent",
        __gpu_health_agent_service_state={"slurp": slurp, "differ": []},
        gpu_health_agent_device_groups=device_groups or [],
    )
    return role.when(TASKS[USER_TASK]["when"])


def test_the_read_takes_the_home_and_the_accounts_the_user_and_file_tasks_manage() -> None:
    read = TASKS[READ]["files_in_place"]
    assert read["files"] == "{{ [__gpu_health_agent_home_dir] + __gpu_health_agent_service_files }}"
    # the home as the file task makes it: all it manages (path, state, owner, group, mode)
    assert ROLE["__gpu_health_agent_home_dir"] == ROLE.template(TASKS[HOME_TASK]["ansible.builtin.file"])
    assert ROLE.template(read["slurp"]) == ["/etc/passwd", "/etc/group"]
    user = ROLE.template(TASKS[USER_TASK]["ansible.builtin.user"])
    assert (user["shell"], user["home"], user["create_home"], user["append"]) == (
        "/usr/sbin/nologin", "/nonexistent", False, True,
    )  # fmt: skip
    # the home task runs only where the read found it otherwise
    role = RoleVars("gpu_health_agent", __gpu_health_agent_service_state={"differ": []})
    assert role.when(TASKS[HOME_TASK]["when"]) is False
    role = RoleVars("gpu_health_agent", __gpu_health_agent_service_state={"differ": [HOME]})
    assert role.when(TASKS[HOME_TASK]["when"]) is True


def test_the_user_task_runs_only_for_an_account_not_as_it_leaves_it() -> None:
    assert user_task_runs(PASSWD) is False
    assert user_task_runs(PASSWD, device_groups=["video", "render"]) is False
    # a new node: no account; the read found no passwd at all
    assert user_task_runs(PASSWD.replace("gpu-health-agent:", "other:")) is True
    assert user_task_runs(None) is True
    # drift the module puts back: shell, home, a device group it is not a member of (or that is not there)
    assert user_task_runs(PASSWD.replace("/usr/sbin/nologin", "/bin/bash")) is True
    assert user_task_runs(PASSWD.replace("/nonexistent", "/home/gpu-health-agent")) is True
    assert user_task_runs(PASSWD, device_groups=["video", "sudo"]) is True
    assert user_task_runs(PASSWD, device_groups=["kvm"]) is True
    assert user_task_runs(PASSWD, None, device_groups=["video"]) is True
    # a group given by number: not judged here, the module runs
    assert user_task_runs(PASSWD, device_groups=[44]) is True
    # unsure: the account on two lines, a NIS compat line
    twice = PASSWD + "gpu-health-agent:x:997:997::/nonexistent:/usr/sbin/nologin\n"
    assert user_task_runs(twice) is True
    assert user_task_runs(PASSWD + "+::::::\n") is True
