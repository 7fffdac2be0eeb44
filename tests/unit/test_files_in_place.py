"""files_in_place: which managed paths differ (content, kind, owner, group, mode, absence), the entry
validation that names the entry, permission errors, and check mode; the partial edits (lineinfile,
blockinfile, replace), with their verdicts held against the real builtin modules; and the units."""

from __future__ import annotations

import grp
import hashlib
import itertools
import json
import os
import pwd
import stat
from pathlib import Path
from types import ModuleType
from typing import Any

import ansible.modules.blockinfile as real_blockinfile
import ansible.modules.lineinfile as real_lineinfile
import ansible.modules.replace as real_replace
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


def test_a_pinned_sha256_as_get_url_takes_it_compares_the_content(config: Path) -> None:
    pinned = "sha256:" + hashlib.sha256(CONTENT).hexdigest()
    assert checked_ok({"path": str(config), "checksum": pinned, "mode": "0644"})["in_place"] is True
    config.write_bytes(CONTENT + b"# edited\n")
    result = checked_ok({"path": str(config), "checksum": pinned})
    assert result["differ"] == [str(config)]
    assert result["reasons"] == {str(config): ["content differs"]}


def test_without_checksum_the_content_is_not_compared(config: Path) -> None:
    config.write_bytes(b"anything else\n")
    assert checked_ok({"path": str(config)})["in_place"] is True


def test_content_differs(config: Path) -> None:
    result = checked_ok({"path": str(config), "checksum": sha1(CONTENT + b"# one more line\n")})
    assert result["in_place"] is False
    assert result["differ"] == [str(config)]
    assert result["reasons"] == {str(config): ["content differs"]}


def test_a_file_larger_than_one_read_is_hashed_whole(tmp_path: Path) -> None:
    data = b"x" * path_reads.CHUNK_SIZE + b"tail"
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
        "sha256:" + hashlib.sha256(CONTENT).hexdigest().upper(),
        "sha256:" + sha1(CONTENT),
        "md5:" + hashlib.md5(CONTENT).hexdigest(),
        "sha1:" + sha1(CONTENT),
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
    def no_reading(path: str, checksum: str) -> str:
        raise AssertionError(f"read {path} before validating every entry")

    monkeypatch.setattr(files_in_place, "content_digest", no_reading)
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

    monkeypatch.setattr(path_reads, "open", open_denied, raising=False)  # its one reader of content
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


# --- edits: partial edits of files (lineinfile, blockinfile, replace) --------------------------------------

BEGIN = "# BEGIN ANSIBLE MANAGED BLOCK\n"
END = "# END ANSIBLE MANAGED BLOCK\n"
HOSTS_BLOCK = "10.0.0.11 gpu-node-1\n10.0.0.12 gpu-node-2\n"


def check_edits(
    *edits: dict[str, Any], files: list[dict[str, Any]] | None = None
) -> tuple[bool, dict[str, Any]]:
    return run_module(files_in_place, {"files": files or [], "edits": list(edits)})


