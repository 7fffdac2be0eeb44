"""Whether a virtualenv holds the pinned Python distributions a pip task installs, and what they need, as
the ``python_packages`` option of the module library/packages_in_place.py reads it: the requirements
(``name==version``, validated; an error names the field, ``python_packages[1].requirements[0]``), the
distributions installed in the venv's site-packages, read from their metadata files (``*.dist-info``,
``*.egg-info``) without running the venv's Python or pip, and the reasons the requirements and their
unconditional dependencies are not in place.

The module validates the venv's path and checks first that the venv is one the pip module would use
(bin/python, bin/activate, an executable pip, tested with Ansible's is_executable as pip.py does). Nothing
from Ansible is imported at import time.
"""

from __future__ import annotations

import glob
import os
import re
from collections import deque
from dataclasses import dataclass

from ansible.module_utils.in_place_report import EntryError, entry_field

# A requirement as the role's pip task passes it: a PEP 508 name, "==", and a PEP 440 version in its normal
# form (public part, then an optional local part), nothing else. Any such version is one pip can parse, and
# pip's "==" holds for the version spelled the same.
PYTHON_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
NUMBER = r"(?:0|[1-9][0-9]*)"
NORMAL_VERSION = (
    rf"(?:[1-9][0-9]*!)?{NUMBER}(?:\.{NUMBER})*(?:(?:a|b|rc){NUMBER})?(?:\.post{NUMBER})?(?:\.dev{NUMBER})?"
    r"(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?"
)
PINNED_REQUIREMENT = re.compile(rf"(?P<name>{PYTHON_NAME})==(?P<version>{NORMAL_VERSION})")
# The metadata headers read: a distribution's Name and Version (the first of each), and its dependencies.
READ_HEADERS = ("name", "version", "requires-dist")
# A dependency, as a Requires-Dist header or a line of requires.txt writes it, starts with its PEP 508 name.
DEPENDENCY_NAME = re.compile(rf"\s*({PYTHON_NAME})")
# The interpreter's file name, where it tells the version of the site-packages it reads.
VERSIONED_PYTHON = re.compile(r"python(3\.[0-9]+)")


@dataclass(frozen=True)
class Requirement:
    """One requirement of ``python_packages``: ``name==version``."""

    name: str
    canonical_name: str
    version: str


@dataclass(frozen=True)
class VenvWanted:
    """One entry of ``python_packages``: the distributions a virtualenv must hold."""

    venv: str
    requirements: tuple[Requirement, ...]


@dataclass(frozen=True)
class Distribution:
    """One ``*.dist-info`` or ``*.egg-info`` of a site-packages directory."""

    directory: str
    # The canonical names it goes by: its directory name's, and its metadata's Name (when they differ, both)
    names: frozenset[str]
    # Its version when its metadata's Version and its directory name (where that carries one) agree, else None
    version: str | None
    # Why it has no version, when it has none
    problem: str | None
    # Its metadata's Requires-Dist headers, as written, in their order
    requires_dist: tuple[str, ...]


def python_field(index: int, field: str) -> str:
    return entry_field("python_packages", index, field)


