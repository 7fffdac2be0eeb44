"""plugins/filter/local_accounts.py and the gates built on it: roles common (its operators' user and
authorized_key tasks, ops_users.yml) and gpu_health_agent (its system user, install-code.yml) call
ansible.builtin.user only for an account their files_in_place read did not find as the task leaves it. The
gates are held here to the real module, its main() whole, over the same /etc/passwd and /etc/group (pwd and
grp answered from them, its commands recorded instead of run): where a gate skips the task the module runs
no command and changes nothing. common's `id` read (validate.yml) runs only where a check needs it.
"""

from __future__ import annotations

import base64
import grp
import importlib.util
import pwd
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import ansible.modules.user as real_user
import files_in_place
import pytest
import yaml
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from conftest import run_module
from role_render import RoleVars

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("local_accounts", ROOT / "plugins/filter/local_accounts.py")
assert _SPEC and _SPEC.loader
local_accounts = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(local_accounts)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def tasks(path: str) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in yaml.safe_load((ROOT / "roles" / path).read_text())}


# ------------------------------------------------------------------ the filters


def test_passwd_and_group_as_nss_files_reads_them() -> None:
    passwd = "root:x:0:0:root:/root:/bin/bash\n# a note\n\nops:x:1001:1001:On-call, 1:/home/ops:/bin/bash\n"
    assert local_accounts.passwd_accounts(b64(passwd)) == {
        "root": {"uid": "0", "gid": "0", "gecos": "root", "home": "/root", "shell": "/bin/bash"},
        "ops": {
            "uid": "1001",
            "gid": "1001",
            "gecos": "On-call, 1",
            "home": "/home/ops",
            "shell": "/bin/bash",
        },
    }
    group = "root:x:0:\nvideo:x:44:a,b\n"
    assert local_accounts.group_members(b64(group)) == {"root": [], "video": ["a", "b"]}


@pytest.mark.parametrize(
    "content",
    [
        b64("ops:x:1:1::/home/ops:/bin/bash\nops:x:2:2::/home/ops2:/bin/bash\n"),  # twice: left out
        b64("ops:x:1:1::/home/ops\n"),  # not seven fields
        b64("ops:x:1:1::/home/ops:/bin/bash\n+::::::\n"),  # compat: NSS may answer otherwise
        "not base64!",
        "",  # not there
        None,
    ],
)
def test_what_is_unsure_reads_as_no_account(content: Any) -> None:
    assert "ops" not in local_accounts.passwd_accounts(content)


def test_the_filters_are_what_python_reads_of_the_machines_own_files() -> None:
    passwd = Path("/etc/passwd").read_text()
    found = local_accounts.passwd_accounts(b64(passwd))
    for entry in pwd.getpwall():
        if entry.pw_name in found:
            account = found[entry.pw_name]
            assert (account["home"], account["shell"], account["gecos"]) == (
                entry.pw_dir, entry.pw_shell, entry.pw_gecos,
            )  # fmt: skip
    members = local_accounts.group_members(b64(Path("/etc/group").read_text()))
    for group in grp.getgrall():
        if group.gr_name in members:
            assert members[group.gr_name] == group.gr_mem


# ------------------------------------------------------------------ the real user module over a node's files


class UserExit(BaseException):
    """The module's exit (not an Exception, which its main() may catch)."""


