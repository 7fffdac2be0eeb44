#!/usr/bin/python
"""Ansible module packages_in_place: which of a role's Debian package wants are not met."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: packages_in_place
short_description: Tell which of a role's Debian and Python package wants are not met
description:
  - In one module call, reads what dpkg knows of every package (one C(dpkg-query -W) run) and compares it
    with each want in O(packages) that the role's M(ansible.builtin.apt) and
    M(ansible.builtin.dpkg_selections) tasks enforce (installed, at a version, held or not; removed;
    purged).
  - "Meant for all-or-nothing use per role: run it first, registered, and run the role's package tasks
    only C(when) RV(differ) is not empty. When RV(differ) is empty they are all skipped (an apt task
    costs a module call of about half a second even when it changes nothing); when anything differs,
    the role runs them all, exactly as before, so apt's own dependency handling is unchanged. Do not
    pick single tasks by RV(differ): apt may need the others to resolve."
  - "Caveat: the role must list every package want its tasks enforce. The package tasks are skipped when
    RV(differ) is empty, so drift in a package left out of O(packages) goes unseen and is never put
    right."
  - "In the same call, reads whether the virtualenvs of O(python_packages) hold the pinned Python
    distributions the role's M(ansible.builtin.pip) tasks install (from the files in the venvs, without
    running their Python or pip), and with O(apt_cache=true) returns the age of apt's package lists
    (RV(apt_lists_age)), so that the role's pip tasks and its apt cache refresh can be skipped too."
  - Never changes anything; C(changed) is always false, and it runs the same in check mode.
  - "All architectures count: a package dpkg has for several architectures (multi-arch) is checked in
    each installed instance. A package in a state between installed and not (C(half-configured),
    C(unpacked), C(half-installed), C(triggers-pending), C(triggers-awaited)) differs from
    O(packages[].state=present) and is still there for O(packages[].state=absent)."
version_added: "0.1.0"
author: "A100 LLM platform team"
options:
  packages:
    description:
      - The role's package wants, one entry each.
      - A name may be listed once only (RV(reasons) is keyed by name).
      - May be left out (or empty) when the call is for O(python_packages) or O(apt_cache) only; then
        C(dpkg-query) does not run.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description:
          - The package name as dpkg prints it (lowercase letters, digits, V(+), V(-), V(.)). Every
            architecture is checked; a name with an architecture (V(libc6:i386)), a version (V(curl=7.81.0-1))
            or a glob (V(nvidia-*)) is refused, as it would match no package and so pass any
            O(packages[].state=absent) want.
          - With O(packages[].regex=true), a Python regular expression that must match a package name in
            full (C(re.fullmatch)).
        type: str
        required: true
      regex:
        description:
          - Whether O(packages[].name) is a regular expression.
          - "For O(packages[].state=present), at least one matching package must be installed, and
            O(packages[].version) and O(packages[].held) hold for every installed match. For
            O(packages[].state=absent) and O(packages[].state=purged), every match must be gone."
        type: bool
        default: false
      state:
        description:
          - V(present) installed (dpkg state C(installed)).
          - V(absent) not installed; config files left behind (dpkg state C(config-files)) are absent.
          - V(purged) absent and no config files left either (dpkg state C(not-installed), or unknown to
            dpkg).
        type: str
        choices: [present, absent, purged]
        default: present
      version:
        description:
          - The version every installed instance must have, as dpkg prints it (epoch included, V(1:2.3-1)).
          - An exact string, or a shell glob (C(fnmatch), case-sensitive) when it holds V(*) or V(?), for
            example V(535.183.06-*).
          - Only with O(packages[].state=present).
        type: str
      held:
        description:
          - V(true) every installed instance must be on hold (dpkg want C(hold), as
            M(ansible.builtin.dpkg_selections) sets it); V(false) none may be.
          - When left out, holds are not compared.
          - Only with O(packages[].state=present).
        type: bool
  python_packages:
    description:
      - The role's virtualenvs and the pinned distributions its M(ansible.builtin.pip) tasks install into
        each, one entry per virtualenv.
      - "Meant for a pip task with O(ansible.builtin.pip#module:virtualenv) set to O(python_packages[].venv)
        and O(ansible.builtin.pip#module:name) set to O(python_packages[].requirements), in its default
        O(ansible.builtin.pip#module:state=present), with no O(ansible.builtin.pip#module:extra_args),
        O(ansible.builtin.pip#module:requirements) file or O(ansible.builtin.pip#module:editable): run it
        only C(when) the venv path is in RV(differ)."
      - "An entry is in place when the virtualenv is there as the pip module finds one (C(bin/activate),
        which it looks for before it makes a virtualenv, C(bin/python) (links followed), and an
        executable C(bin/pip3) or C(bin/pip)), each requirement's distribution is installed in it once,
        at exactly that version, and so is each dependency they need (below), at any version."
      - "The distributions are read from C(lib/python3.N/site-packages) of the venv (N the version
        C(bin/python) resolves to, when its file name tells; otherwise the one C(lib/python3*/site-packages)
        there): each C(*.dist-info) (C(METADATA)) and C(*.egg-info) (C(PKG-INFO), or the file itself).
        Names are compared as PEP 503 normalises them (V(Nvidia_ML.py) is V(nvidia-ml-py))."
      - "Conservative: a version is compared as a string. One that pip counts equal but spelled
        differently (V(1.0) installed for V(1.0.0)) differs, and so does a distribution whose directory name
        and metadata disagree, one found twice (a broken venv), or one whose metadata cannot be read; then
        the pip task runs and decides. Distributions pip finds elsewhere (system site-packages, C(.pth)
        paths) are not read: they differ too."
      - "The dependencies are read as pip installs them: those of the requirements, theirs in turn, and so
        on (each distribution once). Each must be installed in the venv as a requirement must (once, with
        metadata that can be read and agrees with its directory name), but at any version: their version
        specifiers (V(urllib3>=1.24.2)) are not compared. A dependency removed from the venv by hand
        differs (the pip task puts it back)."
      - "A distribution's dependencies are its metadata's C(Requires-Dist) headers; for an C(.egg-info)
        whose metadata has none, the lines of its C(requires.txt) before its first C([section]) header
        (the lines under one are an extra's, or hold under a marker: they are not read). A dependency's name
        is the PEP 508 name it starts with; one that starts with none, or a C(requires.txt) that cannot be
        read, differs."
      - "Caveat: the conditional dependencies are not checked, and are the gap that is left. A
        C(Requires-Dist) whose marker (after C(;)) tests only C(extra) (V(extra == 'socks')) is skipped, as
        the roles install no extras (nor are the extras a dependency asks for, as in V(requests[socks]),
        followed); one with any other marker (C(python_version), C(platform_system), C(sys_platform), ...)
        is not checked either, as evaluating markers would need C(packaging), which the node's Python may
        lack. Such a dependency removed from the venv by hand is not seen, and the skipped pip task does
        not put it back; nor is a dependency at a version its dependent does not accept."
      - Each entry's reasons appear in RV(differ) and RV(reasons) under its O(python_packages[].venv), as
        given, after those of O(packages); RV(in_place) covers both lists.
    type: list
    elements: dict
    default: []
    suboptions:
      venv:
        description:
          - The absolute path of the virtualenv, exactly as the pip task's
            O(ansible.builtin.pip#module:virtualenv) gets it; it is the key of the entry in RV(differ) and
            RV(reasons). A relative path is refused.
        type: str
        required: true
      requirements:
        description:
          - "The distributions the pip task installs, each V(name==version): a PEP 508 name, C(==), and a
            PEP 440 version in its normal form (V(kubernetes==32.0.1), V(torch==2.1.0+cu121)). Extras,
            markers, other operators, several specifiers and URLs are refused, as is an empty list."
        type: list
        elements: str
        required: true
  apt_cache:
    description:
      - Whether to return RV(apt_lists_age), the age of apt's package lists as
        M(ansible.builtin.apt)'s O(ansible.builtin.apt#module:cache_valid_time) measures it.
      - "To skip a task C(ansible.builtin.apt: {update_cache: true, cache_valid_time: N}) when it would
        not update the cache, run it only
        C(when: result.apt_lists_age is none or result.apt_lists_age > N - 60)."
      - "The margin of 60 seconds covers the time from this read to the apt task: with it the gate runs the
        task whenever apt would update the lists, as long as the apt task starts within a minute of this
        one. Do not gate on C(> N): a cache a few seconds short of N here is older than N there."
    type: bool
    default: false
  dpkg_query:
    description:
      - The C(dpkg-query) program to run, by name (looked up in C(PATH)) or path.
    type: path
    default: dpkg-query
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - llm_platform
notes:
  - Needs no root; C(dpkg-query) reads dpkg's database as any user, and the venvs and apt's lists are read
    by their file names, modes and times (and the venvs' metadata files).
  - "A C(dpkg-query) that exits non-zero without listing anything, lists no package at all, or prints a line
    the module cannot read fails the task. One that exits non-zero but lists packages is read, with a
    warning."
seealso:
  - module: ansible.builtin.apt
  - module: ansible.builtin.dpkg_selections
  - module: ansible.builtin.package_facts
  - module: ansible.builtin.pip
"""

