"""Finds in directories for a role's logic, answered as ansible.builtin.find answers them, so that one module
call (files_in_place's ``find``) replaces a find task.

Only the options of find the roles use: ``paths``, ``patterns`` (shell globs on the entry's name, find's
default ``use_regex: false``), ``contains`` (a regular expression matched, with ``re.match``, against each
line of a regular file), ``file_type`` (``file``, ``directory``, ``link``, ``any``), ``hidden``, ``recurse``,
``depth`` and ``get_checksum`` (SHA-1, find's default ``checksum_algorithm``). The walk is find's own
(ansible-core 2.19's modules/find.py, with its defaults for the options left out: no ``follow``, ``excludes``,
``age``, ``size``, ``mode`` or ``limit``): the same entries, in the same order, the same ``examined`` count,
and the same ``skipped_paths`` where find skips (a path that is not a directory, a directory it may not list,
an entry it may not lstat, a file it cannot decode for ``contains``); find's warnings about them are not
repeated (a role's read meets directories its later tasks make).

Each entry found is ``path`` and the part of find's stat the roles read: ``isreg``, ``isdir``, ``islnk`` (of
the entry itself, never followed), ``mode`` (4 octal digits), ``uid``, ``gid``, ``pw_name``, ``gr_name``
(empty where the id has no name), ``size``, ``mtime``, ``ctime``, and with ``get_checksum`` the ``checksum``
of a regular file.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.path_reads import stat_entry

FILE_TYPES = ("file", "directory", "link", "any")
CHUNK_SIZE = 64 * 1024
# find's own words for a file it could not decode looking for `contains` (its `encoding` left out)
DEFAULT_ENCODING = 'None (default determined by the Python built-in function "open")'


@dataclass(frozen=True)
class FindSpec:
    """One find, with find's defaults for what is left out."""

    paths: list[str]
    patterns: list[str]
    contains: re.Pattern[str] | None = None
    file_type: str = "file"
    hidden: bool = False
    recurse: bool = False
    depth: int | None = None
    get_checksum: bool = False


class _PathSkipped(Exception):
    """Where find stops walking one of its paths, with its message for ``skipped_paths``."""


def _checksum(path: str) -> str | None:
    """find's checksum (AnsibleModule.digest_from_file, SHA-1): None where nothing is there any more; an
    OSError where the file cannot be read, which ends the walk of the path as it ends find's."""
    b_path = os.fsencode(path)
    if not os.path.exists(b_path):
        return None
    digest = hashlib.sha1()
    with open(os.path.realpath(b_path), "rb") as content:
        for chunk in iter(lambda: content.read(CHUNK_SIZE), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _name_matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def _contains(path: str, pattern: re.Pattern[str] | None) -> bool:
    """find's content filter: a line of the file, read as text as find reads it (the locale's encoding,
    universal newlines), that the pattern matches at its start."""
    if pattern is None:
        return True
    try:
        with open(path, encoding=None) as lines:  # find's own open: the locale's encoding
            return any(pattern.match(line) for line in lines)
    except UnicodeDecodeError as exc:
        raise _PathSkipped(
            f"Failed to read the file {path} due to an encoding error. current encoding: {DEFAULT_ENCODING}"
        ) from exc
    except OSError:
        return False


def _matched(spec: FindSpec, name: str, path: str, st: os.stat_result) -> dict[str, Any] | None:
    """The entry as find lists it, or None where find leaves it out."""
    kind_wanted = (
        spec.file_type == "any"
        or (spec.file_type == "directory" and stat.S_ISDIR(st.st_mode))
        or (spec.file_type == "file" and stat.S_ISREG(st.st_mode))
        or (spec.file_type == "link" and stat.S_ISLNK(st.st_mode))
    )
    if not kind_wanted or not _name_matches(name, spec.patterns or ["*"]):
        return None
    if spec.file_type == "file" and not _contains(path, spec.contains):
        return None
    found = stat_entry(path, st)
    found["ctime"] = st.st_ctime  # as find answers (stat's reads leave it out): when a directory arrived
    if spec.get_checksum and stat.S_ISREG(st.st_mode):
        found["checksum"] = _checksum(path)
    return found


def find_in(spec: FindSpec) -> dict[str, Any]:
    """What ansible.builtin.find returns for SPEC: ``files``, ``matched``, ``examined``, ``skipped_paths``."""
    files: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    examined = 0

    def walk_error(exc: OSError) -> None:
        if exc.errno in (errno.EPERM, errno.EACCES, errno.ENOENT):
            skipped[str(exc.filename)] = str(exc)
            return
        raise exc

    for top in spec.paths:
        try:
            if not os.path.isdir(top):
                raise _PathSkipped(f"'{top}' is not a directory")
            for root, dirs, names in os.walk(top, onerror=walk_error, followlinks=False, topdown=True):
                examined += len(names) + len(dirs)
                for name in names + dirs:
                    path = os.path.normpath(os.path.join(root, name))
                    if spec.depth:
                        top_dir = top.rstrip(os.path.sep) + os.path.sep
                        if path.count(os.path.sep) - top_dir.count(os.path.sep) + 1 > spec.depth:
                            del dirs[:]  # no deeper: as find, which still counted them in examined
                            continue
                    if os.path.basename(path).startswith(".") and not spec.hidden:
                        continue  # a hidden directory is still walked into, as find walks it
                    try:
                        st = os.lstat(path)
                    except OSError as exc:
                        skipped[path] = str(exc)
                        continue
                    found = _matched(spec, name, path, st)
                    if found is not None:
                        files.append(found)
                if not spec.recurse:
                    break
        except (OSError, _PathSkipped) as exc:
            skipped[top] = str(exc)
    return {"files": files, "matched": len(files), "examined": examined, "skipped_paths": skipped}