def edits_checked(*edits: dict[str, Any], files: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    failed, result = check_edits(*edits, files=files)
    assert not failed, result["msg"]
    assert result["changed"] is False
    return result


def edit_reasons(path: Path, text: str | bytes, **edit: Any) -> list[str]:
    """Why EDIT of a file holding TEXT differs (empty: in place)."""
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    result = edits_checked({"path": str(path), **edit})
    assert result["in_place"] is (not result["reasons"])
    return result["reasons"].get(str(path), [])


def edit_failure(*edits: dict[str, Any], files: list[dict[str, Any]] | None = None) -> str:
    failed, result = check_edits(*edits, files=files)
    assert failed, result
    return str(result["msg"])


@pytest.fixture
def edited(tmp_path: Path) -> Path:
    return tmp_path / "edited.conf"


def test_only_edits_need_be_given(edited: Path) -> None:
    edited.write_text("vm.max_map_count = 262144\n")
    failed, result = run_module(
        files_in_place, {"edits": [{"path": str(edited), "line": "vm.max_map_count = 262144"}]}
    )
    assert not failed, result
    assert (result["in_place"], result["differ"], result["checked"]) == (True, [], 1)


# ------------------------------------------------------------------ line (lineinfile)


@pytest.mark.parametrize(
    "text",
    [
        "a = 1\nvm.max_map_count = 262144\nb = 2\n",
        "vm.max_map_count = 262144\n",
        # anywhere in the file: lineinfile's insertbefore/insertafter do not count once the line is there
        "vm.max_map_count = 262144\na = 1\n",
        # an earlier copy with a CRLF ending does not count: lineinfile looks at the last one
        "vm.max_map_count = 262144\r\nvm.max_map_count = 262144\n",
        b"\xff\xfe not UTF-8\nvm.max_map_count = 262144\n",
    ],
)
def test_a_line_that_is_there_is_in_place(edited: Path, text: str | bytes) -> None:
    assert edit_reasons(edited, text, line="vm.max_map_count = 262144") == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a = 1\n", "line missing"),
        ("", "line missing"),
        ("vm.max_map_count = 262144 \n", "line missing"),
        ("# vm.max_map_count = 262144\n", "line missing"),
        # lineinfile rewrites the line as line + os.linesep
        ("a = 1\r\nvm.max_map_count = 262144\r\nb = 2\r\n", "line present but ends with '\\r\\n', not '\\n'"),
        (
            "vm.max_map_count = 262144\nvm.max_map_count = 262144\r\n",
            "line present but ends with '\\r\\n', not '\\n'",
        ),
        (
            "a = 1\nvm.max_map_count = 262144",
            "line present but without a line break (the last line of the file)",
        ),
    ],
)
def test_a_line_that_is_not_there_as_lineinfile_writes_it_differs(
    edited: Path, text: str, reason: str
) -> None:
    assert edit_reasons(edited, text, line="vm.max_map_count = 262144") == [reason]


def test_an_empty_line_is_a_line(edited: Path) -> None:
    assert edit_reasons(edited, "a\n\nb\n", line="") == []
    assert edit_reasons(edited, "a\nb\n", line="") == ["line missing"]


def test_a_line_with_a_line_break_is_refused(edited: Path) -> None:
    msg = edit_failure({"path": str(edited), "line": "a = 1\n"})
    assert msg.startswith("edits[0].line: 'a = 1\\n' holds a line break")


# ------------------------------------------------------------------ block (blockinfile)