EXAMPLES = r"""
- name: Read whether the driver's packages are as the role wants them
  packages_in_place:
    packages:
      - {name: nvidia-headless-535, version: "535.183.06-*", held: true}
      - {name: '^nvidia-driver-[0-9]+$', regex: true, state: absent}
      - {name: xserver-xorg-video-nouveau, state: purged}
  register: driver_packages

- name: Install and hold the driver's packages
  ansible.builtin.include_tasks: install-driver-packages.yml
  when: driver_packages.differ | length > 0

- name: Say why the package tasks run
  ansible.builtin.debug:
    var: driver_packages.reasons
  when: not driver_packages.in_place

- name: Read whether the client's venv is as the role wants it, and the age of apt's lists
  packages_in_place:
    python_packages:
      - venv: /opt/kubernetes-client
        requirements: ["kubernetes==32.0.1"]
    apt_cache: true
  register: client_found

# apt updates the lists when they are older than cache_valid_time; the gate runs the task from a minute
# before that (the time between the read and this task)
- name: Refresh apt's lists when they are older than an hour
  ansible.builtin.apt:
    update_cache: true
    cache_valid_time: 3600
  when: client_found.apt_lists_age is none or client_found.apt_lists_age > 3600 - 60

- name: Install the kubernetes client into its venv
  ansible.builtin.pip:
    name: ["kubernetes==32.0.1"]
    virtualenv: /opt/kubernetes-client
    virtualenv_command: python3 -m venv
  when: "'/opt/kubernetes-client' in client_found.differ"
"""