def real_user_run(args: dict[str, Any], passwd: str, group: str) -> tuple[bool, list[list[str]]]:
    """ansible.builtin.user's main() with ARGS, pwd and grp answering from PASSWD and GROUP as nss files does
    (the first line of a name); whether it changed anything and the commands it ran (usermod --help aside)."""
    accounts: dict[str, pwd.struct_passwd] = {}
    for line in passwd.splitlines():
        f = line.split(":")
        accounts.setdefault(f[0], pwd.struct_passwd((f[0], f[1], int(f[2]), int(f[3]), f[4], f[5], f[6])))
    groups: list[grp.struct_group] = []
    for line in group.splitlines():
        f = line.split(":")
        groups.append(grp.struct_group((f[0], f[1], int(f[2]), [m for m in f[3].split(",") if m])))

    def getgrnam(name: str) -> grp.struct_group:
        found = [g for g in groups if g.gr_name == name]
        if not found:
            raise KeyError(name)
        return found[0]

    def getgrgid(gid: int) -> grp.struct_group:
        found = [g for g in groups if g.gr_gid == gid]
        if not found:
            raise KeyError(gid)
        return found[0]

    ran: list[list[str]] = []

    def run_command(self: basic.AnsibleModule, cmd: list[str], **kwargs: Any) -> tuple[int, str, str]:
        if cmd[1:] == ["--help"]:
            return 0, "  -a, --append                  append the user to the supplemental GROUPS\n", ""
        ran.append(cmd)
        return 0, "", ""

    def exit_json(self: basic.AnsibleModule, **result: Any) -> None:
        raise UserExit(result)

    def fail_json(self: basic.AnsibleModule, msg: str, **result: Any) -> None:
        raise UserExit({"failed": True, "msg": msg, "changed": True})

    fake_pwd = SimpleNamespace(getpwnam=lambda name: accounts[name])
    fake_grp = SimpleNamespace(getgrall=lambda: groups, getgrnam=getgrnam, getgrgid=getgrgid)
    with (
        patch_module_args(args),
        mock.patch.object(real_user, "pwd", fake_pwd),
        mock.patch.object(real_user, "grp", fake_grp),
        mock.patch.object(real_user, "HAVE_SPWD", False),
        mock.patch.object(real_user.User, "SHADOWFILE", None),
        mock.patch.object(real_user.User, "create_homedir", lambda self, path: ran.append(["mkhome", path])),
        mock.patch.object(real_user.User, "chown_homedir", lambda self, *a: None),
        mock.patch.object(basic.AnsibleModule, "run_command", run_command),
        mock.patch.object(basic.AnsibleModule, "exit_json", exit_json),
        mock.patch.object(basic.AnsibleModule, "fail_json", fail_json),
        pytest.raises(UserExit) as done,
    ):
        real_user.main()
    return bool(done.value.args[0]["changed"]), ran


# ------------------------------------------------------------------ gpu_health_agent's system user

AGENT = tasks("gpu_health_agent/tasks/install-code.yml")[
    "Create the agent's system user {{ gpu_health_agent_user }}"
]
AGENT_PASSWD = "root:x:0:0:root:/root:/bin/bash\ngpu-health-agent:x:998:998::/nonexistent:/usr/sbin/nologin\n"
AGENT_GROUP = "root:x:0:\ngpu-health-agent:x:998:\nvideo:x:44:gpu-health-agent\nrender:x:109:\n"


@pytest.mark.parametrize(
    ("passwd", "group", "device_groups"),
    [
        (AGENT_PASSWD, AGENT_GROUP, []),
        (AGENT_PASSWD, AGENT_GROUP, ["video"]),
        (AGENT_PASSWD, AGENT_GROUP, ["video", "render"]),  # not a member of render
        (AGENT_PASSWD, AGENT_GROUP.replace("video:x:44:gpu-health-agent", "video:x:44:"), ["video"]),
        (AGENT_PASSWD.replace("/usr/sbin/nologin", "/bin/sh"), AGENT_GROUP, []),
        (AGENT_PASSWD.replace("/nonexistent", "/var/lib/agent"), AGENT_GROUP, []),
        (AGENT_PASSWD.replace("::/nonexistent", ":GPU agent:/nonexistent"), AGENT_GROUP, []),  # not set
        ("root:x:0:0:root:/root:/bin/bash\n", AGENT_GROUP, []),  # a new node
    ],
)
def test_the_agents_user_task_is_skipped_only_where_the_module_changes_nothing(
    passwd: str, group: str, device_groups: list[str]
) -> None:
    read = {"slurp": {"/etc/passwd": {"content": b64(passwd)}, "/etc/group": {"content": b64(group)}}}
    role = RoleVars("gpu_health_agent", __gpu_health_agent_service_state=read,
                    gpu_health_agent_device_groups=device_groups)  # fmt: skip
    runs = role.when(AGENT["when"])
    changed, ran = real_user_run(role.template(AGENT["ansible.builtin.user"]), passwd, group)
    assert runs is changed, ran
    if not runs:
        assert ran == []