@pytest.mark.parametrize(
    ("text", "edit"),
    [
        (BEGIN + HOSTS_BLOCK + END, {}),
        ("127.0.0.1 localhost\n" + BEGIN + HOSTS_BLOCK + END + "::1 localhost\n", {}),
        # blockinfile adds the missing line break to the block
        (BEGIN + HOSTS_BLOCK + END, {"block": HOSTS_BLOCK.rstrip("\n")}),
        # the line before the block may end with CRLF: it ends with \n
        ("a\r\n" + BEGIN + HOSTS_BLOCK + END, {}),
        ("a\n<!-- OPEN nodes -->\n" + HOSTS_BLOCK + "<!-- CLOSE nodes -->\nb\n",
         {"marker": "<!-- {mark} nodes -->", "marker_begin": "OPEN", "marker_end": "CLOSE"}),
        # a form feed breaks a str into lines, not bytes: blockinfile keeps it inside the line
        (BEGIN + "a\x0cb\n" + END, {"block": "a\x0cb"}),
        (b"\xff\n" + (BEGIN + HOSTS_BLOCK + END).encode(), {}),
    ],
)  # fmt: skip
def test_a_block_as_blockinfile_writes_it_is_in_place(
    edited: Path, text: str | bytes, edit: dict[str, Any]
) -> None:
    assert edit_reasons(edited, text, **{"block": HOSTS_BLOCK, **edit}) == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("127.0.0.1 localhost\n", "block missing (neither marker found)"),
        ("", "block missing (neither marker found)"),
        (BEGIN + "10.0.0.11 gpu-node-1\n" + END, "block content differs"),
        (BEGIN + HOSTS_BLOCK + "10.0.0.13 gpu-node-3\n" + END, "block content differs"),
        (BEGIN + HOSTS_BLOCK.replace("\n", "\r\n") + END, "block content differs"),
        (BEGIN + HOSTS_BLOCK + END + BEGIN + HOSTS_BLOCK + END, "begin marker found 2 times"),
        (BEGIN + HOSTS_BLOCK + END + END, "end marker found 2 times"),
        (BEGIN + HOSTS_BLOCK, "end marker missing"),
        (HOSTS_BLOCK + END, "begin marker missing"),
        (END + HOSTS_BLOCK + BEGIN, "end marker before begin marker"),
        # the markers are whole lines, line break included
        (BEGIN + HOSTS_BLOCK + END.rstrip("\n"), "end marker missing"),
        (BEGIN.replace("\n", "\r\n") + HOSTS_BLOCK + END, "begin marker missing"),
        ("  " + BEGIN + HOSTS_BLOCK + END, "begin marker missing"),
        (BEGIN + HOSTS_BLOCK + END + "# last line", "no line break at the end of the file"),
        # blockinfile puts a \n after the line before the block
        ("a\r" + BEGIN + HOSTS_BLOCK + END, "the line before the begin marker ends with '\\r'"),
    ],
)
def test_a_block_not_as_blockinfile_writes_it_differs(edited: Path, text: str, reason: str) -> None:
    assert edit_reasons(edited, text, block=HOSTS_BLOCK) == [reason]


def test_the_markers_are_the_tasks(edited: Path) -> None:
    text = "# BEGIN nodes\n" + HOSTS_BLOCK + "# END nodes\n"
    assert edit_reasons(edited, text, block=HOSTS_BLOCK, marker="# {mark} nodes") == []
    assert edit_reasons(edited, text, block=HOSTS_BLOCK) == ["block missing (neither marker found)"]
    assert edit_reasons(edited, text, block=HOSTS_BLOCK, marker="# {mark} nodes", marker_end="STOP") == [
        "end marker missing"
    ]


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"block": ""}, "edits[0].block: empty; blockinfile then removes the block"),
        ({"block": "x", "marker": "# managed"}, "edits[0].marker: '# managed' holds no {mark}"),
        ({"line": "x", "marker": "# {mark}"}, "edits[0]: marker only with block, not with line"),
        ({"absent_regexp": "x", "marker_begin": "A", "marker_end": "B"},
         "edits[0]: marker_begin, marker_end only with block, not with absent_regexp"),
        ({"block": "x", "marker_begin": "\u263a"}, "edits[0].marker_begin: '\u263a' is not Latin-1"),
        ({"block": "x", "marker_end": "\\d"}, "edits[0].marker_end: '\\\\d': bad escape"),
    ],
)  # fmt: skip
def test_a_block_entry_it_cannot_check_is_refused_naming_the_field(
    edited: Path, edit: dict[str, Any], says: str
) -> None:
    assert edit_failure({"path": str(edited), **edit}).startswith(says)


# ------------------------------------------------------------------ absent_regexp (replace)


def test_an_absent_regexp_that_matches_nowhere_is_in_place(edited: Path) -> None:
    fstab = "UUID=1 / ext4 defaults 0 1\n# /swap.img none swap sw 0 0\n"
    assert edit_reasons(edited, fstab, absent_regexp=r"^([^#\n].*\sswap\s.*)$") == []
    assert edit_reasons(edited, b"\xff\xfe\n", absent_regexp="swap") == []


def test_an_absent_regexp_matching_a_middle_line_differs_naming_it(edited: Path) -> None:
    # ^ and $ at every line, as replace searches (re.MULTILINE); without it neither would match here
    fstab = "UUID=1 / ext4 defaults 0 1\n/swap.img none swap sw 0 0\nUUID=2 /data ext4 defaults 0 2\n"
    assert edit_reasons(edited, fstab, absent_regexp=r"^([^#\n].*\sswap\s.*)$") == [
        "absent_regexp matches at line 2"
    ]