RETURN = r"""
differ:
  description:
    - The names of the entries of O(packages) whose wants are not met, as given, in their order; then the
      O(python_packages[].venv) of each entry of O(python_packages) not in place, as given, in their order.
  returned: always
  type: list
  elements: str
  sample: ["nvidia-headless-535", "^nvidia-driver-[0-9]+$", "/opt/kubernetes-client"]
reasons:
  description:
    - For each name in RV(differ), why it differs, in short words.
    - A reason about one of several instances (a regex's matches, or the architectures of a multi-arch
      package) starts with the package (C(name) or C(name:arch)).
  returned: always
  type: dict
  sample:
    nvidia-headless-535: ["version 535.161.08-0ubuntu1, want 535.183.06-*", "not held"]
    ^nvidia-driver-[0-9]+$: ["nvidia-driver-535 installed (535.161.08-0ubuntu1), want absent"]
    xserver-xorg-video-nouveau: ["config files left, want purged"]
    /opt/kubernetes-client: ["kubernetes 31.0.0 installed, want 32.0.1"]
in_place:
  description: True when every want is met (RV(differ) is empty).
  returned: always
  type: bool
  sample: false
checked:
  description: The number of entries of O(packages) and O(python_packages) checked.
  returned: always
  type: int
  sample: 4
apt_lists_age:
  description:
    - The age in whole seconds, on the target's clock, of apt's package lists as
      M(ansible.builtin.apt)'s O(ansible.builtin.apt#module:cache_valid_time) measures it (the time of
      C(/var/lib/apt/periodic/update-success-stamp), else of the directory C(/var/lib/apt/lists)); negative
      when that time is in the future.
    - V(null) when neither is there (apt counts the lists as never updated).
    - See O(apt_cache) for the gate of an apt cache refresh task.
  returned: when O(apt_cache=true)
  type: int
  sample: 5321
"""