# ------------------------------------------------------------------ common's operators

OPS = tasks("common/tasks/ops_users.yml")
USER = OPS["Create or remove the operator accounts"]
KEYS = OPS["Set the operators' authorized keys (exactly these)"]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOnCallKey000000000000000000000000000000000 oncall@example"
OPERATOR = {"name": "ops", "comment": "On-call operator", "ssh_public_keys": [KEY]}


def common(home_base: Path, operators: list[dict[str, Any]], **overrides: Any) -> RoleVars:
    return RoleVars("common", common_ops_users=operators, __common_ops_home_base=str(home_base), **overrides)


def common_read(tmp_path: Path, operators: list[dict[str, Any]], passwd: str) -> dict[str, Any]:
    """What the role's read (tasks/main.yml: its slurp and stat) answers for the operators over TMP_PATH as
    the node's home base, with PASSWD as /etc/passwd."""
    role = common(tmp_path, operators)
    slurp = [p for p in role["__common_ops_slurp"] if p != "/etc/passwd"]
    failed, read = run_module(files_in_place, {"slurp": slurp, "stat": role["__common_ops_stat"]})
    assert not failed, read["msg"]
    read["slurp"]["/etc/passwd"] = {"content": b64(passwd)}
    return read


def ops_passwd(home: Path, shell: str = "/bin/bash", gecos: str = "On-call operator") -> str:
    return f"root:x:0:0:root:/root:/bin/bash\nops:x:1001:1001:{gecos}:{home}:{shell}\n"


@pytest.mark.parametrize(
    "case",
    [
        "in place",
        "no home",
        "home a link",
        "other shell",
        "other gecos",
        "home elsewhere",
        "new",
        "no comment",
    ],
)
def test_an_operators_user_task_is_skipped_only_where_the_module_changes_nothing(
    tmp_path: Path, case: str
) -> None:
    home = tmp_path / "ops"
    operator = {k: v for k, v in OPERATOR.items() if not (case == "no comment" and k == "comment")}
    passwd = ops_passwd(home)
    if case == "home a link":
        (tmp_path / "elsewhere").mkdir()
        home.symlink_to(tmp_path / "elsewhere")  # the module finds it there; the read is unsure: it runs
    elif case != "no home":
        home.mkdir()
    if case == "other shell":
        passwd = ops_passwd(home, shell="/bin/sh")
    elif case == "other gecos":
        passwd = ops_passwd(home, gecos="Someone else")
    elif case == "home elsewhere":
        (tmp_path / "srv-ops").mkdir()
        passwd = ops_passwd(tmp_path / "srv-ops")
    elif case == "new":
        passwd = "root:x:0:0:root:/root:/bin/bash\n"
    read = common_read(tmp_path, [operator], passwd)
    role = common(tmp_path, [operator], __common_files_state=read, item=operator)
    runs = role.when(USER["when"])
    group = "root:x:0:\nops:x:1001:\n"
    changed, ran = real_user_run(role.template(USER["ansible.builtin.user"]), passwd, group)
    if case == "home a link":
        assert (runs, changed) == (True, False)
    elif case == "home elsewhere":
        assert (runs, changed) == (True, False)  # not read there: the module decides
    else:
        assert runs is changed, ran
    assert runs is (case not in ("in place", "no comment"))


