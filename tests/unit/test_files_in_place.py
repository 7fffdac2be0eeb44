"""files_in_place: which managed paths differ (content, kind, owner, group, mode, absence), the entry
validation that names the entry, permission errors, and check mode."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import stat
from pathlib import Path
from typing import Any

import files_in_place
import pytest
from conftest import run_module

CONTENT = b"version = 2\n[plugins]\n"
NO_SUCH_NAME = "nosuch-files-in-place"


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def check(*files: dict[str, Any], check_mode: bool = False) -> tuple[bool, dict[str, Any]]:
    return run_module(files_in_place, {"files": list(files)}, check_mode=check_mode)


def checked_ok(*files: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    failed, result = check(*files, check_mode=check_mode)
    assert not failed, result["msg"]
    assert result["changed"] is False
    return result


def failure(*files: dict[str, Any]) -> str:
    failed, result = check(*files)
    assert failed, result
    return str(result["msg"])


def write(path: Path, data: bytes = CONTENT, mode: int = 0o644) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def my_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def my_group() -> str:
    return grp.getgrgid(os.getgid()).gr_name


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write(tmp_path / "config.toml")


# ------------------------------------------------------------------ state=file


def test_a_file_as_the_role_writes_it_is_in_place(config: Path) -> None:
    result = checked_ok(
        {
            "path": str(config),
            "checksum": sha1(CONTENT),
            "owner": my_user(),
            "group": my_group(),
            "mode": "0644",
        }
    )
    assert result["in_place"] is True
    assert result["differ"] == [] and result["reasons"] == {}
    assert result["checked"] == 1


def test_owner_and_group_by_numeric_id_and_a_three_digit_mode_are_in_place(config: Path) -> None:
    result = checked_ok(
        {"path": str(config), "owner": str(os.getuid()), "group": str(os.getgid()), "mode": "644"}
    )
    assert result["in_place"] is True and result["differ"] == []


def test_without_checksum_the_content_is_not_compared(config: Path) -> None:
    config.write_bytes(b"anything else\n")
    assert checked_ok({"path": str(config)})["in_place"] is True


def test_content_differs(config: Path) -> None:
    result = checked_ok({"path": str(config), "checksum": sha1(CONTENT + b"# one more line\n")})
    assert result["in_place"] is False
    assert result["differ"] == [str(config)]
    assert result["reasons"] == {str(config): ["content differs"]}


def test_a_file_larger_than_one_read_is_hashed_whole(tmp_path: Path) -> None:
    data = b"x" * files_in_place.CHUNK_SIZE + b"tail"
    big = write(tmp_path / "big", data)
    assert checked_ok({"path": str(big), "checksum": sha1(data)})["in_place"] is True
    assert checked_ok({"path": str(big), "checksum": sha1(data[:-1])})["differ"] == [str(big)]


def test_mode_differs(config: Path) -> None:
    config.chmod(0o600)
    result = checked_ok({"path": str(config), "checksum": sha1(CONTENT), "mode": "0644"})
    assert result["differ"] == [str(config)]
    assert result["reasons"] == {str(config): ["mode 0600, want 0644"]}


def test_special_bits_count_in_the_mode(config: Path) -> None:
    config.chmod(0o2755)
    assert checked_ok({"path": str(config), "mode": "2755"})["in_place"] is True
    result = checked_ok({"path": str(config), "mode": "0755"})
    assert result["reasons"] == {str(config): ["mode 2755, want 0755"]}


def test_owner_and_group_differ(config: Path) -> None:
    other_uid, other_gid = os.getuid() + 4242, os.getgid() + 4242
    result = checked_ok({"path": str(config), "owner": str(other_uid), "group": str(other_gid)})
    assert result["reasons"] == {
        str(config): [f"owner {my_user()}, want {other_uid}", f"group {my_group()}, want {other_gid}"]
    }


def test_every_reason_of_one_path_is_listed(config: Path) -> None:
    config.chmod(0o600)
    result = checked_ok(
        {"path": str(config), "checksum": sha1(b"other"), "owner": NO_SUCH_NAME, "mode": "0644"}
    )
    assert result["reasons"][str(config)] == [
        "content differs",
        f"user {NO_SUCH_NAME!r} does not exist",
        "mode 0600, want 0644",
    ]


def test_an_unknown_user_or_group_differs_rather_than_failing(config: Path) -> None:
    with pytest.raises(KeyError):
        pwd.getpwnam(NO_SUCH_NAME)
    with pytest.raises(KeyError):
        grp.getgrnam(NO_SUCH_NAME)
    result = checked_ok({"path": str(config), "owner": NO_SUCH_NAME, "group": NO_SUCH_NAME})
    assert result["differ"] == [str(config)]
    assert result["reasons"] == {
        str(config): [f"user {NO_SUCH_NAME!r} does not exist", f"group {NO_SUCH_NAME!r} does not exist"]
    }


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "not-there.conf"
    result = checked_ok({"path": str(missing), "checksum": sha1(CONTENT), "mode": "0644"})
    assert result["in_place"] is False
    assert result["reasons"] == {str(missing): ["missing"]}


def test_a_path_under_a_file_is_missing(config: Path) -> None:
    below = config / "child"
    assert checked_ok({"path": str(below)})["reasons"] == {str(below): ["missing"]}


def test_a_directory_where_a_file_is_expected(tmp_path: Path) -> None:
    directory = tmp_path / "config.toml"
    directory.mkdir()
    result = checked_ok({"path": str(directory), "checksum": sha1(CONTENT)})
    assert result["differ"] == [str(directory)]
    assert result["reasons"] == {str(directory): ["not a regular file (a directory)"]}


def test_a_symlink_to_a_file_in_place_is_in_place(config: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.toml"
    link.symlink_to(config)
    assert checked_ok({"path": str(link), "checksum": sha1(CONTENT), "mode": "0644"})["in_place"] is True


def test_a_dangling_symlink_is_missing(tmp_path: Path) -> None:
    link = tmp_path / "link.toml"
    link.symlink_to(tmp_path / "nowhere")
    result = checked_ok({"path": str(link)})
    assert result["reasons"] == {str(link): ["missing (a dangling symlink)"]}


# ------------------------------------------------------------------ state=directory


def test_a_directory_in_place(tmp_path: Path) -> None:
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    conf_d.chmod(0o755)
    result = checked_ok(
        {"path": str(conf_d), "state": "directory", "owner": my_user(), "group": my_group(), "mode": "0755"}
    )
    assert result["in_place"] is True and result["differ"] == []


def test_a_directory_with_the_wrong_mode(tmp_path: Path) -> None:
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    conf_d.chmod(0o700)
    result = checked_ok({"path": str(conf_d), "state": "directory", "mode": "0755"})
    assert result["differ"] == [str(conf_d)]
    assert result["reasons"] == {str(conf_d): ["mode 0700, want 0755"]}


def test_a_missing_directory(tmp_path: Path) -> None:
    conf_d = tmp_path / "conf.d"
    result = checked_ok({"path": str(conf_d), "state": "directory"})
    assert result["reasons"] == {str(conf_d): ["missing"]}


def test_a_file_where_a_directory_is_expected(config: Path) -> None:
    result = checked_ok({"path": str(config), "state": "directory"})
    assert result["reasons"] == {str(config): ["not a directory (a regular file)"]}


# ------------------------------------------------------------------ state=absent


def test_absent_with_nothing_there(tmp_path: Path) -> None:
    result = checked_ok({"path": str(tmp_path / "gone.conf"), "state": "absent"})
    assert result["in_place"] is True and result["differ"] == []


@pytest.mark.parametrize("kind", ["file", "directory", "dangling symlink"])
def test_absent_with_something_there(tmp_path: Path, kind: str) -> None:
    there = tmp_path / "stale.conf"
    if kind == "file":
        write(there)
    elif kind == "directory":
        there.mkdir()
    else:
        there.symlink_to(tmp_path / "nowhere")
    result = checked_ok({"path": str(there), "state": "absent"})
    assert result["differ"] == [str(there)]
    assert result["reasons"] == {str(there): ["exists, want absent"]}


# ------------------------------------------------------------------ several entries


def test_differ_follows_the_input_order_and_checked_counts_every_entry(tmp_path: Path) -> None:
    in_place = write(tmp_path / "a-in-place")
    wrong_mode = write(tmp_path / "b-wrong-mode", mode=0o600)
    missing = tmp_path / "c-missing"
    stale = write(tmp_path / "d-stale")
    entries = [
        {"path": str(stale), "state": "absent"},
        {"path": str(in_place), "checksum": sha1(CONTENT)},
        {"path": str(missing)},
        {"path": str(wrong_mode), "mode": "0644"},
    ]
    result = checked_ok(*entries)
    assert result["differ"] == [str(stale), str(missing), str(wrong_mode)]
    assert list(result["reasons"]) == result["differ"]
    assert result["in_place"] is False
    assert result["checked"] == 4
    reversed_result = checked_ok(*reversed(entries))
    assert reversed_result["differ"] == [str(wrong_mode), str(missing), str(stale)]


def test_no_entries_is_in_place() -> None:
    result = checked_ok()
    assert result == {**result, "differ": [], "reasons": {}, "in_place": True, "checked": 0}


def test_check_mode_gives_the_same_result_and_changes_nothing(config: Path, tmp_path: Path) -> None:
    config.chmod(0o600)
    stale = write(tmp_path / "stale")
    entries = [
        {"path": str(config), "checksum": sha1(b"other"), "mode": "0644"},
        {"path": str(tmp_path / "conf.d"), "state": "directory", "mode": "0755"},
        {"path": str(stale), "state": "absent"},
    ]
    normal = checked_ok(*entries)
    in_check_mode = checked_ok(*entries, check_mode=True)
    keys = ("changed", "differ", "reasons", "in_place", "checked")
    assert {key: in_check_mode[key] for key in keys} == {key: normal[key] for key in keys}
    assert in_check_mode["changed"] is False and in_check_mode["checked"] == 3
    assert len(in_check_mode["differ"]) == 3
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and config.read_bytes() == CONTENT
    assert not (tmp_path / "conf.d").exists() and stale.exists()


# ------------------------------------------------------------------ entries the module refuses


@pytest.mark.parametrize(
    "checksum",
    [
        "abc",
        sha1(CONTENT).upper(),
        sha1(CONTENT) + "0",
        "g" * 40,
        hashlib.sha256(CONTENT).hexdigest(),
    ],
)
def test_a_bad_checksum_names_the_entry(config: Path, checksum: str) -> None:
    msg = failure({"path": str(config)}, {"path": str(config) + ".2", "checksum": checksum})
    assert msg.startswith("files[1].checksum: ")
    assert repr(checksum) in msg and "SHA-1" in msg


@pytest.mark.parametrize("mode", ["0o644", "u=rw", "64", "06444", "0648", "", "rw-r--r--"])
def test_a_bad_mode_names_the_entry_and_the_value(config: Path, mode: str) -> None:
    msg = failure({"path": str(config), "mode": "0644"}, {"path": str(config) + ".2", "mode": mode})
    assert msg.startswith("files[1].mode: ")
    assert repr(mode) in msg


def test_an_unquoted_yaml_mode_is_refused(config: Path) -> None:
    msg = failure({"path": str(config), "mode": 420})
    assert msg.startswith("files[0].mode: 420 is not a string")
    assert "quote" in msg


def test_a_relative_path_names_the_entry(config: Path) -> None:
    msg = failure(
        {"path": str(config)},
        {"path": str(config) + ".2"},
        {"path": str(config) + ".3"},
        {"path": "etc/containerd/config.toml"},
    )
    assert msg == "files[3].path: 'etc/containerd/config.toml' is not an absolute path"


@pytest.mark.parametrize("state", ["directory", "absent"])
def test_a_checksum_is_only_for_state_file(tmp_path: Path, state: str) -> None:
    msg = failure({"path": str(tmp_path / "conf.d"), "state": state, "checksum": sha1(CONTENT)})
    assert msg == f"files[0].checksum: only for state=file, not state={state}"


def test_owner_group_and_mode_are_not_for_state_absent(tmp_path: Path) -> None:
    msg = failure(
        {"path": str(tmp_path / "a")},
        {"path": str(tmp_path / "b"), "state": "absent", "owner": "root", "mode": "0644"},
    )
    assert msg == "files[1]: owner, mode not with state=absent"


@pytest.mark.parametrize("second", ["{base}", "{base}/", "{parent}//config.toml", "{parent}/./config.toml"])
def test_a_duplicate_path_names_both_entries(config: Path, second: str) -> None:
    duplicate = second.format(base=config, parent=config.parent)
    msg = failure({"path": str(config)}, {"path": str(config.parent)}, {"path": duplicate})
    assert msg == f"files[0].path and files[2].path both name {config}"


def test_a_bad_entry_fails_before_any_path_is_read(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_reading(path: str) -> str:
        raise AssertionError(f"read {path} before validating every entry")

    monkeypatch.setattr(files_in_place, "sha1_of_file", no_reading)
    msg = failure({"path": str(config), "checksum": sha1(CONTENT)}, {"path": "relative"})
    assert msg.startswith("files[1].path: ")


def test_a_state_outside_the_choices_is_refused(config: Path) -> None:
    msg = failure({"path": str(config), "state": "link"})
    assert "state" in msg and "link" in msg


def test_path_is_required() -> None:
    msg = failure({"mode": "0644"})
    assert "path" in msg


# ------------------------------------------------------------------ what the module may not read


def test_an_unreadable_file_fails_naming_it_and_become(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = open

    def open_denied(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == str(config):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(files_in_place, "open", open_denied, raising=False)
    msg = failure({"path": str(config), "checksum": sha1(CONTENT)})
    assert msg == f"cannot read {config}: Permission denied; run the task with become: true"


def test_a_path_that_cannot_be_looked_at_fails_naming_it_and_become(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_stat = os.stat

    def stat_denied(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == str(config):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(files_in_place.os, "stat", stat_denied)
    msg = failure({"path": str(config)})
    assert msg == f"cannot look at {config}: Permission denied; run the task with become: true"


def test_absent_on_a_path_that_cannot_be_looked_at_fails(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_lstat = os.lstat

    def lstat_denied(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == str(config):
            raise PermissionError(13, "Permission denied", str(path))
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(files_in_place.os, "lstat", lstat_denied)
    msg = failure({"path": str(config), "state": "absent"})
    assert msg == f"cannot look at {config}: Permission denied; run the task with become: true"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_file_of_mode_0000_fails_without_become(config: Path) -> None:
    config.chmod(0)
    msg = failure({"path": str(config), "checksum": sha1(CONTENT)})
    assert str(config) in msg and "become: true" in msg


# --- units: systemd's state of the role's units, from one systemctl show call -------------------------------

RUNNING_ENABLED = {
    "LoadState": "loaded",
    "UnitFileState": "enabled",
    "ActiveState": "active",
    "NeedDaemonReload": "no",
    "ConditionResult": "yes",
    "ConditionTimestampMonotonic": "36140269430",
    # what systemctl is-enabled prints (read from disk, where UnitFileState is systemd's cached view)
    "is-enabled": "enabled",
}
FAKE_SYSTEMCTL = """#!/bin/sh
# systemctl show as systemd prints it (a block of KEY=value lines per unit named after --, blank lines
# between), and is-enabled of one unit: its state on stdout, exit 0 for the states systemd counts as enabled
echo "$@" >> "$FAKE_SYSTEMCTL_CALLS"
[ -n "$FAKE_SYSTEMCTL_FAIL" ] && { echo "$FAKE_SYSTEMCTL_FAIL" >&2; exit 1; }
exec python3 -c '
import json, os, sys
units = json.loads(os.environ["FAKE_UNITS"])
gone = {"LoadState": "not-found", "UnitFileState": "", "ActiveState": "inactive"}
names = sys.argv[sys.argv.index("--") + 1:]
if sys.argv[1] == "is-enabled":
    state = units.get(names[0], {}).get("is-enabled")
    if state is None:
        sys.exit(print(f"Failed to get unit file state for {names[0]}: No such file", file=sys.stderr) or 1)
    print(state)
    zero = {"enabled", "enabled-runtime", "static", "alias", "indirect", "generated", "transient"}
    sys.exit(0 if state in zero else 1)