import datetime
import fnmatch
import math
import os
import re
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from ansible.module_utils.basic import AnsibleModule, is_executable
from ansible.module_utils.in_place_report import EntryError, Found, entry_field, reasons_by_key, run_report
from ansible.module_utils.venv_distributions import (
    VenvWanted,
    distribution_reasons,
    python_field,
    validated_requirements,
)

# dpkg-query expands \t and \n itself: the backslashes go to it as they are.
QUERY_FORMAT = r"${Package}\t${Architecture}\t${Version}\t${Status}\n"
DEBIAN_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]*")
GLOB_CHARACTERS = ("*", "?")

# dpkg's state words (the third word of ${Status}): what counts as installed, and as gone.
INSTALLED = "installed"
CONFIG_FILES = "config-files"
NOT_INSTALLED = "not-installed"
GONE_STATES = frozenset({CONFIG_FILES, NOT_INSTALLED})
HOLD = "hold"

ENTRY_SPEC: dict[str, Any] = {
    "name": {"type": "str", "required": True},
    "regex": {"type": "bool", "default": False},
    "state": {"type": "str", "choices": ["present", "absent", "purged"], "default": "present"},
    "version": {"type": "str"},
    "held": {"type": "bool"},
}

# The executables ansible.builtin.pip uses in a virtualenv (pip.py, _get_pip), in its order.
VENV_PIPS = ("pip3", "pip")

# What ansible.builtin.apt's cache_valid_time measures (apt.py, get_cache_mtime): the first that exists.
# Module-level so that tests can point them elsewhere.
APT_UPDATE_SUCCESS_STAMP_PATH = "/var/lib/apt/periodic/update-success-stamp"
APT_LISTS_PATH = "/var/lib/apt/lists"

PYTHON_ENTRY_SPEC: dict[str, Any] = {
    "venv": {"type": "str", "required": True},
    "requirements": {"type": "list", "elements": "str", "required": True},
}

ARGUMENT_SPEC: dict[str, Any] = {
    "packages": {"type": "list", "elements": "dict", "default": [], "options": ENTRY_SPEC},
    "python_packages": {"type": "list", "elements": "dict", "default": [], "options": PYTHON_ENTRY_SPEC},
    "apt_cache": {"type": "bool", "default": False},
    "dpkg_query": {"type": "path", "default": "dpkg-query"},
}


class CannotRead(Exception):
    """dpkg-query failed or printed what the module cannot read, or the time of apt's lists is unreadable."""


@dataclass(frozen=True)
class Wanted:
    """One entry of ``packages``: what the role wants of the packages ``name`` names."""

    name: str
    pattern: re.Pattern[str] | None
    state: str
    version: str | None
    held: bool | None


@dataclass(frozen=True)
class Package:
    """One line of dpkg-query: a package of one architecture, as dpkg knows it."""

    name: str
    arch: str
    version: str
    want: str
    state: str

    @property
    def there(self) -> bool:
        """Installed, or on its way in or out (anything but config-files and not-installed)."""
        return self.state not in GONE_STATES


@dataclass(frozen=True)
class Wants:
    """Both lists of wants, validated."""

    packages: list[Wanted]
    python_packages: list[VenvWanted]

    @property
    def count(self) -> int:
        return len(self.packages) + len(self.python_packages)


def field_name(index: int, field: str) -> str:
    return entry_field("packages", index, field)


def validated_pattern(index: int, name: str, regex: bool) -> re.Pattern[str] | None:
    if not name:
        raise EntryError(f"{field_name(index, 'name')}: must not be empty")
    if regex:
        try:
            return re.compile(name)
        except re.error as exc:
            raise EntryError(
                f"{field_name(index, 'name')}: {name!r} is not a valid regular expression: {exc}"
            ) from exc
    if not DEBIAN_NAME.fullmatch(name):
        raise EntryError(
            f"{field_name(index, 'name')}: {name!r} is not a Debian package name (lowercase letters,"
            " digits, '+', '-', '.'; no architecture or version: every architecture is checked);"
            " for a pattern, set regex: true"
        )
    return None