@pytest.mark.parametrize(
    ("regexp", "says"),
    [
        ("(swap", "edits[0].absent_regexp: '(swap' is not a regular expression (missing ), unterminated"),
        ("", "edits[0].absent_regexp: empty; it matches every file"),
    ],
)
def test_an_absent_regexp_it_cannot_use_is_refused(edited: Path, regexp: str, says: str) -> None:
    msg = edit_failure(
        {"path": str(edited), "line": "x"},
        {"path": "/etc/fstab", "absent_regexp": "x"},
        {"path": str(edited) + ".3", "absent_regexp": regexp},
    )
    assert msg.startswith(says.replace("[0]", "[2]"))


# ------------------------------------------------------------------ what every kind shares


EVERY_KIND = [{"line": "a = 1"}, {"block": "a = 1"}, {"absent_regexp": "^b"}]


@pytest.mark.parametrize("edit", EVERY_KIND)
def test_an_edit_of_a_missing_file_differs(edited: Path, edit: dict[str, Any]) -> None:
    result = edits_checked({"path": str(edited), **edit})
    assert (result["in_place"], result["differ"], result["reasons"]) == (
        False,
        [str(edited)],
        {str(edited): ["missing"]},
    )


@pytest.mark.parametrize("edit", EVERY_KIND)
def test_an_edit_of_a_directory_or_a_dangling_link_differs(tmp_path: Path, edit: dict[str, Any]) -> None:
    directory, link = tmp_path / "conf.d", tmp_path / "link.conf"
    directory.mkdir()
    link.symlink_to(tmp_path / "nowhere")
    result = edits_checked({"path": str(directory), **edit}, {"path": str(link), **edit})
    assert result["reasons"] == {
        str(directory): ["not a regular file (a directory)"],
        str(link): ["missing (a dangling symlink)"],
    }


@pytest.mark.parametrize("edit", EVERY_KIND)
def test_an_edit_in_place_with_its_owner_group_and_mode_is_in_place(
    edited: Path, edit: dict[str, Any]
) -> None:
    write(edited, (BEGIN + "a = 1\n" + END).encode(), mode=0o640)
    result = edits_checked(
        {"path": str(edited), **edit, "owner": my_user(), "group": str(os.getgid()), "mode": "0640"}
    )
    assert result["in_place"] is True, result["reasons"]


def test_an_edit_with_another_owner_or_mode_differs_after_its_content(edited: Path) -> None:
    write(edited, b"b = 2\n", mode=0o600)
    other_uid = os.getuid() + 4242
    result = edits_checked(
        {"path": str(edited), "line": "a = 1", "owner": str(other_uid), "group": NO_SUCH_NAME, "mode": "0644"}
    )
    assert result["reasons"] == {
        str(edited): [
            "line missing",
            f"owner {my_user()}, want {other_uid}",
            f"group {NO_SUCH_NAME!r} does not exist",
            "mode 0600, want 0644",
        ]
    }


def test_a_symlink_to_an_edited_file_is_followed(edited: Path, tmp_path: Path) -> None:
    edited.write_text("a = 1\n")
    link = tmp_path / "link.conf"
    link.symlink_to(edited)
    assert edits_checked({"path": str(link), "line": "a = 1"})["in_place"] is True


def test_files_edits_and_units_are_reported_together_in_that_order(
    systemd: Path, monkeypatch: pytest.MonkeyPatch, config: Path, edited: Path
) -> None:
    units(monkeypatch, **{"x.service": {**RUNNING_ENABLED, "ActiveState": "inactive"}})
    edited.write_text("a = 1\n")
    failed, result = run_module(
        files_in_place,
        {
            "units": [{"name": "x.service", "active": True}],
            "edits": [
                {"path": str(edited), "line": "b = 2"},
                {"path": str(config) + ".in-place", "absent_regexp": "x"},
            ],
            "files": [{"path": str(config), "checksum": sha1(b"other")}],
        },
    )
    assert not failed, result
    assert result["differ"] == [str(config), str(edited), str(config) + ".in-place", "x.service"]
    assert result["checked"] == 4