print("\\n\\n".join("\\n".join(f"{k}={v}" for k, v in {"Id": n, **units.get(n, gone)}.items()
    if k != "is-enabled") for n in names))
' "$@"
"""


@pytest.fixture
def systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake systemctl first on PATH; the units it knows are set with units(); returns its call log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL)
    fake.chmod(0o755)
    calls = tmp_path / "systemctl-calls"
    calls.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMCTL_CALLS", str(calls))
    monkeypatch.setenv("FAKE_UNITS", "{}")
    return calls


def units(monkeypatch: pytest.MonkeyPatch, **known: dict[str, str]) -> None:
    monkeypatch.setenv("FAKE_UNITS", json.dumps(known))


def check_units(
    *wanted: dict[str, Any], files: list[dict[str, Any]] | None = None
) -> tuple[bool, dict[str, Any]]:
    return run_module(files_in_place, {"files": files or [], "units": list(wanted)})


def test_units_enabled_and_running_are_in_place_from_one_systemctl_call(
    systemd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    units(monkeypatch, **{"chrony.service": RUNNING_ENABLED, "kubelet.service": RUNNING_ENABLED})
    failed, result = check_units(
        {"name": "chrony.service", "enabled": True, "active": True},
        {"name": "kubelet.service", "enabled": True},
    )
    assert not failed, result
    assert (result["in_place"], result["differ"], result["checked"]) == (True, [], 2)
    assert result["units"]["chrony.service"]["ConditionResult"] == "yes"
    calls = systemd.read_text().splitlines()
    # one show for both; is-enabled of each unit whose enabling is compared
    assert calls[0].startswith("show --property=Id,LoadState,UnitFileState,ActiveState,NeedDaemonReload,")
    assert calls[0].endswith("-- chrony.service kubelet.service")
    assert calls[1:] == ["is-enabled -- chrony.service", "is-enabled -- kubelet.service"]


@pytest.mark.parametrize(
    ("state", "wanted", "reason"),
    [
        ({"ActiveState": "inactive"}, {"active": True}, "not running (ActiveState=inactive)"),
        ({"ActiveState": "failed"}, {"active": True}, "not running (ActiveState=failed)"),
        ({"is-enabled": "disabled"}, {"enabled": True}, "not enabled (is-enabled: disabled)"),
        # its link removed by hand: systemd's cached UnitFileState still says enabled, is-enabled does not
        (
            {"UnitFileState": "enabled", "is-enabled": "disabled"},
            {"enabled": True},
            "not enabled (is-enabled: disabled)",
        ),
        # enabled for this boot only, or through another unit: systemd_service enables such a unit again
        ({"is-enabled": "enabled-runtime"}, {"enabled": True}, "not enabled (is-enabled: enabled-runtime)"),
        ({"is-enabled": "indirect"}, {"enabled": True}, "not enabled (is-enabled: indirect)"),
        ({"is-enabled": "masked"}, {"enabled": True}, "not enabled (is-enabled: masked)"),
        ({}, {"enabled": False}, "enabled, want disabled (is-enabled: enabled)"),
        ({}, {"active": False}, "running, want stopped (ActiveState=active)"),
        (
            {"ActiveState": "deactivating"},
            {"active": False},
            "running, want stopped (ActiveState=deactivating)",
        ),
        ({"LoadState": "not-found"}, {"enabled": True}, "not loaded (LoadState=not-found)"),
        ({"LoadState": "not-found"}, {"active": True, "enabled": False}, "not loaded (LoadState=not-found)"),
    ],
)
def test_a_unit_not_as_the_role_wants_it_differs_with_its_reason(
    systemd: Path, monkeypatch: pytest.MonkeyPatch, state: dict[str, str], wanted: dict[str, Any], reason: str
) -> None:
    units(monkeypatch, **{"x.service": {**RUNNING_ENABLED, **state}})
    failed, result = check_units({"name": "x.service", **wanted})
    assert not failed, result
    assert (result["in_place"], result["differ"], result["reasons"]) == (
        False,
        ["x.service"],
        {"x.service": [reason]},
    )


@pytest.mark.parametrize(
    ("state", "wanted"),
    [
        ({"is-enabled": "static"}, {"enabled": True}),
        ({"is-enabled": "generated"}, {"enabled": True}),
        # systemd_service does not reload for a unit file changed on disk: neither is it a difference here
        ({"NeedDaemonReload": "yes"}, {"enabled": True, "active": True}),
        ({"ActiveState": "activating"}, {"active": True}),
        ({"is-enabled": "disabled", "ActiveState": "inactive"}, {"enabled": False, "active": False}),
        # a unit the role wants neither enabled nor running may be gone
        ({"LoadState": "not-found", "UnitFileState": "", "ActiveState": "inactive"}, {"enabled": False}),
    ],
)
def test_a_unit_as_the_role_wants_it_is_in_place(
    systemd: Path, monkeypatch: pytest.MonkeyPatch, state: dict[str, str], wanted: dict[str, Any]
) -> None:
    units(monkeypatch, **{"x.service": {**RUNNING_ENABLED, **state}})
    failed, result = check_units({"name": "x.service", **wanted})
    assert not failed, result
    assert result["in_place"] is True, result["reasons"]


def test_files_and_units_are_reported_together(
    systemd: Path, monkeypatch: pytest.MonkeyPatch, config: Path
) -> None:
    units(monkeypatch, **{"x.service": {**RUNNING_ENABLED, "ActiveState": "inactive"}})
    failed, result = check_units(
        {"name": "x.service", "active": True}, files=[{"path": str(config), "checksum": sha1(b"other")}]
    )
    assert not failed, result
    assert result["differ"] == [str(config), "x.service"]
    assert result["checked"] == 2


@pytest.mark.parametrize(
    ("wanted", "says"),
    [
        ([{"name": "x.service"}], "units[0]: give enabled, active or both"),
        ([{"name": "x.service", "active": True}, {"name": "x.service", "enabled": True}],
         "units[0].name and units[1].name both name x.service"),
        ([{"name": "-x", "active": True}], "units[0].name: '-x' is not a unit name"),
        ([{"name": "a b", "active": True}], "units[0].name: 'a b' is not a unit name"),
        ([{"name": "nvidia-*", "active": True}], "units[0].name: 'nvidia-*' is not a unit name"),
        ([{"name": "/etc/x.service", "active": True}], "units[0].name: '/etc/x.service' is not a unit name"),
    ],
)  # fmt: skip
def test_a_unit_entry_it_cannot_check_is_refused_naming_it(
    systemd: Path, wanted: list[dict[str, Any]], says: str
) -> None:
    failed, result = check_units(*wanted)
    assert failed
    assert result["msg"] == says
    assert systemd.read_text() == ""


def test_a_failing_systemctl_fails_the_task_with_its_message(
    systemd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SYSTEMCTL_FAIL", "Failed to connect to bus: No such file or directory")
    failed, result = check_units({"name": "x.service", "active": True})
    assert failed
    assert (
        result["msg"] == "systemctl show failed (rc 1): Failed to connect to bus: No such file or directory"
    )


def test_without_units_systemctl_is_not_called(systemd: Path, config: Path) -> None:
    result = checked_ok({"path": str(config), "checksum": sha1(CONTENT)})
    assert "units" in result and result["units"] == {}
    assert systemd.read_text() == ""
