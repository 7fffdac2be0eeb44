"""packages_in_place: which Debian package wants differ (installed, version, hold, absent, purged, regex,
half-installed states, multi-arch), read from a fake dpkg-query; the entry validation that names the entry;
a failing dpkg-query; and check mode. Then python_packages, read from fake virtualenvs in tmp_path (the
requirements, and the dependencies they need in turn; held against ansible.builtin.pip's own comparison and
importlib.metadata's reading of the dependencies), and apt_lists_age (held against ansible.builtin.apt's own
reading of the lists' time)."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import packages_in_place
import pytest
from ansible.module_utils import venv_distributions
from ansible.modules import apt as apt_module
from ansible.modules import pip as pip_module
from conftest import run_module

FAKE_DPKG_QUERY = """#!/bin/sh
here=$(dirname "$0")
printf '%s\\n' "$@" > "$here/argv"
cat "$here/listing"
cat "$here/stderr" >&2
exit "$(cat "$here/rc")"
"""

INSTALLED = "install ok installed"
HELD = "hold ok installed"
CONFIG_FILES = "deinstall ok config-files"
NOT_INSTALLED = "purge ok not-installed"
BETWEEN_STATES = ("half-configured", "unpacked", "half-installed", "triggers-pending", "triggers-awaited")


class FakeDpkgQuery:
    """A dpkg-query in tmp_path that prints canned lines and records its arguments."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "dpkg-query"
        self.path.write_text(FAKE_DPKG_QUERY)
        self.path.chmod(0o755)
        self.lists()

    def lists(self, *packages: tuple[str, str, str, str], rc: int = 0, stderr: str = "") -> None:
        """Each package as (name, architecture, version, status)."""
        (self.directory / "listing").write_text("".join("\t".join(package) + "\n" for package in packages))
        (self.directory / "stderr").write_text(stderr)
        (self.directory / "rc").write_text(str(rc))

    def prints(self, text: str) -> None:
        (self.directory / "listing").write_text(text)

    @property
    def argv(self) -> list[str] | None:
        """The arguments of its last run; None when it never ran."""
        argv = self.directory / "argv"
        return argv.read_text().splitlines() if argv.exists() else None


@pytest.fixture
def dpkg(tmp_path: Path) -> FakeDpkgQuery:
    fake = FakeDpkgQuery(tmp_path)
    fake.lists(
        ("nvidia-headless-535", "amd64", "535.183.06-0ubuntu1", HELD),
        ("nvidia-utils-535", "amd64", "535.183.06-0ubuntu1", INSTALLED),
        ("xserver-xorg-video-nouveau", "amd64", "1:1.0.17-2", NOT_INSTALLED),
        ("nvidia-driver-530", "amd64", "530.41.03-0ubuntu1", CONFIG_FILES),
        ("curl", "amd64", "7.81.0-1ubuntu1.16", INSTALLED),
    )
    return fake


def check(
    dpkg: FakeDpkgQuery, *packages: dict[str, Any], check_mode: bool = False
) -> tuple[bool, dict[str, Any]]:
    args = {"packages": list(packages), "dpkg_query": str(dpkg.path)}
    return run_module(packages_in_place, args, check_mode=check_mode)


def checked_ok(dpkg: FakeDpkgQuery, *packages: dict[str, Any], check_mode: bool = False) -> dict[str, Any]:
    failed, result = check(dpkg, *packages, check_mode=check_mode)
    assert not failed, result["msg"]
    assert result["changed"] is False
    assert dpkg.argv is not None, "the module did not run dpkg-query"
    return result


def reasons_of(dpkg: FakeDpkgQuery, entry: dict[str, Any]) -> list[str]:
    """The reasons of one entry; [] when it is in place."""
    result = checked_ok(dpkg, entry)
    assert result["in_place"] is (not result["differ"])
    return result["reasons"].get(entry["name"], [])


def failure(dpkg: FakeDpkgQuery, *packages: dict[str, Any]) -> str:
    failed, result = check(dpkg, *packages)
    assert failed, result
    return str(result["msg"])


# ------------------------------------------------------------------ all in place, and how dpkg-query is run


def test_wants_that_are_all_met_are_in_place(dpkg: FakeDpkgQuery) -> None:
    result = checked_ok(
        dpkg,
        {"name": "nvidia-headless-535", "version": "535.183.06-*", "held": True},
        {"name": "nvidia-utils-535", "version": "535.183.06-0ubuntu1", "held": False},
        {"name": "^nvidia-driver-[0-9]+$", "regex": True, "state": "absent"},
        {"name": "xserver-xorg-video-nouveau", "state": "purged"},
        {"name": "curl"},
    )
    assert result["in_place"] is True
    assert result["differ"] == [] and result["reasons"] == {}
    assert result["checked"] == 5


def test_dpkg_query_is_asked_for_every_package_in_one_format(dpkg: FakeDpkgQuery) -> None:
    checked_ok(dpkg, {"name": "curl"})
    # dpkg-query expands \t and \n itself: they reach it as backslash sequences, as from a shell's '...'
    assert dpkg.argv == ["-W", "-f", "${Package}\\t${Architecture}\\t${Version}\\t${Status}\\n"]


# ------------------------------------------------------------------ state=present


@pytest.mark.parametrize(
    "line",
    [
        None,  # unknown to dpkg
        ("tmux", "amd64", "3.2a-4", CONFIG_FILES),
        ("tmux", "amd64", "", NOT_INSTALLED),
    ],
    ids=["unknown", "config-files", "not-installed"],
)
def test_a_package_that_is_not_installed_differs(dpkg: FakeDpkgQuery, line: tuple[str, ...] | None) -> None:
    dpkg.lists(("curl", "amd64", "7.81.0-1ubuntu1.16", INSTALLED), *([line] if line else []))
    result = checked_ok(dpkg, {"name": "tmux"}, {"name": "curl"})
    assert result["in_place"] is False
    assert result["differ"] == ["tmux"]
    assert result["reasons"] == {"tmux": ["not installed"]}


def test_a_wrong_exact_version_differs(dpkg: FakeDpkgQuery) -> None:
    assert reasons_of(dpkg, {"name": "curl", "version": "7.81.0-1ubuntu1.17"}) == [
        "version 7.81.0-1ubuntu1.16, want 7.81.0-1ubuntu1.17"
    ]


def test_an_exact_version_is_not_a_prefix(dpkg: FakeDpkgQuery) -> None:
    assert reasons_of(dpkg, {"name": "curl", "version": "7.81.0"}) == [
        "version 7.81.0-1ubuntu1.16, want 7.81.0"
    ]


@pytest.mark.parametrize(
    ("version", "in_place"),
    [
        ("535.183.06-*", True),
        ("535.183.0?-0ubuntu1", True),
        ("535.*", True),
        ("535.161.08-*", False),
        ("535.183.06-?", False),
    ],
)
def test_a_glob_version(dpkg: FakeDpkgQuery, version: str, in_place: bool) -> None:
    reasons = reasons_of(dpkg, {"name": "nvidia-utils-535", "version": version})
    assert reasons == ([] if in_place else [f"version 535.183.06-0ubuntu1, want {version}"])


