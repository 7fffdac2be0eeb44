"""packages_in_place: which Debian package wants differ (installed, version, hold, absent, purged, regex,
half-installed states, multi-arch), read from a fake dpkg-query; the entry validation that names the entry;
a failing dpkg-query; and check mode."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import packages_in_place
import pytest
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