@pytest.mark.parametrize(
    ("edits", "files", "says"),
    [
        ([{}], [], "edits[0]: give exactly one of line, block, absent_regexp"),
        ([{"line": "a"}, {"line": "a", "block": "a"}], [],
         "edits[1]: give exactly one of line, block, absent_regexp (got line, block)"),
        ([{"line": "a", "block": "a", "absent_regexp": "a"}], [],
         "edits[0]: give exactly one of line, block, absent_regexp (got line, block, absent_regexp)"),
        ([{"line": "a", "path": "etc/hosts"}], [], "edits[0].path: 'etc/hosts' is not an absolute path"),
        ([{"line": "a", "mode": 420}], [], "edits[0].mode: 420 is not a string; quote the mode"),
        ([{"line": "a", "mode": "u=rw"}], [], "edits[0].mode: 'u=rw' is not 3 or 4 octal digits"),
        ([{"line": "a"}, {"line": "b", "path": "{path}/"}], [],
         "edits[0].path and edits[1].path both name {path}"),
        ([{"line": "a", "path": "{parent}/./edited.conf"}], [{"path": "{parent}/other"}, {"path": "{path}"}],
         "files[1].path and edits[0].path both name {path}"),
    ],
)  # fmt: skip
def test_an_edit_entry_it_cannot_check_is_refused_naming_it(
    edited: Path, edits: list[dict[str, Any]], files: list[dict[str, Any]], says: str
) -> None:
    def filled(entry: dict[str, Any]) -> dict[str, Any]:
        path = entry.get("path", "{path}")
        return {**entry, "path": path.format(path=edited, parent=edited.parent)}

    msg = edit_failure(*map(filled, edits), files=list(map(filled, files)))
    assert msg.startswith(says.format(path=edited)), msg