def reject_present_only_fields(index: int, entry: dict[str, Any]) -> None:
    for field in ("version", "held"):
        if entry[field] is not None and entry["state"] != "present":
            raise EntryError(
                f"{field_name(index, field)}: only with state=present, not state={entry['state']}"
            )


def validated_version(index: int, version: str | None) -> str | None:
    if version is not None and not version:
        raise EntryError(f"{field_name(index, 'version')}: must not be empty")
    return version


def validated_entry(index: int, entry: dict[str, Any]) -> Wanted:
    reject_present_only_fields(index, entry)
    return Wanted(
        name=entry["name"],
        pattern=validated_pattern(index, entry["name"], entry["regex"]),
        state=entry["state"],
        version=validated_version(index, entry["version"]),
        held=entry["held"],
    )


def reject_duplicate_names(wanted: list[Wanted]) -> None:
    first_index: dict[str, int] = {}
    for index, entry in enumerate(wanted):
        if entry.name in first_index:
            raise EntryError(
                f"{field_name(first_index[entry.name], 'name')} and {field_name(index, 'name')}"
                f" both name {entry.name!r}"
            )
        first_index[entry.name] = index


def validated_entries(entries: list[dict[str, Any]]) -> list[Wanted]:
    wanted = [validated_entry(index, entry) for index, entry in enumerate(entries)]
    reject_duplicate_names(wanted)
    return wanted


def validated_venv(index: int, venv: str) -> str:
    if not os.path.isabs(venv):
        raise EntryError(
            f"{python_field(index, 'venv')}: {venv!r} is not an absolute path (as the pip task's virtualenv"
            " must be here: it is the key in differ and reasons)"
        )
    return venv


def validated_python_entry(index: int, entry: dict[str, Any]) -> VenvWanted:
    return VenvWanted(
        venv=validated_venv(index, entry["venv"]),
        requirements=validated_requirements(index, entry["requirements"]),
    )


def reject_shared_keys(wanted: Wants) -> None:
    """Each key of differ and reasons must be one entry's: a venv once, and no venv also a package's name."""
    package_index = {entry.name: index for index, entry in enumerate(wanted.packages)}
    first_index: dict[str, int] = {}
    for index, entry in enumerate(wanted.python_packages):
        if entry.venv in package_index:
            raise EntryError(
                f"{field_name(package_index[entry.venv], 'name')} and {python_field(index, 'venv')}"
                f" both name {entry.venv!r}"
            )
        if entry.venv in first_index:
            raise EntryError(
                f"{python_field(first_index[entry.venv], 'venv')} and {python_field(index, 'venv')}"
                f" both name {entry.venv!r}"
            )
        first_index[entry.venv] = index


def validated_wants(params: dict[str, Any]) -> Wants:
    wanted = Wants(
        packages=validated_entries(params["packages"]),
        python_packages=[
            validated_python_entry(index, entry) for index, entry in enumerate(params["python_packages"])
        ],
    )
    reject_shared_keys(wanted)
    return wanted


def parsed_line(line: str) -> Package:
    fields = line.split("\t")
    words = fields[3].split() if len(fields) == 4 else []
    if len(words) != 3 or not fields[0]:
        raise CannotRead(f"dpkg-query printed a line the module cannot read: {line!r}")
    return Package(name=fields[0], arch=fields[1], version=fields[2], want=words[0], state=words[2])


def parsed_listing(stdout: str) -> dict[str, list[Package]]:
    """dpkg-query's lines, by package name (several architectures of one name in the order listed)."""
    by_name: dict[str, list[Package]] = {}
    for line in stdout.splitlines():
        if line.strip():
            package = parsed_line(line)
            by_name.setdefault(package.name, []).append(package)
    if not by_name:
        raise CannotRead("dpkg-query listed no packages")
    return by_name


