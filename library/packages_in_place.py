#!/usr/bin/python
"""Ansible module packages_in_place: which of a role's Debian package wants are not met."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: packages_in_place
short_description: Tell which of a role's Debian package wants are not met
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
    type: list
    elements: dict
    required: true
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
  - Needs no root; C(dpkg-query) reads dpkg's database as any user.
  - "A C(dpkg-query) that exits non-zero without listing anything, lists no package at all, or prints a line
    the module cannot read fails the task. One that exits non-zero but lists packages is read, with a
    warning."
seealso:
  - module: ansible.builtin.apt
  - module: ansible.builtin.dpkg_selections
  - module: ansible.builtin.package_facts
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
"""

RETURN = r"""
differ:
  description: The names of the entries of O(packages) whose wants are not met, as given, in their order.
  returned: always
  type: list
  elements: str
  sample: ["nvidia-headless-535", "^nvidia-driver-[0-9]+$"]
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
in_place:
  description: True when every want is met (RV(differ) is empty).
  returned: always
  type: bool
  sample: false
checked:
  description: The number of entries of O(packages) checked.
  returned: always
  type: int
  sample: 3
"""

import fnmatch
import re
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.in_place_report import EntryError, entry_field, reasons_by_key, run_report

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

ARGUMENT_SPEC: dict[str, Any] = {
    "packages": {"type": "list", "elements": "dict", "required": True, "options": ENTRY_SPEC},
    "dpkg_query": {"type": "path", "default": "dpkg-query"},
}


class CannotRead(Exception):
    """dpkg-query failed, or printed what the module cannot read."""


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


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_report(
        module,
        "packages",
        validated_entries,
        differing=lambda wanted: reasons_by_name(wanted, read_packages(module)),
        read_error=CannotRead,
    )


if __name__ == "__main__":
    main()