def test_operators_to_remove_or_named_twice_always_run_the_modules(tmp_path: Path) -> None:
    (tmp_path / "ops").mkdir()
    passwd = ops_passwd(tmp_path / "ops")
    leaver = {"name": "leaver", "state": "absent"}
    twice = [OPERATOR, {"name": "ops", "sudo": False}]
    for operators in ([OPERATOR, leaver], twice):
        read = common_read(tmp_path, operators, passwd)
        runs = [
            o["name"]
            for o in operators
            if common(tmp_path, operators, __common_files_state=read, item=o).when(USER["when"])
        ]
        assert runs == (["leaver"] if leaver in operators else ["ops", "ops"])
    assert common(tmp_path, twice)["__common_ops_slurp"] == []


@pytest.mark.parametrize(
    "content",
    [
        f"{KEY}\n",
        None,
        f"{KEY}\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOther other@example\n",
        f"# note\n{KEY}\n",
    ],
)
def test_an_operators_keys_task_is_skipped_only_where_its_file_holds_exactly_these(
    tmp_path: Path, content: str | None
) -> None:
    home = tmp_path / "ops"
    (home / ".ssh").mkdir(parents=True)
    if content is not None:
        (home / ".ssh/authorized_keys").write_text(content)
    read = common_read(tmp_path, [OPERATOR], ops_passwd(home))
    role = common(tmp_path, [OPERATOR], __common_files_state=read, item=OPERATOR)
    # the keys the task passes are the ones the verdict reads, a line each
    assert role.template(KEYS["ansible.posix.authorized_key"])["key"] == KEY
    assert role.when(KEYS["when"]) is (content != f"{KEY}\n")
    # an account the user task would change is not judged: the keys task runs too
    read["slurp"]["/etc/passwd"] = {"content": b64(ops_passwd(home, shell="/bin/sh"))}
    role = common(tmp_path, [OPERATOR], __common_files_state=read, item=OPERATOR)
    assert role.when(KEYS["when"]) is True


def test_two_keys_are_two_lines() -> None:
    operator = OPERATOR | {"ssh_public_keys": [KEY, KEY.replace("OnCall", "Second")]}
    role = RoleVars("common", common_ops_users=[operator], item=operator)
    assert role["__common_ops_keys"] == f"{KEY}\n{KEY.replace('OnCall', 'Second')}"


# ------------------------------------------------------------ common's `id`, only where a check needs it

VALIDATE = tasks("common/tasks/validate.yml")
LOGIN = VALIDATE["Read who Ansible logs in as, before sudo"]
AGAINST_LOGIN = VALIDATE[
    "Check the common values against the login user (AllowGroups would not lock it out, it is not removed)"
]
ID = {"stdout": "uid=1000(labadmin) gid=1000(labadmin) groups=1000(labadmin),27(sudo)"}


def failing_checks(**values: Any) -> list[int] | None:
    """None where the `id` task is skipped (its result then is too); else which checks, evaluated, fail."""
    role = RoleVars("common", **values)
    if not role.when(LOGIN["when"]):
        skipped = RoleVars("common", common_login={"skipped": True}, **values)
        assert not any(skipped.when(c["when"]) for c in AGAINST_LOGIN["value_checks"]["checks"])
        return None
    role = RoleVars("common", common_login=ID, **values)
    return [
        index
        for index, check in enumerate(AGAINST_LOGIN["value_checks"]["checks"])
        if role.when(check["when"]) and not role.when(check["that"])
    ]


def test_the_login_is_read_only_where_a_check_needs_it() -> None:
    assert failing_checks() is None
    assert failing_checks(common_ops_users=[OPERATOR]) is None
    assert failing_checks(common_ssh_allow_groups=["sudo"]) == []
    assert failing_checks(common_ssh_allow_groups=["ops"]) == [0]
    assert failing_checks(common_ops_users=[{"name": "leaver", "state": "absent"}]) == []
    assert failing_checks(common_ops_users=[{"name": "labadmin", "state": "absent"}]) == [1]
    assert failing_checks(common_ops_users=[{"name": "labadmin", "state": "absent"}],
                          common_ssh_allow_groups=["ops"]) == [0, 1]  # fmt: skip