def dpkg_query_program(module: AnsibleModule) -> str:
    """The dpkg-query to run: the option's path, or its name found in PATH (or an sbin directory)."""
    program = module.params["dpkg_query"]
    found = module.get_bin_path(program)
    if found is None:
        raise CannotRead(f"{program}: no such executable; dpkg-query comes with dpkg, on Debian and Ubuntu")
    return found


def read_packages(module: AnsibleModule) -> dict[str, list[Package]]:
    rc, stdout, stderr = module.run_command([dpkg_query_program(module), "-W", "-f", QUERY_FORMAT])
    if rc != 0 and not stdout.strip():
        raise CannotRead(f"dpkg-query failed: {stderr.strip()}")
    if rc != 0:
        module.warn(f"dpkg-query exited {rc} but listed packages; read what it listed: {stderr.strip()}")
    return parsed_listing(stdout)


def matches(wanted: Wanted, packages: dict[str, list[Package]]) -> list[Package]:
    """Every instance dpkg knows of the packages the entry names."""
    if wanted.pattern is None:
        return list(packages.get(wanted.name, []))
    pattern = wanted.pattern
    return [package for name, found in packages.items() if pattern.fullmatch(name) for package in found]


def prefixes(wanted: Wanted, instances: list[Package]) -> dict[Package, str]:
    """What each reason about one instance starts with: nothing for the one instance of an exact name,
    else the package, with its architecture when its name is there for several."""
    arches_by_name: dict[str, int] = {}
    for package in instances:
        arches_by_name[package.name] = arches_by_name.get(package.name, 0) + 1
    if wanted.pattern is None and len(instances) == 1:
        return {instances[0]: ""}
    return {
        package: f"{package.name}:{package.arch} " if arches_by_name[package.name] > 1 else f"{package.name} "
        for package in instances
    }


def version_matches(want: str, version: str) -> bool:
    if any(character in want for character in GLOB_CHARACTERS):
        return fnmatch.fnmatchcase(version, want)
    return version == want


def instance_reasons(wanted: Wanted, package: Package) -> list[str]:
    """Why one installed (or half-installed) instance does not meet a state=present want."""
    reasons = []
    if package.state != INSTALLED:
        reasons.append(f"{package.state}, want installed")
    if wanted.version is not None and not version_matches(wanted.version, package.version):
        reasons.append(f"version {package.version}, want {wanted.version}")
    if wanted.held is True and package.want != HOLD:
        reasons.append("not held")
    if wanted.held is False and package.want == HOLD:
        reasons.append("held, want not held")
    return reasons


def present_reasons(wanted: Wanted, found: list[Package]) -> list[str]:
    there = [package for package in found if package.there]
    if not there:
        return [f"no installed package matches {wanted.name}" if wanted.pattern else "not installed"]
    prefix = prefixes(wanted, there)
    return [prefix[package] + reason for package in there for reason in instance_reasons(wanted, package)]


def gone_reasons(wanted: Wanted, found: list[Package]) -> list[str]:
    """Why a state=absent or state=purged want is not met: each instance still there (and, for purged,
    each with config files left)."""
    left = [package for package in found if package.there]
    if wanted.state == "purged":
        left = [package for package in found if package.state != NOT_INSTALLED]
    prefix = prefixes(wanted, left) if left else {}
    reasons = []
    for package in left:
        if package.state == CONFIG_FILES:
            reasons.append(f"{prefix[package]}config files left, want purged")
        else:
            reasons.append(f"{prefix[package]}{package.state} ({package.version}), want {wanted.state}")
    return reasons


def entry_reasons(wanted: Wanted, packages: dict[str, list[Package]]) -> list[str]:
    found = matches(wanted, packages)
    if wanted.state == "present":
        return present_reasons(wanted, found)
    return gone_reasons(wanted, found)


def reasons_by_name(wanted: list[Wanted], packages: dict[str, list[Package]]) -> dict[str, list[str]]:
    """Each entry whose want is not met, with its reasons, in the order of ``wanted``."""
    return reasons_by_key(wanted, attrgetter("name"), lambda entry: entry_reasons(entry, packages))


# ------------------------------------------------------------------ python_packages: the virtualenvs
# What the venv holds, read from its metadata files, against the pins: module_utils/venv_distributions.py.


