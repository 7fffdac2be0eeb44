"""Verdicts of the model_sync role on what its one read (tasks/prepare-nodes.yml, files_in_place) found, for
tasks whose module runs whole to decide that it changes nothing: each verdict is "in place" only where that
task would change nothing, so the task runs everywhere else and decides there. Run on the controller; kept in
Python so the unit tests hold each verdict to the module it stands for (tests/unit/test_model_sync_reads.py).

- ``gunzipped_sha1``: the SHA-1 of what community.general.decompress writes from a gzip file (rrsync's
  documentation copy, a few KiB, slurped by the read), compared with stat's checksum of the installed copy.
  Jinja has no gzip, and its b64decode gives text.
- ``known_host_in_place``: ansible.builtin.known_hosts (state present, hash_host false) finds the key in the
  known_hosts file the read slurped, and changes nothing.
- ``authorized_keys_in_place``: authorized_keys is exactly what ansible.posix.authorized_key (exclusive)
  writes for one key with its options, compared by SHA-1 (stat's checksum).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import io
import re
import shlex
import zlib
from collections.abc import Mapping
from typing import Any

# How ssh-keygen -F matches a host field holding a pattern, a negation or a [host]:port, and what it does with
# a marker (@cert-authority, @revoked) or a hashed host (|1|), is not taken on here: such a line before the
# answer makes the verdict "differs", and the module decides.
NOT_PLAIN_HOST = frozenset("*?![]")
# authorized_key's split of key_options at the commas outside quotes (parseoptions).
OPTIONS_SPLIT = re.compile(r"""((?:[^,"']|"[^"]*"|'[^']*')+)""")
# The key types authorized_key takes (parsekey's VALID_SSH2_KEY_TYPES).
SSH_KEY_TYPES = frozenset(
    {
        "sk-ecdsa-sha2-nistp256@openssh.com",
        "sk-ecdsa-sha2-nistp256-cert-v01@openssh.com",
        "webauthn-sk-ecdsa-sha2-nistp256@openssh.com",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp256-cert-v01@openssh.com",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp384-cert-v01@openssh.com",
        "ecdsa-sha2-nistp521",
        "ecdsa-sha2-nistp521-cert-v01@openssh.com",
        "sk-ssh-ed25519@openssh.com",
        "sk-ssh-ed25519-cert-v01@openssh.com",
        "ssh-ed25519",
        "ssh-ed25519-cert-v01@openssh.com",
        "ssh-dss",
        "ssh-rsa",
        "ssh-xmss@openssh.com",
        "ssh-xmss-cert-v01@openssh.com",
        "rsa-sha2-256",
        "rsa-sha2-512",
        "ssh-rsa-cert-v01@openssh.com",
        "rsa-sha2-256-cert-v01@openssh.com",
        "rsa-sha2-512-cert-v01@openssh.com",
        "ssh-dss-cert-v01@openssh.com",
    }
)


def _decoded(content: str) -> bytes | None:
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError, TypeError):
        return None


def gunzipped_sha1(content: Any) -> str:
    """The SHA-1 (hex) of the decompressed content of CONTENT, a gzip file in base64 (slurp's answer), read as
    community.general.decompress reads it (gzip.open); '' where CONTENT is empty or not base64 gzip, which
    equals no checksum."""
    if not isinstance(content, str) or not content:
        return ""
    data = _decoded(content)
    if not data:
        return ""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as unpacked:
            return hashlib.sha1(unpacked.read()).hexdigest()
    except (OSError, EOFError, zlib.error):
        return ""


def known_host_in_place(content: Any, name: str, key: str) -> bool:
    """True where ansible.builtin.known_hosts with NAME and KEY (``<host> <type> <key>``), state present and
    hash_host false, changes nothing in the known_hosts file whose content is CONTENT (base64; '' for a
    missing file).

    The module asks ``ssh-keygen -F <name lowercased>`` for the file's lines of that host, in file order, and
    stops at the first that equals KEY (host field, type and key: no change) or has KEY's type with another
    host field or key (it replaces that line); lines of other types go on. Here a line is of the host where a
    name of its comma-separated host field is NAME, case aside, as ssh-keygen matches a plain name. A line
    reached first that ssh-keygen may match otherwise (a pattern, a hashed host, a marker, fewer than three
    fields), or content that is not UTF-8 text, gives False: the module then decides."""
    if not isinstance(content, str) or not content:
        return False
    data = _decoded(content)
    if data is None:
        return False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    wanted = key.split()
    if len(wanted) != 3:
        return False
    host = name.lower()
    for line in text.split("\n"):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < 3 or fields[0].startswith(("@", "|")) or NOT_PLAIN_HOST & set(fields[0]):
            return False
        if host not in (listed.lower() for listed in fields[0].split(",")):
            continue
        if fields[:3] == wanted:
            return True
        if fields[1] == wanted[1]:
            return False
    return False


def _authorized_keys_line(key: str, key_options: str) -> str:
    """The line authorized_key (exclusive, one key) writes for KEY (``<type> <key> [comment]``, no options)
    with KEY_OPTIONS: its parsekey (shlex split, without quotes or comments), parseoptions and serialize;
    '' where this is not sure (options in KEY, an option given twice)."""
    lex = shlex.shlex(key.replace(r"\#", "#"))
    lex.quotes = []  # type: ignore[assignment]
    lex.commenters = ""
    lex.whitespace_split = True
    parts = list(lex)
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        return ""
    options: list[str] = []
    names: set[str] = set()
    for part in OPTIONS_SPLIT.split(key_options)[1:-1] if key_options else []:
        if part == ",":
            continue
        name = part.split("=", 1)[0]
        if name in names:
            return ""
        names.add(name)
        options.append(part)
    prefix = ",".join(options) + " " if options else ""
    return f"{prefix}{parts[0]} {parts[1]} {' '.join(parts[2:])}\n"


def authorized_keys_in_place(found: Any, key: str, key_options: str) -> bool:
    """True where FOUND, stat's answer for the authorized_keys file, is a regular file holding exactly what
    ansible.posix.authorized_key with KEY, KEY_OPTIONS and exclusive: true writes (its one line), by its
    SHA-1: that task would change nothing (it rewrites the file only where the keys it parses differ, and
    parses its own line back to the same key)."""
    line = _authorized_keys_line(key, key_options)
    if not line or not isinstance(found, Mapping) or not found.get("isreg"):
        return False
    return found.get("checksum") == hashlib.sha1(line.encode("utf-8")).hexdigest()


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "gunzipped_sha1": gunzipped_sha1,
            "known_host_in_place": known_host_in_place,
            "authorized_keys_in_place": authorized_keys_in_place,
        }