def canonical_python_name(name: str) -> str:
    """A distribution's name as PEP 503 normalises it (as pip.py's Package.canonicalize_name does)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def validated_requirement(index: int, position: int, requirement: str) -> Requirement:
    match = PINNED_REQUIREMENT.fullmatch(requirement)
    if match is None:
        raise EntryError(
            f"{python_field(index, f'requirements[{position}]')}: {requirement!r} is not name==version"
            " (a PEP 508 name, '==', and a PEP 440 version in its normal form, as kubernetes==32.0.1;"
            " no extras, markers, other operators, spaces or URLs)"
        )
    name = match["name"]
    return Requirement(name=name, canonical_name=canonical_python_name(name), version=match["version"])


def validated_requirements(index: int, requirements: list[str]) -> tuple[Requirement, ...]:
    if not requirements:
        raise EntryError(f"{python_field(index, 'requirements')}: must not be empty")
    validated = [
        validated_requirement(index, position, requirement)
        for position, requirement in enumerate(requirements)
    ]
    first_position: dict[str, int] = {}
    for position, requirement in enumerate(validated):
        name = requirement.canonical_name
        if name in first_position:
            raise EntryError(
                f"{python_field(index, f'requirements[{first_position[name]}]')} and"
                f" {python_field(index, f'requirements[{position}]')} both name {name!r}"
            )
        first_position[name] = position
    return tuple(validated)


def site_packages_of(venv: str) -> tuple[str | None, str | None]:
    """(the site-packages directory the venv's Python reads, or None; why it cannot be told, or None).

    The one of ``bin/python``'s version where the file it resolves to is named ``python3.N``; else the one
    ``lib/python3*/site-packages`` there. None, with no problem, when there is none: nothing installed."""
    interpreter = os.path.basename(os.path.realpath(os.path.join(venv, "bin", "python")))
    versioned = VERSIONED_PYTHON.fullmatch(interpreter)
    if versioned:
        directory = os.path.join(venv, "lib", f"python{versioned[1]}", "site-packages")
        return (directory if os.path.isdir(directory) else None), None
    found = sorted(glob.glob(os.path.join(glob.escape(venv), "lib", "python3*", "site-packages")))
    found = [directory for directory in found if os.path.isdir(directory)]
    if len(found) > 1:
        named = ", ".join(os.path.relpath(directory, venv) for directory in found)
        return None, f"several site-packages directories ({named}): cannot tell which bin/python reads"
    return (found[0] if found else None), None


def metadata_headers(path: str) -> dict[str, list[str]]:
    """The values of the READ_HEADERS of a METADATA or PKG-INFO file, by lowercase key, in their order; {}
    when it cannot be read. Reads the header block only (up to the first empty line), not the description
    after it. A line of blanks continues the header before it, as in email's parser, which pip's reading
    uses: a License of several paragraphs (setuptools indents its empty lines) does not end the block
    before the Requires-Dist headers that follow it."""
    headers: dict[str, list[str]] = {}
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as stream:
            for line in stream:
                if not line.rstrip("\r\n"):
                    break
                key, colon, value = line.partition(":")
                key = key.strip().lower()
                if colon and not line[0].isspace() and key in READ_HEADERS:
                    headers.setdefault(key, []).append(value.strip())
    except OSError:
        return {}
    return headers


def first_header(headers: dict[str, list[str]], key: str) -> str | None:
    values = headers.get(key)
    return values[0] if values else None


def directory_name_and_version(directory: str) -> tuple[str, str | None]:
    """The name and version a ``.dist-info`` / ``.egg-info`` directory name carries
    (``name-version.dist-info``, ``name-version-py3.10.egg-info``), as pip's metadata backends read them."""
    stem = directory.rsplit(".", 1)[0]
    name, _, rest = stem.partition("-")
    if directory.endswith(".dist-info"):
        return name, rest or None
    return name, rest.split("-", 1)[0] or None


def metadata_path(site_packages: str, directory: str) -> str:
    path = os.path.join(site_packages, directory)
    if directory.endswith(".dist-info"):
        return os.path.join(path, "METADATA")
    return os.path.join(path, "PKG-INFO") if os.path.isdir(path) else path


def read_distribution(site_packages: str, directory: str) -> Distribution:
    """One distribution, with a version only when its metadata and its directory name agree on it (pip takes
    the directory name's where there is one, else the metadata's; both then give the same)."""
    directory_name, directory_version = directory_name_and_version(directory)
    headers = metadata_headers(metadata_path(site_packages, directory))
    name = first_header(headers, "name")
    names = {canonical_python_name(directory_name)}
    if name:
        names.add(canonical_python_name(name))
    version = first_header(headers, "version") or None
    problem = None
    if name is None or version is None:
        problem = f"{directory}: no Name and Version in its metadata"
    elif len(names) > 1:
        problem = f"{directory}: its metadata names {name}"
    elif directory_version is not None and directory_version != version:
        problem = f"{directory}: its metadata says version {version}"
    return Distribution(
        directory=directory,
        names=frozenset(names),
        version=None if problem else version,
        problem=problem,
        requires_dist=tuple(headers.get("requires-dist", [])),
    )


def installed_distributions(site_packages: str | None) -> dict[str, list[Distribution]]:
    """The distributions of a site-packages directory, by each canonical name they go by. OSError when the
    directory cannot be listed."""
    by_name: dict[str, list[Distribution]] = {}
    if site_packages is None:
        return by_name
    for directory in sorted(os.listdir(site_packages)):
        if directory.endswith((".dist-info", ".egg-info")):
            distribution = read_distribution(site_packages, directory)
            for name in distribution.names:
                by_name.setdefault(name, []).append(distribution)
    return by_name


def found_once_reasons(label: str, found: list[Distribution]) -> list[str]:
    """Why the distributions found under one name are not one distribution with readable metadata; [] when
    they are. ``label`` names it in the reasons (its name, or its name and its dependent)."""
    if not found:
        return [f"{label} not installed"]
    if len(found) > 1:
        directories = ", ".join(distribution.directory for distribution in found)
        return [f"{label} installed {len(found)} times ({directories}): a broken virtualenv"]
    (distribution,) = found
    if distribution.problem is not None:
        return [f"{label}: {distribution.problem}"]
    return []


def requirement_reasons(requirement: Requirement, installed: dict[str, list[Distribution]]) -> list[str]:
    found = installed.get(requirement.canonical_name, [])
    reasons = found_once_reasons(requirement.name, found)
    if not reasons and found[0].version != requirement.version:
        return [f"{requirement.name} {found[0].version} installed, want {requirement.version}"]
    return reasons


def unconditional_requires_txt_lines(path: str) -> list[str]:
    """The lines of an egg-info's requires.txt before its first ``[section]`` header (those after it are an
    extra's, or hold under a marker), blank lines and comments left out; [] when there is no requires.txt
    (setuptools writes none for a distribution without dependencies). OSError when it cannot be read."""
    lines: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as stream:
            for line in stream:
                stripped = line.strip()
                if stripped.startswith("["):
                    break
                if stripped and not stripped.startswith("#"):
                    lines.append(stripped)
    except FileNotFoundError:
        return []
    return lines


def declared_dependencies(site_packages: str, distribution: Distribution) -> list[str]:
    """What a distribution requires, as pip reads it: its metadata's Requires-Dist headers; for an
    ``.egg-info`` directory whose metadata has none, the unconditional lines of its ``requires.txt``. OSError
    when that requires.txt cannot be read."""
    path = os.path.join(site_packages, distribution.directory)
    egg_info_directory = distribution.directory.endswith(".egg-info") and os.path.isdir(path)
    if distribution.requires_dist or not egg_info_directory:
        return list(distribution.requires_dist)
    return unconditional_requires_txt_lines(os.path.join(path, "requires.txt"))


def is_conditional(dependency: str) -> bool:
    """Whether a dependency holds under a marker (after a ``;``). Such a one is not checked: a marker that
    tests only ``extra`` holds for an extra, and the roles install none; any other (``python_version``,
    ``sys_platform``, ...) would need ``packaging`` to evaluate, which the node's Python may lack."""
    return ";" in dependency


def dependency_name(dependency: str) -> str | None:
    """The leading PEP 508 name of a dependency (``urllib3`` of ``urllib3<2.4,>=1.24.2`` or of the old
    ``urllib3 (>=1.24.2)``); its version specifiers are not read. None when it starts with no name."""
    match = DEPENDENCY_NAME.match(dependency)
    return match[1] if match else None


def unconditional_dependency_names(
    site_packages: str, dependent: str, distribution: Distribution
) -> tuple[list[str], list[str]]:
    """(the names of the dependencies a distribution needs whatever the markers, as written; why some cannot
    be read). ``dependent`` names the distribution in the reasons."""
    try:
        dependencies = declared_dependencies(site_packages, distribution)
    except OSError as exc:
        return [], [f"{dependent}: cannot read {distribution.directory}/requires.txt: {exc.strerror}"]
    names: list[str] = []
    unreadable: list[str] = []
    for dependency in dependencies:
        if is_conditional(dependency):
            continue
        name = dependency_name(dependency)
        if name is None:
            unreadable.append(f"{dependent}: cannot read its dependency {dependency!r}")
        else:
            names.append(name)
    return names, unreadable


def dependency_reasons(
    site_packages: str, requirements: tuple[Requirement, ...], installed: dict[str, list[Distribution]]
) -> list[str]:
    """Why a dependency the requirements need, or those need in turn, is not installed (by name, at any
    version); [] when each is. Walks the dependencies breadth first from the requirements (each in place,
    found once), each distribution once, so a cycle ends; a dependency is named with its first dependent."""
    visited = {requirement.canonical_name for requirement in requirements}
    to_read = deque(
        (requirement.name, installed[requirement.canonical_name][0]) for requirement in requirements
    )
    reasons: list[str] = []
    while to_read:
        dependent, distribution = to_read.popleft()
        names, unreadable = unconditional_dependency_names(site_packages, dependent, distribution)
        reasons.extend(unreadable)
        for name in names:
            canonical_name = canonical_python_name(name)
            if canonical_name in visited:
                continue
            visited.add(canonical_name)
            found = installed.get(canonical_name, [])
            found_reasons = found_once_reasons(f"{name} (a dependency of {dependent})", found)
            reasons.extend(found_reasons)
            if not found_reasons:
                to_read.append((name, found[0]))
    return reasons


def distribution_reasons(wanted: VenvWanted) -> list[str]:
    """Why the distributions installed in the virtualenv are not the requirements, and their unconditional
    dependencies, as the pip task would leave them; [] when they are. The venv must be one the pip module
    would use, which the module checks first."""
    site_packages, problem = site_packages_of(wanted.venv)
    if problem is not None:
        return [problem]
    try:
        installed = installed_distributions(site_packages)
    except OSError as exc:
        # a reason, not a failure of the read: the pip task runs and says what it makes of the venv
        return [f"cannot list {site_packages}: {exc.strerror}"]
    reasons = [
        reason
        for requirement in wanted.requirements
        for reason in requirement_reasons(requirement, installed)
    ]
    # the dependencies are read only when the requirements are in place: else the pip task runs anyway
    if reasons or site_packages is None:
        return reasons
    return dependency_reasons(site_packages, wanted.requirements, installed)