def test_a_bad_edit_fails_before_any_file_is_read(edited: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_reading(path: str) -> str:
        raise AssertionError(f"read {path} before validating every entry")

    monkeypatch.setattr(files_in_place, "text_of_file", no_reading)
    edited.write_text("a\n")
    msg = edit_failure({"path": str(edited), "line": "a"}, {"path": str(edited) + ".2", "absent_regexp": "("})
    assert msg.startswith("edits[1].absent_regexp: ")


@pytest.mark.parametrize("edit", EVERY_KIND)
def test_an_edited_file_it_may_not_read_fails_naming_it_and_become(
    edited: Path, monkeypatch: pytest.MonkeyPatch, edit: dict[str, Any]
) -> None:
    edited.write_text("a = 1\n")
    real_open = open

    def open_denied(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == str(edited):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(files_in_place, "open", open_denied, raising=False)
    msg = edit_failure({"path": str(edited), **edit})
    assert msg == f"cannot read {edited}: Permission denied; run the task with become: true"


def test_edits_change_nothing_in_check_mode_either(edited: Path) -> None:
    write(edited, b"b = 2\r\n", mode=0o600)
    entries = [{"path": str(edited), "line": "b = 2", "mode": "0644"}]
    normal = edits_checked(*entries)
    failed, in_check_mode = run_module(files_in_place, {"edits": entries}, check_mode=True)
    assert not failed
    keys = ("changed", "differ", "reasons", "in_place", "checked")
    assert {key: in_check_mode[key] for key in keys} == {key: normal[key] for key in keys}
    assert edited.read_bytes() == b"b = 2\r\n" and stat.S_IMODE(edited.stat().st_mode) == 0o600


# ------------------------------------------------------------------ the verdicts against the real builtins


def real_task_changes(module: ModuleType, path: Path, args: dict[str, Any]) -> bool:
    """Whether the real builtin module, run in check mode on PATH with ARGS, would change it (a failure, as
    for a missing file without create, counts: the task does not leave it as it is)."""
    before = path.read_bytes() if path.exists() else None
    failed, result = run_module(module, {"path": str(path), **args}, check_mode=True)
    assert (path.read_bytes() if path.exists() else None) == before, "check mode changed the file"
    return failed or bool(result["changed"])


def in_place(path: Path, edit: dict[str, Any]) -> bool:
    return bool(edits_checked({"path": str(path), **edit})["in_place"])


def files_of(fragments: tuple[str, ...], most: int) -> list[str]:
    """Every file of up to MOST of FRAGMENTS, in every order."""
    return [
        "".join(chosen) for count in range(most + 1) for chosen in itertools.product(fragments, repeat=count)
    ]


LINE = "vm.max_map_count = 262144"
LINE_FRAGMENTS = (f"{LINE}\n", f"{LINE}\r\n", LINE, f"{LINE}\r", "a = 1\n", f"{LINE} \n", "\n")


@pytest.mark.parametrize(
    "task",
    [{}, {"insertbefore": "BOF"}, {"insertafter": "^a = "}, {"insertbefore": "^a = "}, {"firstmatch": True},
     {"create": True}, {"mode": "0644"}],
)  # fmt: skip
def test_a_line_is_in_place_exactly_when_lineinfile_changes_nothing(
    edited: Path, task: dict[str, Any]
) -> None:
    checked = 0
    for text in [None, *files_of(LINE_FRAGMENTS, 3)]:
        if text is None:
            edited.unlink(missing_ok=True)
        else:
            write(edited, text.encode(), mode=0o644)
        edit = {"line": LINE, **({"mode": task["mode"]} if "mode" in task else {})}
        verdict = in_place(edited, edit)
        assert verdict is not real_task_changes(real_lineinfile, edited, {"line": LINE, **task}), repr(text)
        checked += 1
    assert checked == 1 + 1 + 7 + 7**2 + 7**3


def test_a_line_is_not_for_a_task_with_firstmatch_and_an_insertion_regexp(edited: Path) -> None:
    """lineinfile with firstmatch stops looking for the line at the first line insertbefore/insertafter
    matches: a copy of the line further down does not stop it adding another (hence the documented
    exclusion)."""
    edited.write_text(f"a = 1\nb = 2\n{LINE}\n")
    assert in_place(edited, {"line": LINE}) is True
    for task in ({"insertbefore": "^a = ", "firstmatch": True}, {"insertafter": "^a = ", "firstmatch": True}):
        assert real_task_changes(real_lineinfile, edited, {"line": LINE, **task}) is True
        assert (
            real_task_changes(real_lineinfile, edited, {"line": LINE, **task, "firstmatch": False}) is False
        )


def test_a_line_with_another_mode_differs_as_lineinfile_changes_it(edited: Path) -> None:
    write(edited, f"{LINE}\n".encode(), mode=0o600)
    assert in_place(edited, {"line": LINE, "mode": "0644"}) is False
    assert real_task_changes(real_lineinfile, edited, {"line": LINE, "mode": "0644"}) is True
    assert in_place(edited, {"line": LINE, "mode": "0600"}) is True
    assert real_task_changes(real_lineinfile, edited, {"line": LINE, "mode": "0600"}) is False


BLOCK_FRAGMENTS = (BEGIN, END, "x\n", "y\n", "x\r\n", "\r", END.rstrip("\n"))


def blockinfile_may_leave_it(text: str) -> bool:
    """The files where blockinfile may change nothing though files_in_place, to be safe, says it differs: a
    marker line found more than once (blockinfile takes the last of each), or no line break at the end (the
    lines after the end marker are blockinfile's to leave as they are)."""
    lines = text.splitlines(keepends=True)
    return lines.count(BEGIN) > 1 or lines.count(END) > 1 or not text.endswith("\n")


@pytest.mark.parametrize(
    ("task", "in_place_files"),
    [
        # the block alone, or with one of x, y, x CRLF before or after it
        ({"block": "x"}, 7),
        ({"block": "x\ny", "insertbefore": "BOF", "create": True}, 1),
    ],
)
def test_a_block_is_in_place_only_when_blockinfile_changes_nothing(
    edited: Path, task: dict[str, Any], in_place_files: int
) -> None:
    """Every file of up to four pieces, and none: where files_in_place says in place, blockinfile changes
    nothing; where it says the block differs, blockinfile changes the file, but in the cases
    blockinfile_may_leave_it."""
    verdicts = {True: 0, False: 0}
    for text in [None, *files_of(BLOCK_FRAGMENTS, 4)]:
        if text is None:
            edited.unlink(missing_ok=True)
        else:
            edited.write_bytes(text.encode())
        verdict = in_place(edited, {"block": task["block"]})
        changes = real_task_changes(real_blockinfile, edited, task)
        if verdict:
            assert not changes, repr(text)
        elif not changes:
            assert text is not None and blockinfile_may_leave_it(text), repr(text)
        verdicts[verdict] += 1
    assert verdicts == {True: in_place_files, False: 1 + 1 + 7 + 7**2 + 7**3 + 7**4 - in_place_files}


@pytest.mark.parametrize(
    ("text", "task", "verdict"),
    [
        (BEGIN + "x\n" + END, {"marker": "# {mark}"}, False),
        ("# BEGIN\nx\n# END\n", {"marker": "# {mark}"}, True),
        ("<!-- \xc9 -->\nx\n<!-- END -->\n", {"marker": "<!-- {mark} -->", "marker_begin": "\xc9"}, False),
        # blockinfile puts marker_begin in Latin-1, not UTF-8
        ("<!-- \xc9 -->\nx\n<!-- END -->\n".encode("latin-1"),
         {"marker": "<!-- {mark} -->", "marker_begin": "\xc9"}, True),
        (BEGIN + "x\n" + END, {"marker_begin": "\\g<0>"}, False),
        (BEGIN + "x\n" + END, {"marker_end": "BEGIN"}, False),
    ],
)  # fmt: skip
def test_markers_are_made_as_blockinfile_makes_them(
    edited: Path, text: str | bytes, task: dict[str, Any], verdict: bool
) -> None:
    edited.write_bytes(text.encode() if isinstance(text, str) else text)
    args = {"block": "x", **task}
    assert in_place(edited, args) is verdict
    assert real_task_changes(real_blockinfile, edited, args) is not verdict


def test_the_cases_where_blockinfile_may_change_nothing_though_the_block_differs_here(edited: Path) -> None:
    for text in [BEGIN + "x\n" + END + BEGIN + "x\n" + END, BEGIN + "x\n" + END + "last line"]:
        edited.write_text(text)
        assert in_place(edited, {"block": "x"}) is False
        assert real_task_changes(real_blockinfile, edited, {"block": "x"}) is False


REPLACE_FRAGMENTS = ("swap\n", "/swap.img none swap sw 0 0\n", "# /swap.img none swap\n", "a\r\n", "b")


@pytest.mark.parametrize(
    ("regexp", "replace"),
    [(r"^([^#\n].*\sswap\s.*)$", r"# \1"), (r"^/swap", "#/swap"), (r"swap$", "noswap"), (r"\r$", "")],
)
def test_an_absent_regexp_is_in_place_exactly_when_replace_changes_nothing(
    edited: Path, regexp: str, replace: str
) -> None:
    for text in files_of(REPLACE_FRAGMENTS, 3):
        edited.write_text(text, newline="")
        verdict = in_place(edited, {"absent_regexp": regexp})
        assert verdict is not real_task_changes(
            real_replace, edited, {"regexp": regexp, "replace": replace}
        ), repr(text)
    edited.unlink()
    assert in_place(edited, {"absent_regexp": regexp}) is False
    assert real_task_changes(real_replace, edited, {"regexp": regexp, "replace": replace}) is True


# ------------------------------------------------------------ stat and slurp, the reads for a role's logic

import ansible.module_utils.path_reads as path_reads  # noqa: E402
import ansible.modules.slurp as real_slurp  # noqa: E402
import ansible.modules.stat as real_stat  # noqa: E402

STAT_FIELDS = ("exists", "path", "isreg", "isdir", "islnk", "lnk_target", "mode", "uid", "gid", "pw_name",
               "gr_name", "size", "mtime", "checksum", "readable", "executable")  # fmt: skip


def reads_of(stat_paths: list[str], slurp_paths: list[str] | None = None) -> dict[str, Any]:
    failed, result = run_module(files_in_place, {"stat": stat_paths, "slurp": slurp_paths or []})
    assert not failed, result["msg"]
    return result


def builtin_stat(path: str) -> dict[str, Any]:
    failed, result = run_module(real_stat, {"path": path})
    assert not failed, result
    # bytes (lnk_target) are text once the result is JSON, as the role reads it
    return {
        key: value.decode() if isinstance(value, bytes) else value for key, value in result["stat"].items()
    }


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """One path of each kind a role's read meets: a file, a directory, links to both, a dangling link, a
    missing path and a path under a file."""
    file = write(tmp_path / "file", mode=0o640)
    directory = tmp_path / "dir"
    directory.mkdir(mode=0o750)
    (tmp_path / "link-to-file").symlink_to(file)
    (tmp_path / "link-to-dir").symlink_to(directory)
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    names = ["file", "dir", "link-to-file", "link-to-dir", "dangling", "missing", "file/under"]
    return {name: tmp_path / name for name in names}


def test_stat_answers_as_the_builtin_stat_does(tree: dict[str, Path]) -> None:
    """Every field the read returns, for every kind of path, equals what ansible.builtin.stat returns for it
    (its default follow=false: a link is the link)."""
    paths = [str(path) for path in tree.values()]
    result = reads_of(paths)
    assert list(result["stat"]) == paths
    # where the builtin fails (a path under a file: "Not a directory"), nothing is there
    assert result["stat"][str(tree["file/under"])] == {"exists": False}
    for path in paths[:-1]:
        ours, theirs = result["stat"][path], builtin_stat(path)
        assert set(ours) <= set(STAT_FIELDS), path
        assert ours == {field: theirs[field] for field in ours}, path
        # nothing the builtin returns of these fields is left out (lnk_target of a link, checksum of a file)
        assert {field for field in STAT_FIELDS if field in theirs} - set(ours) == set(), path


def test_slurp_answers_as_the_builtin_slurp_does_and_nothing_for_a_missing_file(
    tree: dict[str, Path],
) -> None:
    binary = write(tree["file"].parent / "binary", data=bytes(range(256)))
    wanted = [str(tree["file"]), str(binary), str(tree["link-to-file"]), str(tree["missing"])]
    result = reads_of([], wanted)
    for path in wanted[:3]:
        failed, theirs = run_module(real_slurp, {"src": path})
        assert not failed, theirs
        assert result["slurp"][path]["content"] == theirs["content"].decode("ascii")  # bytes before JSON
        assert result["slurp"][path]["encoding"] == theirs["encoding"] == "base64"
    failed, _ = run_module(real_slurp, {"src": str(tree["missing"])})
    assert failed and result["slurp"][str(tree["missing"])] == {}


def test_reads_do_not_count_as_checks_and_change_nothing(config: Path) -> None:
    result = reads_of([str(config)], [str(config)])
    assert result["checked"] == 0 and result["in_place"] is True and result["changed"] is False


@pytest.mark.parametrize("option", ["stat", "slurp"])
def test_a_relative_read_path_names_the_option_and_index(config: Path, option: str) -> None:
    failed, result = run_module(files_in_place, {option: [str(config), "etc/hostname"]})
    assert failed
    assert result["msg"] == f"{option}[1]: 'etc/hostname' is not an absolute path"


def test_a_read_that_is_denied_fails_naming_the_path_and_become(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(path: Any, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(path_reads.os, "lstat", denied)
    failed, result = run_module(files_in_place, {"stat": [str(config)]})
    assert failed
    assert result["msg"] == f"cannot look at {config}: Permission denied; run the task with become: true"