def test_the_version_is_compared_with_its_epoch(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(("containerd", "amd64", "1:1.7.12-1", INSTALLED))
    assert reasons_of(dpkg, {"name": "containerd", "version": "1:1.7.12-1"}) == []
    assert reasons_of(dpkg, {"name": "containerd", "version": "1.7.12-1"}) == [
        "version 1:1.7.12-1, want 1.7.12-1"
    ]


@pytest.mark.parametrize(
    ("status", "held", "reasons"),
    [
        (HELD, True, []),
        (INSTALLED, True, ["not held"]),
        (INSTALLED, False, []),
        (HELD, False, ["held, want not held"]),
        (HELD, None, []),
        (INSTALLED, None, []),
    ],
)
def test_held_and_not_held(dpkg: FakeDpkgQuery, status: str, held: bool | None, reasons: list[str]) -> None:
    dpkg.lists(("kubelet", "amd64", "1.30.4-1.1", status))
    entry: dict[str, Any] = {"name": "kubelet"}
    if held is not None:
        entry["held"] = held
    assert reasons_of(dpkg, entry) == reasons


def test_every_reason_of_one_package_is_listed(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(("kubelet", "amd64", "1.30.3-1.1", "install ok half-configured"))
    assert reasons_of(dpkg, {"name": "kubelet", "version": "1.30.4-*", "held": True}) == [
        "half-configured, want installed",
        "version 1.30.3-1.1, want 1.30.4-*",
        "not held",
    ]


@pytest.mark.parametrize("state", BETWEEN_STATES)
def test_a_package_between_states_differs_from_present(dpkg: FakeDpkgQuery, state: str) -> None:
    dpkg.lists(("kubelet", "amd64", "1.30.4-1.1", f"install ok {state}"))
    assert reasons_of(dpkg, {"name": "kubelet"}) == [f"{state}, want installed"]


def test_a_reinstall_required_package_is_read_by_its_state_word(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(("kubelet", "amd64", "1.30.4-1.1", "install reinstreq half-installed"))
    assert reasons_of(dpkg, {"name": "kubelet"}) == ["half-installed, want installed"]


# ------------------------------------------------------------------ state=absent and state=purged


@pytest.mark.parametrize(
    "status", [CONFIG_FILES, NOT_INSTALLED, None], ids=["config-files", "not-installed", "unknown"]
)
def test_absent_is_met_by_config_files_not_installed_and_unknown(
    dpkg: FakeDpkgQuery, status: str | None
) -> None:
    dpkg.lists(
        ("curl", "amd64", "7.81.0-1ubuntu1.16", INSTALLED),
        *([("tmux", "amd64", "3.2a-4", status)] if status else []),
    )
    assert reasons_of(dpkg, {"name": "tmux", "state": "absent"}) == []


def test_an_installed_package_differs_from_absent(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(("tmux", "amd64", "3.2a-4", INSTALLED))
    assert reasons_of(dpkg, {"name": "tmux", "state": "absent"}) == ["installed (3.2a-4), want absent"]


def test_a_held_package_differs_from_absent(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(("tmux", "amd64", "3.2a-4", HELD))
    assert reasons_of(dpkg, {"name": "tmux", "state": "absent"}) == ["installed (3.2a-4), want absent"]


@pytest.mark.parametrize("state", BETWEEN_STATES)
def test_a_package_between_states_is_still_there_for_absent_and_purged(
    dpkg: FakeDpkgQuery, state: str
) -> None:
    dpkg.lists(("tmux", "amd64", "3.2a-4", f"deinstall ok {state}"))
    assert reasons_of(dpkg, {"name": "tmux", "state": "absent"}) == [f"{state} (3.2a-4), want absent"]
    assert reasons_of(dpkg, {"name": "tmux", "state": "purged"}) == [f"{state} (3.2a-4), want purged"]


def test_config_files_left_differ_from_purged(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(("tmux", "amd64", "3.2a-4", CONFIG_FILES))
    assert reasons_of(dpkg, {"name": "tmux", "state": "purged"}) == ["config files left, want purged"]


@pytest.mark.parametrize("status", [NOT_INSTALLED, None], ids=["not-installed", "unknown"])
def test_purged_is_met_by_not_installed_and_unknown(dpkg: FakeDpkgQuery, status: str | None) -> None:
    dpkg.lists(
        ("curl", "amd64", "7.81.0-1ubuntu1.16", INSTALLED),
        *([("tmux", "amd64", "", status)] if status else []),
    )
    assert reasons_of(dpkg, {"name": "tmux", "state": "purged"}) == []


def test_an_installed_package_differs_from_purged(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(("tmux", "amd64", "3.2a-4", INSTALLED))
    assert reasons_of(dpkg, {"name": "tmux", "state": "purged"}) == ["installed (3.2a-4), want purged"]


# ------------------------------------------------------------------ regex


DRIVERS = (
    ("nvidia-driver-530", "amd64", "530.41.03-0ubuntu1", CONFIG_FILES),
    ("nvidia-driver-535", "amd64", "535.183.06-0ubuntu1", INSTALLED),
    ("nvidia-driver-535-server", "amd64", "535.183.06-0ubuntu1", INSTALLED),
    ("nvidia-driver-550", "amd64", "550.90.07-0ubuntu1", HELD),
    ("nvidia-driver-470", "amd64", "", NOT_INSTALLED),
)
DRIVER_REGEX = r"nvidia-driver-[0-9]+"


def test_a_regex_is_present_when_one_match_is_installed(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(*DRIVERS)
    assert reasons_of(dpkg, {"name": DRIVER_REGEX, "regex": True}) == []


def test_a_regex_no_installed_package_matches_differs(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(*DRIVERS)
    regex = "^nvidia-driver-(530|470)$"
    assert reasons_of(dpkg, {"name": regex, "regex": True}) == [f"no installed package matches {regex}"]


def test_a_regex_must_match_the_whole_name(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(*DRIVERS)
    # a search would find "nvidia-driver" in each name; the regex must match a name in full
    assert reasons_of(dpkg, {"name": "nvidia-driver", "regex": True}) == [
        "no installed package matches nvidia-driver"
    ]
    assert reasons_of(dpkg, {"name": "driver-535", "regex": True, "state": "absent"}) == []


def test_an_exact_name_is_not_a_regex(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(("libc6", "amd64", "2.35-0ubuntu3.8", INSTALLED))
    assert reasons_of(dpkg, {"name": "libc.", "state": "absent"}) == []
    assert reasons_of(dpkg, {"name": "libc.", "regex": True, "state": "absent"}) == [
        "libc6 installed (2.35-0ubuntu3.8), want absent"
    ]


def test_a_regex_is_absent_only_when_no_match_is_there(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(*DRIVERS)
    assert reasons_of(dpkg, {"name": DRIVER_REGEX, "regex": True, "state": "absent"}) == [
        "nvidia-driver-535 installed (535.183.06-0ubuntu1), want absent",
        "nvidia-driver-550 installed (550.90.07-0ubuntu1), want absent",
    ]
    assert reasons_of(dpkg, {"name": "nvidia-driver-(530|470)", "regex": True, "state": "absent"}) == []


def test_a_regex_is_purged_only_when_no_match_has_config_files(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(*DRIVERS)
    assert reasons_of(dpkg, {"name": "nvidia-driver-(530|470)", "regex": True, "state": "purged"}) == [
        "nvidia-driver-530 config files left, want purged"
    ]
    assert reasons_of(dpkg, {"name": "nvidia-driver-470", "regex": True, "state": "purged"}) == []


def test_a_regex_version_and_hold_hold_for_every_installed_match(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(*DRIVERS)
    assert reasons_of(dpkg, {"name": DRIVER_REGEX, "regex": True, "version": "5*", "held": False}) == [
        "nvidia-driver-550 held, want not held"
    ]
    assert reasons_of(dpkg, {"name": DRIVER_REGEX, "regex": True, "version": "535.*"}) == [
        "nvidia-driver-550 version 550.90.07-0ubuntu1, want 535.*"
    ]
    assert reasons_of(dpkg, {"name": DRIVER_REGEX, "regex": True, "held": True}) == [
        "nvidia-driver-535 not held"
    ]
    # the config-files and not-installed matches have no version to compare
    assert reasons_of(dpkg, {"name": "nvidia-driver-5[35]+", "regex": True, "version": "535.*"}) == []


def test_a_regex_half_configured_match_differs(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(*DRIVERS, ("nvidia-driver-545", "amd64", "545.29.06-0ubuntu1", "install ok half-configured"))
    assert reasons_of(dpkg, {"name": DRIVER_REGEX, "regex": True}) == [
        "nvidia-driver-545 half-configured, want installed"
    ]


# ------------------------------------------------------------------ multi-arch


def test_every_architecture_of_a_package_is_checked(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(
        ("libnvidia-compute-535", "amd64", "535.183.06-0ubuntu1", HELD),
        ("libnvidia-compute-535", "i386", "535.161.08-0ubuntu1", INSTALLED),
    )
    entry = {"name": "libnvidia-compute-535", "version": "535.183.06-*", "held": True}
    assert reasons_of(dpkg, entry) == [
        "libnvidia-compute-535:i386 version 535.161.08-0ubuntu1, want 535.183.06-*",
        "libnvidia-compute-535:i386 not held",
    ]
    assert reasons_of(dpkg, {"name": "libnvidia-compute-535", "state": "absent"}) == [
        "libnvidia-compute-535:amd64 installed (535.183.06-0ubuntu1), want absent",
        "libnvidia-compute-535:i386 installed (535.161.08-0ubuntu1), want absent",
    ]


def test_one_architecture_installed_is_enough_for_present_and_too_much_for_absent(
    dpkg: FakeDpkgQuery,
) -> None:
    dpkg.lists(
        ("libfoo1", "amd64", "1.0-1", CONFIG_FILES),
        ("libfoo1", "i386", "1.0-1", INSTALLED),
    )
    assert reasons_of(dpkg, {"name": "libfoo1"}) == []
    assert reasons_of(dpkg, {"name": "libfoo1", "state": "absent"}) == ["installed (1.0-1), want absent"]
    assert reasons_of(dpkg, {"name": "libfoo1", "state": "purged"}) == [
        "libfoo1:amd64 config files left, want purged",
        "libfoo1:i386 installed (1.0-1), want purged",
    ]


# ------------------------------------------------------------------ the result as a whole


def test_differ_follows_the_order_of_packages(dpkg: FakeDpkgQuery) -> None:
    # dpkg lists curl last and alphabetical order would put it first: neither decides the order
    result = checked_ok(
        dpkg,
        {"name": "nvidia-utils-535", "held": True},
        {"name": "zsh"},
        {"name": "nvidia-headless-535", "state": "absent"},
        {"name": "jq"},
        {"name": "curl", "version": "8.*"},
    )
    assert result["differ"] == ["nvidia-utils-535", "zsh", "nvidia-headless-535", "jq", "curl"]
    assert list(result["reasons"]) == result["differ"]
    assert result["reasons"]["nvidia-headless-535"] == ["installed (535.183.06-0ubuntu1), want absent"]
    assert result["in_place"] is False and result["checked"] == 5


def test_names_of_regex_entries_are_returned_as_given(dpkg: FakeDpkgQuery) -> None:
    result = checked_ok(dpkg, {"name": "curl"}, {"name": "^nvidia-.*$", "regex": True, "state": "absent"})
    assert result["differ"] == ["^nvidia-.*$"]
    assert result["checked"] == 2


def test_check_mode_gives_the_same_result_and_changes_nothing(dpkg: FakeDpkgQuery) -> None:
    entries = (
        {"name": "nvidia-headless-535", "held": False},
        {"name": "nvidia-driver-530", "state": "purged"},
        {"name": "curl"},
    )
    normal = checked_ok(dpkg, *entries)
    checking = checked_ok(dpkg, *entries, check_mode=True)
    assert checking["changed"] is False
    assert checking["differ"] == ["nvidia-headless-535", "nvidia-driver-530"]
    for key in ("differ", "reasons", "in_place", "checked", "changed"):
        assert checking[key] == normal[key]


# ------------------------------------------------------------------ validation, before dpkg-query runs


@pytest.mark.parametrize(
    ("entries", "start"),
    [
        (
            [{"name": "curl"}, {"name": "jq"}, {"name": "tmux", "state": "absent", "version": "3.2a-4"}],
            "packages[2].version: only with state=present",
        ),
        (
            [{"name": "tmux", "state": "purged", "version": "3.2a-4"}],
            "packages[0].version: only with state=present",
        ),
        (
            [{"name": "curl"}, {"name": "tmux", "state": "absent", "held": False}],
            "packages[1].held: only with state=present",
        ),
        ([{"name": "tmux", "state": "purged", "held": True}], "packages[0].held: only with state=present"),
        ([{"name": "curl"}, {"name": ""}], "packages[1].name: must not be empty"),
        ([{"name": "", "regex": True}], "packages[0].name: must not be empty"),
        ([{"name": "curl", "version": ""}], "packages[0].version: must not be empty"),
        (
            [{"name": "curl"}, {"name": "nvidia-(driver", "regex": True}],
            "packages[1].name: 'nvidia-(driver' is not a valid regular expression",
        ),
        ([{"name": "libc6:i386"}], "packages[0].name: 'libc6:i386' is not a Debian package name"),
        (
            [{"name": "nvidia-driver-*", "state": "absent"}],
            "packages[0].name: 'nvidia-driver-*' is not a Debian package name",
        ),
        (
            [{"name": "curl"}, {"name": "jq"}, {"name": "curl", "version": "7.*"}],
            "packages[0].name and packages[2].name both name 'curl'",
        ),
        (
            [{"name": "^a.*$", "regex": True}, {"name": "^a.*$", "regex": True, "state": "absent"}],
            "packages[0].name and packages[1].name both name '^a.*$'",
        ),
        # reasons is keyed by name: the same name as an exact name and as a regex is refused too
        (
            [{"name": "curl"}, {"name": "curl", "regex": True}],
            "packages[0].name and packages[1].name both name 'curl'",
        ),
    ],
)
def test_an_entry_the_module_cannot_check_fails_naming_it(
    dpkg: FakeDpkgQuery, entries: list[dict[str, Any]], start: str
) -> None:
    msg = failure(dpkg, *entries)
    assert msg.startswith(start), msg
    assert dpkg.argv is None, "dpkg-query ran before the entries were validated"


def test_the_state_word_of_the_refusal_is_named(dpkg: FakeDpkgQuery) -> None:
    msg = failure(dpkg, {"name": "tmux", "state": "absent", "version": "3.2a-4"})
    assert msg == "packages[0].version: only with state=present, not state=absent"


def test_a_state_outside_the_choices_is_refused(dpkg: FakeDpkgQuery) -> None:
    msg = failure(dpkg, {"name": "curl", "state": "latest"})
    assert "state" in msg and "latest" in msg


def test_name_is_required(dpkg: FakeDpkgQuery) -> None:
    assert "name" in failure(dpkg, {"version": "1.0"})


# ------------------------------------------------------------------ dpkg-query failing


def test_a_dpkg_query_that_fails_without_output_fails_the_task(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(rc=2, stderr="dpkg-query: error: parsing file '/var/lib/dpkg/status' near line 7\n")
    msg = failure(dpkg, {"name": "curl"})
    assert msg == "dpkg-query failed: dpkg-query: error: parsing file '/var/lib/dpkg/status' near line 7"


def test_a_dpkg_query_that_exits_non_zero_with_a_listing_is_read_with_a_warning(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists(("curl", "amd64", "7.81.0-1ubuntu1.16", INSTALLED), rc=1, stderr="dpkg-query: warning: odd\n")
    failed, result = check(dpkg, {"name": "curl"}, {"name": "tmux", "state": "absent"})
    assert not failed, result["msg"]
    assert result["in_place"] is True
    assert any("dpkg-query exited 1" in warning and "odd" in warning for warning in result["warnings"])


def test_a_dpkg_query_that_lists_nothing_fails_the_task(dpkg: FakeDpkgQuery) -> None:
    dpkg.lists()
    # an empty listing would make every absent and purged want look met
    assert failure(dpkg, {"name": "tmux", "state": "absent"}) == "dpkg-query listed no packages"


def test_a_line_the_module_cannot_read_fails_the_task(dpkg: FakeDpkgQuery) -> None:
    dpkg.prints("curl\tamd64\t7.81.0-1ubuntu1.16\tinstall ok installed\ntmux amd64 3.2a-4 installed\n")
    msg = failure(dpkg, {"name": "tmux", "state": "absent"})
    assert msg == "dpkg-query printed a line the module cannot read: 'tmux amd64 3.2a-4 installed'"


def test_a_dpkg_query_that_does_not_exist_fails_the_task(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dpkg-query"
    failed, result = run_module(
        packages_in_place, {"packages": [{"name": "curl"}], "dpkg_query": str(missing)}
    )
    assert failed
    assert result["msg"] == f"{missing}: no such executable; dpkg-query comes with dpkg, on Debian and Ubuntu"


def test_dpkg_query_is_found_in_path_by_name(dpkg: FakeDpkgQuery, monkeypatch: pytest.MonkeyPatch) -> None:
    # first in PATH, before the host's own dpkg-query (the fake itself needs the rest, for sh's cat)
    monkeypatch.setenv("PATH", f"{dpkg.directory}{os.pathsep}{os.environ['PATH']}")
    failed, result = run_module(packages_in_place, {"packages": [{"name": "curl"}]})
    assert not failed, result["msg"]
    assert result["in_place"] is True
    assert dpkg.argv is not None


def test_packages_may_be_left_out_and_then_dpkg_query_does_not_run(dpkg: FakeDpkgQuery) -> None:
    failed, result = run_module(packages_in_place, {"dpkg_query": str(dpkg.path)})
    assert not failed, result["msg"]
    assert result["in_place"] is True and result["differ"] == [] and result["checked"] == 0
    assert "apt_lists_age" not in result
    assert dpkg.argv is None


def test_empty_packages_do_not_run_dpkg_query(dpkg: FakeDpkgQuery) -> None:
    failed, result = run_module(packages_in_place, {"packages": [], "dpkg_query": str(dpkg.path)})
    assert not failed, result["msg"]
    assert result["checked"] == 0
    assert dpkg.argv is None


# ------------------------------------------------------------------ python_packages: fake virtualenvs


class FakeVenv:
    """A virtualenv in tmp_path as `python3 -m venv` lays it out (bin/python a link to an interpreter named
    python3.N, bin/activate, an executable bin/pip3, lib/python3.N/site-packages), with no Python in it: the
    module reads files only. ``install`` writes a distribution's .dist-info."""

    def __init__(self, path: Path, python: str = "3.10") -> None:
        self.path = path
        self.python = python
        self.bin = path / "bin"
        self.bin.mkdir(parents=True)
        interpreter = path.parent / f"interpreters-{path.name}" / f"python{python}"
        interpreter.parent.mkdir()
        interpreter.write_text("")
        interpreter.chmod(0o755)
        (self.bin / "python").symlink_to(interpreter)
        (self.bin / "activate").write_text("# activate\n")
        (self.bin / "pip3").write_text("#!/bin/sh\n")
        (self.bin / "pip3").chmod(0o755)
        self.site_packages = path / "lib" / f"python{python}" / "site-packages"
        self.site_packages.mkdir(parents=True)

    def install(
        self,
        name: str,
        version: str,
        *,
        directory: str | None = None,
        metadata: str | None = None,
        requires: tuple[str, ...] = (),
    ) -> Path:
        """A wheel's .dist-info: ``name_version.dist-info`` (name escaped as wheels do) with a METADATA of
        Name, Version and a Requires-Dist header for each of ``requires``, and a description that must not
        be read as headers, unless given."""
        info = self.site_packages / (directory or f"{name.replace('-', '_')}-{version}.dist-info")
        info.mkdir()
        text = metadata if metadata is not None else metadata_text(name, version, requires)
        (info / "METADATA").write_text(text)
        return info

    def install_egg_info(
        self,
        name: str,
        version: str,
        *,
        as_file: bool = False,
        requires: tuple[str, ...] = (),
        requires_txt: str | None = None,
    ) -> Path:
        """A setuptools .egg-info: a directory with PKG-INFO (Requires-Dist headers for ``requires``) and
        ``requires_txt`` as its requires.txt when given, or (distutils) a file that is its PKG-INFO."""
        info = self.site_packages / f"{name.replace('-', '_')}-{version}-py{self.python}.egg-info"
        if as_file:
            info.write_text(metadata_text(name, version, requires))
        else:
            info.mkdir()
            (info / "PKG-INFO").write_text(metadata_text(name, version, requires))
            if requires_txt is not None:
                (info / "requires.txt").write_text(requires_txt)
        return info


def metadata_text(name: str, version: str, requires: tuple[str, ...] = ()) -> str:
    requires_dist = "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    return (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: a test distribution\n"
        f"Description-Content-Type: text/markdown\n{requires_dist}\n"
        "# Readme\nName: not-this\nVersion: 0.0.0\nRequires-Dist: not-this-either\n"
    )


@pytest.fixture
def venv(tmp_path: Path) -> FakeVenv:
    made = FakeVenv(tmp_path / "opt" / "kubernetes-client")
    made.install("kubernetes", "32.0.1")
    made.install("nvidia-ml-py", "12.535.161")
    return made


def run_python(dpkg: FakeDpkgQuery, *entries: dict[str, Any], **args: Any) -> tuple[bool, dict[str, Any]]:
    return run_module(
        packages_in_place, {"python_packages": list(entries), "dpkg_query": str(dpkg.path), **args}
    )


def venv_reasons(dpkg: FakeDpkgQuery, venv: FakeVenv | Path, *requirements: str) -> list[str]:
    """The reasons of one python_packages entry; [] when it is in place."""
    path = str(venv.path if isinstance(venv, FakeVenv) else venv)
    failed, result = run_python(dpkg, {"venv": path, "requirements": list(requirements)})
    assert not failed, result["msg"]
    assert result["changed"] is False and result["checked"] == 1
    assert result["in_place"] is (not result["differ"])
    assert list(result["reasons"]) == result["differ"]
    assert set(result["differ"]) <= {path}
    return result["reasons"].get(path, [])


def python_failure(dpkg: FakeDpkgQuery, *entries: dict[str, Any], **args: Any) -> str:
    failed, result = run_python(dpkg, *entries, **args)
    assert failed, result
    assert dpkg.argv is None, "dpkg-query ran before the entries were validated"
    return str(result["msg"])


def test_a_venv_with_its_requirements_at_their_versions_is_in_place(
    dpkg: FakeDpkgQuery, venv: FakeVenv
) -> None:
    failed, result = run_python(
        dpkg, {"venv": str(venv.path), "requirements": ["kubernetes==32.0.1", "nvidia-ml-py==12.535.161"]}
    )
    assert not failed, result["msg"]
    assert result["in_place"] is True and result["differ"] == [] and result["reasons"] == {}
    assert result["checked"] == 1
    assert dpkg.argv is None, "dpkg-query ran without package wants"


def test_a_missing_venv_differs(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    missing = tmp_path / "opt" / "nowhere"
    assert venv_reasons(dpkg, missing, "kubernetes==32.0.1") == [
        f"no virtualenv at {missing} (no bin/python)"
    ]


def test_a_venv_without_bin_python_differs(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    (venv.bin / "python").unlink()
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [f"no virtualenv at {venv.path} (no bin/python)"]


def test_a_venv_whose_bin_python_link_is_broken_differs(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    # the link is there, the interpreter it names is not (links are followed)
    Path(os.path.realpath(venv.bin / "python")).unlink()
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [f"no virtualenv at {venv.path} (no bin/python)"]


def test_a_venv_without_bin_activate_differs_as_the_pip_module_would_make_one(
    dpkg: FakeDpkgQuery, venv: FakeVenv
) -> None:
    (venv.bin / "activate").unlink()
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [
        f"no virtualenv at {venv.path} (no bin/activate, which the pip module looks for before it makes one)"
    ]


def test_a_venv_without_an_executable_pip_differs(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    (venv.bin / "pip3").chmod(0o644)
    reason = f"no pip in the virtualenv at {venv.path} (no executable bin/pip3 or bin/pip)"
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [reason]
    (venv.bin / "pip3").unlink()
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [reason]
    # bin/pip is the pip module's second choice
    (venv.bin / "pip").write_text("#!/bin/sh\n")
    (venv.bin / "pip").chmod(0o755)
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == []


def test_a_requirement_not_installed_differs(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1", "urllib3==2.2.3", "PyYAML==6.0.2") == [
        "urllib3 not installed",
        "PyYAML not installed",
    ]


def test_a_venv_without_site_packages_has_nothing_installed(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    for info in venv.site_packages.iterdir():
        for file in info.iterdir():
            file.unlink()
        info.rmdir()
    venv.site_packages.rmdir()
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == ["kubernetes not installed"]


def test_a_site_packages_that_cannot_be_listed_differs(
    dpkg: FakeDpkgQuery, venv: FakeVenv, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the tests may run as root, whom no mode keeps out: os.listdir refuses this one directory instead
    listdir = os.listdir

    def refusing_listdir(path: Any = ".") -> list[str]:
        if str(path) == str(venv.site_packages):
            raise PermissionError(13, "Permission denied")
        return listdir(path)

    monkeypatch.setattr(packages_in_place.os, "listdir", refusing_listdir)
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [
        f"cannot list {venv.site_packages}: Permission denied"
    ]


def test_another_version_differs(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    assert venv_reasons(dpkg, venv, "kubernetes==31.0.0") == ["kubernetes 32.0.1 installed, want 31.0.0"]


def test_a_version_pip_counts_equal_but_spelled_differently_differs(
    dpkg: FakeDpkgQuery, venv: FakeVenv
) -> None:
    # conservative: pip's == would take 32.0.1.0 for 32.0.1 (the pip task then runs and changes nothing)
    assert pip_module.Package("kubernetes==32.0.1.0").is_satisfied_by("32.0.1")
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1.0") == ["kubernetes 32.0.1 installed, want 32.0.1.0"]


def test_a_version_is_not_a_prefix(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    assert venv_reasons(dpkg, venv, "kubernetes==32.0") == ["kubernetes 32.0.1 installed, want 32.0"]


@pytest.mark.parametrize(
    ("requirement", "installed_as"),
    [
        ("Nvidia_ML.py==12.535.161", "nvidia-ml-py"),
        ("nvidia-ml-py==12.535.161", "Nvidia_ML.py"),
        ("NVIDIA-ML-PY==12.535.161", "nvidia.ml_py"),
    ],
)
def test_names_are_compared_as_pep_503_normalises_them(
    dpkg: FakeDpkgQuery, tmp_path: Path, requirement: str, installed_as: str
) -> None:
    venv = FakeVenv(tmp_path / "nvml")
    venv.install(installed_as, "12.535.161")
    assert venv_reasons(dpkg, venv, requirement) == []
    assert venv_reasons(dpkg, venv, requirement.replace("161", "160")) == [
        f"{requirement.split('==')[0]} 12.535.161 installed, want 12.535.160"
    ]


def test_two_dist_infos_of_one_name_differ(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    venv.install("kubernetes", "31.0.0")
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1", "nvidia-ml-py==12.535.161") == [
        "kubernetes installed 2 times (kubernetes-31.0.0.dist-info, kubernetes-32.0.1.dist-info):"
        " a broken virtualenv"
    ]


def test_two_dist_infos_of_one_name_spelled_differently_differ(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    venv.install("Nvidia_ML.py", "12.535.161")
    reasons = venv_reasons(dpkg, venv, "nvidia-ml-py==12.535.161")
    assert len(reasons) == 1 and "nvidia-ml-py installed 2 times" in reasons[0]


@pytest.mark.parametrize("as_file", [False, True], ids=["egg-info directory", "egg-info file"])
def test_an_egg_info_is_read(dpkg: FakeDpkgQuery, tmp_path: Path, as_file: bool) -> None:
    venv = FakeVenv(tmp_path / "legacy")
    venv.install_egg_info("python-dateutil", "2.9.0.post0", as_file=as_file)
    assert venv_reasons(dpkg, venv, "python_dateutil==2.9.0.post0") == []
    assert venv_reasons(dpkg, venv, "python-dateutil==2.8.2") == [
        "python-dateutil 2.9.0.post0 installed, want 2.8.2"
    ]


def test_a_dist_info_whose_directory_name_and_metadata_disagree_on_the_version_differs(
    dpkg: FakeDpkgQuery, venv: FakeVenv
) -> None:
    # pip takes the version from the directory name: which of the two it would see is not for this read
    venv.install("urllib3", "2.2.3", directory="urllib3-2.2.2.dist-info")
    assert venv_reasons(dpkg, venv, "urllib3==2.2.3") == [
        "urllib3: urllib3-2.2.2.dist-info: its metadata says version 2.2.3"
    ]


def test_a_dist_info_whose_directory_name_and_metadata_disagree_on_the_name_differs(
    dpkg: FakeDpkgQuery, venv: FakeVenv
) -> None:
    venv.install("urllib3", "2.2.3", directory="requests-2.2.3.dist-info")
    expected = "requests-2.2.3.dist-info: its metadata names urllib3"
    assert venv_reasons(dpkg, venv, "urllib3==2.2.3") == [f"urllib3: {expected}"]
    assert venv_reasons(dpkg, venv, "requests==2.2.3") == [f"requests: {expected}"]


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        "Metadata-Version: 2.1\nName: urllib3\n",
        "Metadata-Version: 2.1\n\nName: urllib3\nVersion: 2.2.3\n",
    ],
    ids=["no METADATA", "no Version", "headers after the blank line"],
)
def test_a_dist_info_without_readable_name_and_version_differs(
    dpkg: FakeDpkgQuery, venv: FakeVenv, metadata: str | None
) -> None:
    info = venv.install("urllib3", "2.2.3", metadata=metadata or "")
    if metadata is None:
        (info / "METADATA").unlink()
    assert venv_reasons(dpkg, venv, "urllib3==2.2.3") == [
        "urllib3: urllib3-2.2.3.dist-info: no Name and Version in its metadata"
    ]


def test_the_description_after_the_headers_is_not_read(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    # metadata_text's description says Name: not-this, Version: 0.0.0
    assert venv_reasons(dpkg, venv, "not-this==0.0.0") == ["not-this not installed"]


def test_the_site_packages_of_the_version_bin_python_resolves_to_are_read(
    dpkg: FakeDpkgQuery, venv: FakeVenv
) -> None:
    # the venv's Python was upgraded under it: python3.12 does not read lib/python3.10
    interpreter = venv.path.parent / "python3.12"
    interpreter.write_text("")
    (venv.bin / "python").unlink()
    (venv.bin / "python").symlink_to(interpreter)
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == ["kubernetes not installed"]


def test_a_copied_interpreter_reads_the_one_site_packages(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    # python -m venv --copies: bin/python is a file named python, which tells no version
    (venv.bin / "python").unlink()
    (venv.bin / "python").write_text("")
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == []
    (venv.path / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [
        "several site-packages directories (lib/python3.10/site-packages, lib/python3.12/site-packages):"
        " cannot tell which bin/python reads"
    ]


def test_python_packages_follow_packages_in_differ_and_both_are_checked(
    dpkg: FakeDpkgQuery, venv: FakeVenv, tmp_path: Path
) -> None:
    other = FakeVenv(tmp_path / "opt" / "model-tools")
    other.install("safetensors", "0.4.5")
    failed, result = run_module(
        packages_in_place,
        {
            "packages": [{"name": "zsh"}, {"name": "curl"}],
            "python_packages": [
                {"venv": str(other.path), "requirements": ["safetensors==0.8.0"]},
                {"venv": str(venv.path), "requirements": ["kubernetes==32.0.1"]},
                {"venv": str(tmp_path / "gone"), "requirements": ["x==1"]},
            ],
            "dpkg_query": str(dpkg.path),
        },
    )
    assert not failed, result["msg"]
    assert result["differ"] == ["zsh", str(other.path), str(tmp_path / "gone")]
    assert result["reasons"][str(other.path)] == ["safetensors 0.4.5 installed, want 0.8.0"]
    assert result["checked"] == 5 and result["in_place"] is False
    assert dpkg.argv is not None


def test_the_venv_key_is_the_path_as_given(dpkg: FakeDpkgQuery, venv: FakeVenv) -> None:
    given = f"{venv.path}/"
    failed, result = run_python(dpkg, {"venv": given, "requirements": ["kubernetes==31.0.0"]})
    assert not failed, result["msg"]
    assert result["differ"] == [given]


# ------------------------------------------------------------------ python_packages: the dependencies


def test_a_dependency_that_is_installed_is_in_place(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    venv = FakeVenv(tmp_path / "client")
    venv.install("kubernetes", "32.0.1", requires=("urllib3<2.4,>=1.24.2", "PyYAML>=5.4.1", "six>=1.9.0"))
    venv.install("urllib3", "2.3.0")
    venv.install("PyYAML", "6.0.2")
    venv.install("six", "1.17.0")
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == []


def test_a_missing_dependency_differs_naming_it_and_its_dependent(
    dpkg: FakeDpkgQuery, tmp_path: Path
) -> None:
    venv = FakeVenv(tmp_path / "client")
    venv.install("kubernetes", "32.0.1", requires=("urllib3<2.4,>=1.24.2", "PyYAML>=5.4.1", "six>=1.9.0"))
    venv.install("PyYAML", "6.0.2")
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [
        "urllib3 (a dependency of kubernetes) not installed",
        "six (a dependency of kubernetes) not installed",
    ]


def test_a_missing_dependency_of_a_dependency_differs(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    venv = FakeVenv(tmp_path / "client")
    venv.install("kubernetes", "32.0.1", requires=("requests",))
    venv.install("requests", "2.32.3", requires=("idna<4,>=2.5", "charset-normalizer<4,>=2"))
    venv.install("charset_normalizer", "3.4.0")
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == ["idna (a dependency of requests) not installed"]
    venv.install("idna", "3.10")
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == []


def test_dependencies_that_require_each_other_are_read_once_each(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    venv = FakeVenv(tmp_path / "cycle")
    venv.install("a", "1.0", requires=("b",))
    venv.install("b", "1.0", requires=("a>=1", "c"))
    venv.install("c", "1.0", requires=("B",))
    assert venv_reasons(dpkg, venv, "a==1.0") == []
    (venv.site_packages / "c-1.0.dist-info" / "METADATA").unlink()
    (venv.site_packages / "c-1.0.dist-info").rmdir()
    assert venv_reasons(dpkg, venv, "a==1.0") == ["c (a dependency of b) not installed"]


def test_a_dependency_is_named_once_with_its_first_dependent(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    venv = FakeVenv(tmp_path / "tools")
    venv.install("huggingface-hub", "0.26.2", requires=("filelock", "requests"))
    venv.install("safetensors", "0.4.5", requires=("filelock",))
    venv.install("requests", "2.32.3", requires=("filelock",))
    assert venv_reasons(dpkg, venv, "safetensors==0.4.5", "huggingface-hub==0.26.2") == [
        "filelock (a dependency of safetensors) not installed"
    ]


def test_a_requirement_that_another_requires_is_checked_at_its_version(
    dpkg: FakeDpkgQuery, tmp_path: Path
) -> None:
    venv = FakeVenv(tmp_path / "client")
    venv.install("kubernetes", "32.0.1", requires=("urllib3>=1.24.2",))
    venv.install("urllib3", "2.3.0")
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1", "urllib3==2.3.0") == []
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1", "urllib3==2.2.3") == [
        "urllib3 2.3.0 installed, want 2.2.3"
    ]


def test_the_dependencies_are_not_read_when_a_requirement_differs(
    dpkg: FakeDpkgQuery, tmp_path: Path
) -> None:
    # the pip task runs anyway, and puts back what the version it installs needs
    venv = FakeVenv(tmp_path / "client")
    venv.install("kubernetes", "31.0.0", requires=("urllib3",))
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == ["kubernetes 31.0.0 installed, want 32.0.1"]


@pytest.mark.parametrize(
    "requirement",
    [
        'adal>=1.0.2; extra == "adal"',
        "PySocks!=1.5.7,>=1.5.6; extra == 'socks' or extra == \"x\"",
        'google-auth[aiohttp] ; (extra == "aiohttp")',
    ],
)
def test_a_missing_dependency_of_an_extra_only_is_in_place(
    dpkg: FakeDpkgQuery, tmp_path: Path, requirement: str
) -> None:
    # the roles install no extras: pip installs none of these
    venv = FakeVenv(tmp_path / "client")
    venv.install("kubernetes", "32.0.1", requires=(requirement,))
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == []


@pytest.mark.parametrize(
    "requirement",
    [
        'tomli>=1.1.0; python_version < "3.11"',
        'pywin32>=300; sys_platform == "win32"',
        # true on the nodes, so pip installs it: a dependency under a marker is not checked all the same
        'uvloop>=0.14.0; platform_system != "Windows"',
        'exceptiongroup; python_version < "3.11" and extra == "test"',
    ],
)
def test_a_missing_dependency_under_another_marker_is_not_checked(
    dpkg: FakeDpkgQuery, tmp_path: Path, requirement: str
) -> None:
    venv = FakeVenv(tmp_path / "tools")
    venv.install("vllm", "0.6.4", requires=(requirement,))
    assert venv_reasons(dpkg, venv, "vllm==0.6.4") == []


@pytest.mark.parametrize(
    "requirement",
    ["urllib3 (>=1.24.2)", "urllib3 (>=1.24.2,<2.4)", "urllib3(>=1.24.2)", "urllib3", " urllib3 >= 1.24.2"],
)
def test_the_name_of_a_dependency_is_read_before_its_version_specifiers(
    dpkg: FakeDpkgQuery, tmp_path: Path, requirement: str
) -> None:
    venv = FakeVenv(tmp_path / "client")
    venv.install("kubernetes", "32.0.1", requires=(requirement,))
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [
        "urllib3 (a dependency of kubernetes) not installed"
    ]
    # at any version: the specifiers are not compared
    venv.install("urllib3", "1.0")
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == []


@pytest.mark.parametrize(
    ("requirement", "installed_as"),
    [
        ("PyYAML>=5.4.1", "pyyaml"),
        ("python_dateutil>=2.5.3", "python-dateutil"),
        ("websocket-client!=0.40.0,>=0.32.0", "websocket_client"),
        ("nvidia-ml-py", "Nvidia_ML.py"),
        ("google-auth[aiohttp]>=1.0.1", "google-auth"),
        (
            "requests-oauthlib @ https://example.invalid/requests_oauthlib-2.0.0-py2.py3-none-any.whl",
            "requests_oauthlib",
        ),
    ],
)
def test_dependency_names_are_compared_as_pep_503_normalises_them(
    dpkg: FakeDpkgQuery, tmp_path: Path, requirement: str, installed_as: str
) -> None:
    venv = FakeVenv(tmp_path / "client")
    venv.install("kubernetes", "32.0.1", requires=(requirement,))
    venv.install(installed_as, "2.0.0")
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == []


def test_a_dependency_that_starts_with_no_name_differs(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    venv = FakeVenv(tmp_path / "client")
    venv.install("kubernetes", "32.0.1", requires=("(>=1.0)",))
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [
        "kubernetes: cannot read its dependency '(>=1.0)'"
    ]


def test_a_dependency_whose_metadata_cannot_be_read_differs(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    venv = FakeVenv(tmp_path / "client")
    venv.install("kubernetes", "32.0.1", requires=("urllib3",))
    (venv.install("urllib3", "2.3.0") / "METADATA").unlink()
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [
        "urllib3 (a dependency of kubernetes): urllib3-2.3.0.dist-info: no Name and Version in its metadata"
    ]


def test_a_dependency_installed_twice_differs(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    venv = FakeVenv(tmp_path / "client")
    venv.install("kubernetes", "32.0.1", requires=("urllib3",))
    venv.install("urllib3", "2.3.0")
    venv.install("urllib3", "2.2.3")
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [
        "urllib3 (a dependency of kubernetes) installed 2 times (urllib3-2.2.3.dist-info,"
        " urllib3-2.3.0.dist-info): a broken virtualenv"
    ]


def test_requires_dist_after_a_license_of_several_paragraphs_is_read(
    dpkg: FakeDpkgQuery, tmp_path: Path
) -> None:
    # setuptools indents a multi-line License's empty lines: a line of blanks continues the header
    venv = FakeVenv(tmp_path / "client")
    metadata = (
        "Metadata-Version: 2.4\nName: kubernetes\nVersion: 32.0.1\nLicense: MIT License\n        \n"
        "        Permission is hereby granted\n        \nClassifier: Programming Language :: Python\n"
        "Requires-Dist: urllib3\n\nThe description\n"
    )
    venv.install("kubernetes", "32.0.1", metadata=metadata)
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [
        "urllib3 (a dependency of kubernetes) not installed"
    ]


REQUIRES_TXT = """six>=1.5

# a comment
urllib3 (>=1.24.2)

[:python_version < "3.11"]
tomli

[socks]
PySocks>=1.5.6
"""


def test_the_unconditional_lines_of_an_egg_infos_requires_txt_are_read(
    dpkg: FakeDpkgQuery, tmp_path: Path
) -> None:
    venv = FakeVenv(tmp_path / "legacy")
    venv.install_egg_info("python-dateutil", "2.9.0.post0", requires_txt=REQUIRES_TXT)
    assert venv_reasons(dpkg, venv, "python-dateutil==2.9.0.post0") == [
        "six (a dependency of python-dateutil) not installed",
        "urllib3 (a dependency of python-dateutil) not installed",
    ]
    venv.install("six", "1.17.0")
    venv.install_egg_info("urllib3", "1.26.20")
    # tomli (under a marker) and PySocks (an extra's) are not read
    assert venv_reasons(dpkg, venv, "python-dateutil==2.9.0.post0") == []


def test_an_egg_info_without_requires_txt_has_no_dependencies(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    venv = FakeVenv(tmp_path / "legacy")
    venv.install("kubernetes", "32.0.1", requires=("python-dateutil", "six"))
    venv.install_egg_info("python-dateutil", "2.9.0.post0")
    venv.install_egg_info("six", "1.17.0", as_file=True)
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == []


def test_an_egg_infos_requires_dist_headers_come_before_its_requires_txt(
    dpkg: FakeDpkgQuery, tmp_path: Path
) -> None:
    # as pip reads it: requires.txt only when the metadata has no Requires-Dist
    venv = FakeVenv(tmp_path / "legacy")
    venv.install_egg_info("python-dateutil", "2.9.0.post0", requires=("six>=1.5",), requires_txt="urllib3\n")
    assert venv_reasons(dpkg, venv, "python-dateutil==2.9.0.post0") == [
        "six (a dependency of python-dateutil) not installed"
    ]


def test_an_egg_infos_requires_txt_that_cannot_be_read_differs(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    # a directory in its place: unreadable even to root
    venv = FakeVenv(tmp_path / "legacy")
    venv.install("kubernetes", "32.0.1", requires=("python-dateutil",))
    info = venv.install_egg_info("python-dateutil", "2.9.0.post0")
    (info / "requires.txt").mkdir()
    assert venv_reasons(dpkg, venv, "kubernetes==32.0.1") == [
        f"python-dateutil: cannot read {info.name}/requires.txt: Is a directory"
    ]


def test_the_dependencies_in_a_venv_python_made(dpkg: FakeDpkgQuery, tmp_path: Path) -> None:
    """A venv as `python -m venv` makes it (its bin/python, its lib/python3.N), the distributions written by
    hand, and a bin/pip3 that is no pip (the module does not run it)."""
    path = tmp_path / "real-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    (path / "bin" / "pip3").write_text("#!/bin/sh\nexit 1\n")
    (path / "bin" / "pip3").chmod(0o755)
    (site_packages,) = (path / "lib").glob("python3.*/site-packages")
    for name, version, requires in [
        ("kubernetes", "32.0.1", ("requests", 'adal; extra == "adal"')),
        ("requests", "2.32.3", ("idna<4,>=2.5", 'PySocks; extra == "socks"')),
        ("idna", "3.10", ()),
    ]:
        info = site_packages / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(metadata_text(name, version, requires))
    assert venv_reasons(dpkg, path, "kubernetes==32.0.1") == []
    for file in (site_packages / "idna-3.10.dist-info").iterdir():
        file.unlink()
    (site_packages / "idna-3.10.dist-info").rmdir()
    assert venv_reasons(dpkg, path, "kubernetes==32.0.1") == ["idna (a dependency of requests) not installed"]


def test_the_dependencies_read_are_those_importlib_metadata_reads(tmp_path: Path) -> None:
    """Every distribution of the site-packages this test runs from: the names of the dependencies it needs
    whatever the markers, as the module reads them, are those importlib.metadata reads (its Requires-Dist,
    else an egg-info's requires.txt, whose sections it turns into markers) without a marker."""
    requirements = pytest.importorskip("packaging.requirements")
    site_packages = os.path.dirname(os.path.dirname(pytest.__file__))
    installed = venv_distributions.installed_distributions(site_packages)
    distributions = {distribution for found in installed.values() for distribution in found}
    assert len(distributions) > 10
    for distribution in distributions:
        (name,) = distribution.names
        names, unreadable = venv_distributions.unconditional_dependency_names(
            site_packages, name, distribution
        )
        assert unreadable == [], distribution.directory
        (theirs,) = importlib.metadata.distributions(name=name, path=[site_packages])
        expected = {
            venv_distributions.canonical_python_name(requirement.name)
            for requirement in map(requirements.Requirement, theirs.requires or [])
            if requirement.marker is None
        }
        assert {venv_distributions.canonical_python_name(found) for found in names} == expected, name


# ------------------------------------------------------------------ python_packages held against pip.py


# Each: the requirement, the distribution's Name as installed, its version as installed. The module says
# "in place" for each (tested below); pip.py's own check-mode comparison (_is_present over `pip list
# --format=freeze` lines, Package.is_satisfied_by) must then find each present, so the pip task would report
# no change.
IN_PLACE_PINS = [
    ("kubernetes==32.0.1", "kubernetes", "32.0.1"),
    ("Nvidia_ML.py==12.535.161", "nvidia-ml-py", "12.535.161"),
    ("torch==2.1.0+cu121", "torch", "2.1.0+cu121"),
    ("python-dateutil==2.9.0.post0", "python_dateutil", "2.9.0.post0"),
    ("certifi==2026.10.19.post1", "certifi", "2026.10.19.post1"),
    ("vllm==0.6.4rc1", "vllm", "0.6.4rc1"),
    ("pkg==1!2.0.dev3", "pkg", "1!2.0.dev3"),
    ("safetensors==0.8.0", "safetensors", "0.8.0"),
]


@pytest.mark.parametrize(("requirement", "name", "version"), IN_PLACE_PINS)
def test_what_is_in_place_here_is_present_for_the_pip_module(
    dpkg: FakeDpkgQuery, tmp_path: Path, requirement: str, name: str, version: str
) -> None:
    venv = FakeVenv(tmp_path / "venv")
    venv.install(name, version)
    assert venv_reasons(dpkg, venv, requirement) == []
    package = pip_module.Package(requirement)
    assert package.package_name == venv_distributions.canonical_python_name(name)
    assert pip_module._is_present(None, package, [f"{name}=={version}"], "pip list --format=freeze")


# ------------------------------------------------------------------ python_packages: validation


@pytest.mark.parametrize(
    "requirement",
    [
        "kubernetes",
        "kubernetes>=32.0.1",
        "kubernetes~=32.0",
        "kubernetes!=32.0.1",
        "kubernetes===32.0.1",
        "kubernetes==32.*",
        "kubernetes==32.0.1,<33",
        "kubernetes[adal]==32.0.1",
        "kubernetes==32.0.1; python_version >= '3.8'",
        "kubernetes == 32.0.1",
        " kubernetes==32.0.1",
        "kubernetes @ https://example.invalid/kubernetes-32.0.1-py3-none-any.whl",
        "git+https://example.invalid/kubernetes.git@v32.0.1",
        "https://example.invalid/kubernetes-32.0.1-py3-none-any.whl",
        "./kubernetes-32.0.1-py3-none-any.whl",
        "kubernetes==",
        "==32.0.1",
        "-kubernetes==32.0.1",
        "kubernetes==v32.0.1",
        "kubernetes==32.0.1-1",
        "kubernetes==32.0.1.RC1",
        "kubernetes==032.0.1",
        "",
    ],
)
def test_a_requirement_that_is_not_name_equals_version_is_refused_naming_it(
    dpkg: FakeDpkgQuery, venv: FakeVenv, requirement: str
) -> None:
    msg = python_failure(
        dpkg,
        {"venv": str(venv.path), "requirements": ["kubernetes==32.0.1"]},
        {"venv": "/opt/other", "requirements": [requirement]},
        packages=[{"name": "curl"}],
    )
    assert msg.startswith(f"python_packages[1].requirements[0]: {requirement!r} is not name==version"), msg


@pytest.mark.parametrize("path", ["opt/kubernetes-client", "./venv", "~/venv", "$HOME/venv", ""])
def test_a_venv_that_is_not_an_absolute_path_is_refused(dpkg: FakeDpkgQuery, path: str) -> None:
    msg = python_failure(
        dpkg, {"venv": path, "requirements": ["kubernetes==32.0.1"]}, packages=[{"name": "curl"}]
    )
    assert msg.startswith(f"python_packages[0].venv: {path!r} is not an absolute path"), msg


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            [{"venv": "/opt/a", "requirements": ["x==1"]}, {"venv": "/opt/b", "requirements": []}],
            "python_packages[1].requirements: must not be empty",
        ),
        (
            [{"venv": "/opt/a", "requirements": ["x==1", "kubernetes==31.0.0", "Kubernetes==32.0.1"]}],
            "python_packages[0].requirements[1] and python_packages[0].requirements[2]"
            " both name 'kubernetes'",
        ),
        (
            [{"venv": "/opt/a", "requirements": ["x==1"]}, {"venv": "/opt/a", "requirements": ["y==1"]}],
            "python_packages[0].venv and python_packages[1].venv both name '/opt/a'",
        ),
    ],
)
def test_an_entry_of_python_packages_the_module_cannot_check_fails_naming_it(
    dpkg: FakeDpkgQuery, entries: list[dict[str, Any]], message: str
) -> None:
    assert python_failure(dpkg, *entries, packages=[{"name": "curl"}]) == message


def test_a_venv_that_is_also_a_package_name_is_refused(dpkg: FakeDpkgQuery) -> None:
    msg = python_failure(
        dpkg, {"venv": "/opt/a", "requirements": ["x==1"]}, packages=[{"name": "/opt/a", "regex": True}]
    )
    assert msg == "packages[0].name and python_packages[0].venv both name '/opt/a'"


@pytest.mark.parametrize("missing", ["venv", "requirements"])
def test_venv_and_requirements_are_required(dpkg: FakeDpkgQuery, missing: str) -> None:
    entry: dict[str, Any] = {"venv": "/opt/a", "requirements": ["x==1"]}
    del entry[missing]
    assert missing in python_failure(dpkg, entry)


# ------------------------------------------------------------------ apt_cache: apt_lists_age


class AptLists:
    """apt's update-success stamp and lists directory in tmp_path, where the module and apt.py look."""

    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.stamp = directory / "periodic" / "update-success-stamp"
        self.lists = directory / "lists"
        for module in (packages_in_place, apt_module):
            monkeypatch.setattr(module, "APT_UPDATE_SUCCESS_STAMP_PATH", str(self.stamp))
            monkeypatch.setattr(module, "APT_LISTS_PATH", str(self.lists))

    def make_stamp(self, age: float) -> None:
        self.stamp.parent.mkdir(parents=True, exist_ok=True)
        self.stamp.write_text("")
        set_age(self.stamp, age)

    def make_lists(self, age: float) -> None:
        self.lists.mkdir(parents=True, exist_ok=True)
        set_age(self.lists, age)


def set_age(path: Path, age: float) -> None:
    then = time.time() - age
    os.utime(path, (then, then))


@pytest.fixture
def apt_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AptLists:
    return AptLists(tmp_path / "var-lib-apt", monkeypatch)


def lists_age(dpkg: FakeDpkgQuery, **args: Any) -> int | None:
    failed, result = run_module(packages_in_place, {"apt_cache": True, "dpkg_query": str(dpkg.path), **args})
    assert not failed, result["msg"]
    assert "apt_lists_age" in result
    age = result["apt_lists_age"]
    assert age is None or isinstance(age, int)
    return age


def test_the_age_is_the_stamps(dpkg: FakeDpkgQuery, apt_lists: AptLists) -> None:
    apt_lists.make_lists(age=60)
    apt_lists.make_stamp(age=7200.5)
    age = lists_age(dpkg)
    assert age is not None and 7200 <= age <= 7203
    assert dpkg.argv is None, "dpkg-query ran without package wants"


def test_the_age_is_the_lists_directorys_when_there_is_no_stamp(
    dpkg: FakeDpkgQuery, apt_lists: AptLists
) -> None:
    apt_lists.make_lists(age=300)
    age = lists_age(dpkg)
    assert age is not None and 300 <= age <= 303


def test_the_age_is_null_when_neither_is_there(dpkg: FakeDpkgQuery, apt_lists: AptLists) -> None:
    assert lists_age(dpkg) is None


def test_a_stamp_in_the_future_gives_a_negative_age(dpkg: FakeDpkgQuery, apt_lists: AptLists) -> None:
    apt_lists.make_stamp(age=-600)
    age = lists_age(dpkg)
    assert age is not None and -600 <= age <= -597


def test_the_age_is_returned_with_the_rest_of_the_report(
    dpkg: FakeDpkgQuery, apt_lists: AptLists, venv: FakeVenv
) -> None:
    apt_lists.make_stamp(age=10)
    failed, result = run_module(
        packages_in_place,
        {
            "packages": [{"name": "curl"}],
            "python_packages": [{"venv": str(venv.path), "requirements": ["kubernetes==32.0.1"]}],
            "apt_cache": True,
            "dpkg_query": str(dpkg.path),
        },
    )
    assert not failed, result["msg"]
    assert result["in_place"] is True and result["checked"] == 2
    assert 10 <= result["apt_lists_age"] <= 13


def test_no_age_is_returned_without_apt_cache(dpkg: FakeDpkgQuery, apt_lists: AptLists) -> None:
    apt_lists.make_stamp(age=10)
    for args in ({}, {"apt_cache": False}):
        failed, result = run_module(
            packages_in_place, {"packages": [{"name": "curl"}], "dpkg_query": str(dpkg.path), **args}
        )
        assert not failed, result["msg"]
        assert "apt_lists_age" not in result


VALID_TIME = 3600
MARGIN = 60


@pytest.mark.parametrize(
    ("age", "runs"),
    [
        (0.0, False),
        (VALID_TIME - 120, False),
        (VALID_TIME - 61, False),
        (VALID_TIME - 60.5, False),
        (VALID_TIME - 59, True),
        (VALID_TIME - 58.5, True),
        (VALID_TIME, True),
        (VALID_TIME + 86400, True),
    ],
)
def test_the_gate_never_skips_a_task_that_apt_would_update_with(
    dpkg: FakeDpkgQuery, apt_lists: AptLists, age: float, runs: bool
) -> None:
    """The role's gate (age is none or age > N - 60) against apt.py's own test (its own reading of the lists'
    time, and its `not mtimestamp + tdelta >= now`) made 58 s after the read: where the gate skips the task,
    apt would not have updated."""
    apt_lists.make_stamp(age=age)
    found = lists_age(dpkg)
    gate_runs = found is None or found > VALID_TIME - MARGIN
    assert gate_runs is runs, found
    mtimestamp, _ = apt_module.get_updated_cache_time()
    later = datetime.datetime.now() + datetime.timedelta(seconds=58)
    apt_would_update = not mtimestamp + datetime.timedelta(seconds=VALID_TIME) >= later
    assert gate_runs or not apt_would_update


def test_the_gate_runs_the_task_when_apt_finds_no_lists(dpkg: FakeDpkgQuery, apt_lists: AptLists) -> None:
    assert lists_age(dpkg) is None
    mtimestamp, _ = apt_module.get_updated_cache_time()
    assert not mtimestamp + datetime.timedelta(seconds=VALID_TIME) >= datetime.datetime.now()