def missing_venv_reason(venv: str) -> str | None:
    """Why ``venv`` is not a virtualenv the pip module would use as it is; None when it is one.

    ansible.builtin.pip makes a virtualenv (and reports changed) when ``bin/activate`` does not exist
    (pip.py, main: ``if not os.path.exists(os.path.join(env, 'bin', 'activate'))``), and fails when the venv
    has no executable ``bin/pip3`` or ``bin/pip`` (pip.py, _get_pip: ``os.path.exists(candidate) and
    is_executable(candidate)``). ``bin/python`` (links followed) is its interpreter."""
    bin_dir = os.path.join(venv, "bin")
    if not os.path.exists(os.path.join(bin_dir, "python")):
        return f"no virtualenv at {venv} (no bin/python)"
    if not os.path.exists(os.path.join(bin_dir, "activate")):
        return (
            f"no virtualenv at {venv} (no bin/activate, which the pip module looks for before it makes one)"
        )
    pips = [os.path.join(bin_dir, name) for name in VENV_PIPS]
    if not any(os.path.exists(pip) and is_executable(pip) for pip in pips):
        return f"no pip in the virtualenv at {venv} (no executable bin/pip3 or bin/pip)"
    return None


def venv_reasons(wanted: VenvWanted) -> list[str]:
    """Why the virtualenv does not hold the requirements as the pip task would leave them; [] when it does."""
    missing = missing_venv_reason(wanted.venv)
    if missing is not None:
        return [missing]
    return distribution_reasons(wanted)


def reasons_by_venv(wanted: list[VenvWanted]) -> dict[str, list[str]]:
    return reasons_by_key(wanted, attrgetter("venv"), venv_reasons)


# ------------------------------------------------------------------ apt_cache: the age of apt's lists


def apt_lists_mtime() -> float | None:
    """The time apt.py's get_cache_mtime reads: the stamp's if it exists, else the lists directory's; None
    where apt.py takes 0 (never updated)."""
    for path in (APT_UPDATE_SUCCESS_STAMP_PATH, APT_LISTS_PATH):
        if os.path.exists(path):
            try:
                return os.stat(path).st_mtime
            except OSError as exc:
                raise CannotRead(f"cannot read the time of {path}: {exc.strerror}") from exc
    return None


def apt_lists_age() -> int | None:
    """The lists' age in whole seconds (rounded down), on the target's clock, or None when apt never updated
    them.

    apt.py updates when ``not mtimestamp + tdelta >= now`` (``mtimestamp`` the time above as a naive local
    datetime, ``now = datetime.datetime.now()``, ``tdelta`` cache_valid_time): when the age it computes is
    over N seconds. The age here is computed the same way (naive local times, so a change of daylight
    saving time counts as apt counts it). The gate ``age is none or age > N - 60`` skips the task only when
    ``floor(age) <= N - 60``, that is when the age here is under N - 59 s; then apt, whose age is this one
    plus the time d from this read to its own, updates only when d is over 59 s. So with the apt task
    within a minute of this read the gate never skips a task that would update; it may run one that does
    not."""
    mtime = apt_lists_mtime()
    if mtime is None:
        return None
    age = datetime.datetime.now() - datetime.datetime.fromtimestamp(mtime)
    return math.floor(age.total_seconds())


# ------------------------------------------------------------------ the module


def differing(module: AnsibleModule, wanted: Wants) -> dict[str, list[str]]:
    """The reasons of each entry that is not in place: packages' by name, then python_packages' by venv.
    dpkg-query runs only when there are package wants."""
    reasons = reasons_by_name(wanted.packages, read_packages(module)) if wanted.packages else {}
    reasons.update(reasons_by_venv(wanted.python_packages))
    return reasons


def read(module: AnsibleModule, wanted: Wants) -> Found:
    reasons = differing(module, wanted)
    # read last, the nearest to the apt task it gates
    found = {"apt_lists_age": apt_lists_age()} if module.params["apt_cache"] else {}
    return reasons, wanted.count, found


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_report(module, validated_wants, lambda wanted: read(module, wanted), CannotRead)


if __name__ == "__main__":
    main()
