"""Reads of paths for a role's logic, answered as ansible.builtin.stat and ansible.builtin.slurp answer them,
so that one module call (files_in_place's ``stat`` and ``slurp``) replaces a stat or slurp task per path.

Only what the roles read of a stat is returned: ``exists``, and for a path that exists ``path``, ``isreg``,
``isdir``, ``islnk`` (of the path itself: not followed, as stat's default ``follow: false``), ``lnk_target``
for a link, ``mode`` (the permission bits, 4 octal digits), ``uid``, ``gid``, ``pw_name``, ``gr_name``,
``size``, ``mtime``, ``readable`` and ``executable`` (for this user, through a link as stat's are), and
``checksum`` (SHA-1, stat's default) for a regular file it may read. A slurp is
``content`` (base64) and ``encoding``, or nothing where the path is missing (where slurp fails and the roles'
tasks ignore it).
"""

from __future__ import annotations

import base64
import grp
import hashlib
import os
import pwd
import stat
from typing import Any

CHUNK_SIZE = 1024 * 1024


class PathReadError(Exception):
    """A path that exists but may not be looked at or read; the message names the path."""


def _name(lookup: Any, number: int) -> str:
    try:
        return str(lookup(number)[0])
    except KeyError:
        return ""


def stat_entry(path: str, st: os.stat_result) -> dict[str, Any]:
    """What ansible.builtin.stat and ansible.builtin.find both say of a path from its lstat (the fields the
    roles compare): the stat reads here and each file a find returns (path_finds.py)."""
    return {
        "path": path,
        "isreg": stat.S_ISREG(st.st_mode),
        "isdir": stat.S_ISDIR(st.st_mode),
        "islnk": stat.S_ISLNK(st.st_mode),
        "mode": f"{stat.S_IMODE(st.st_mode):04o}",
        "uid": st.st_uid,
        "gid": st.st_gid,
        "pw_name": _name(pwd.getpwuid, st.st_uid),
        "gr_name": _name(grp.getgrgid, st.st_gid),
        "size": st.st_size,
        "mtime": st.st_mtime,
    }


def stat_of(path: str) -> dict[str, Any]:
    """The path's stat, not following a link at the path (stat's default)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return {"exists": False}
    except OSError as exc:
        raise PathReadError(f"cannot look at {path}: {exc.strerror}") from exc
    found: dict[str, Any] = {
        "exists": True,
        **stat_entry(path, st),
        "readable": os.access(path, os.R_OK),
        "executable": os.access(path, os.X_OK),
    }
    if found["islnk"]:
        found["lnk_target"] = os.readlink(path)
    if found["isreg"] and found["readable"]:
        try:
            found["checksum"] = sha1_of(path)
        except OSError as exc:
            raise PathReadError(f"cannot read {path}: {exc.strerror}") from exc
    return found


def sha1_of(path: str) -> str:
    """The SHA-1 of the file's content (ansible.builtin.stat's checksum); OSError where it cannot be read."""
    return digest_of(path, "sha1")


def digest_of(path: str, algorithm: str) -> str:
    """The hex digest (hashlib's ALGORITHM) of the file's content, read in chunks; OSError where it cannot
    be read."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as content:
        for chunk in iter(lambda: content.read(CHUNK_SIZE), b""):
            digest.update(chunk)
    return digest.hexdigest()


def slurp_of(path: str) -> dict[str, Any]:
    """The file's content in base64 as slurp returns it; {} where nothing is at the path."""
    try:
        with open(path, "rb") as content:
            data = content.read()
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except OSError as exc:
        raise PathReadError(f"cannot read {path}: {exc.strerror}") from exc
    return {"content": base64.b64encode(data).decode("ascii"), "encoding": "base64", "source": path}


def reads(stat_paths: list[str], slurp_paths: list[str]) -> dict[str, dict[str, Any]]:
    """What the module returns for its ``stat`` and ``slurp`` options: each path's answer, by path."""
    return {
        "stat": {path: stat_of(path) for path in stat_paths},
        "slurp": {path: slurp_of(path) for path in slurp_paths},
    }
