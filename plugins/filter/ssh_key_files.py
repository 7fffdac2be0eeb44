"""Whether an SSH task would change an OpenSSH file, from the file's content as a role's read found it
(files_in_place's ``slurp``: base64, nothing for a missing file), so that the task runs only where it would.
ansible.posix.authorized_key and ansible.builtin.known_hosts read and parse the whole file each time they run,
even to change nothing.

One home for the rule (docs/CONTRACTS.md, "Roles"): roles model_sync and etcd_backup gate their
tasks on these; found through ``filter_plugins`` in ansible.cfg. Each verdict is conservative: True ("in
place") only where the module would change nothing, False wherever this cannot be sure, and the task then runs
and decides. tests/unit/test_ssh_key_files.py holds them to the real modules.

- ``authorized_keys_in_place(content, key, key_options=None)``: ansible.posix.authorized_key with KEY (one or
  more keys, a line each, as the module splits them), KEY_OPTIONS, ``exclusive: true`` and ``state:
  present`` (no ``comment``) finds exactly its keys in the file, and nothing else, and writes nothing.
- ``known_hosts_in_place(content, name, key)``: ansible.builtin.known_hosts with NAME and KEY (``<host> <type>
  <key>``), ``state: present`` and ``hash_host: false`` finds the key for that host in the file, and writes
  nothing.
"""

from __future__ import annotations

import base64
import binascii
import re
import shlex
from typing import Any, NamedTuple

# authorized_key's split of options at the commas outside quotes (its parseoptions).
_OPTIONS_SPLIT = re.compile(r"""((?:[^,"']|"[^"]*"|'[^']*')+)""")
# The key types authorized_key takes (its parsekey's VALID_SSH2_KEY_TYPES).
_SSH_KEY_TYPES = frozenset(
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
# How ssh-keygen -F matches a host field holding a pattern, a negation or a [host]:port, and what it does with
# a marker (@cert-authority, @revoked) or a hashed host (|1|), is not taken on here: such a line before the
# answer makes the verdict "differs", and the module decides.
_NOT_PLAIN_HOST = frozenset("*?![]")


def _text(content: Any) -> str | None:
    """The file's text from CONTENT, slurp's base64 ('' for a missing file: what both modules read there);
    None where it is not base64 of UTF-8 text."""
    if not isinstance(content, str):
        return None
    try:
        return base64.b64decode(content, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


# ------------------------------------------------------------------ authorized_keys


class _Key(NamedTuple):
    """A key as authorized_key's parsekey reads a line: what its exclusive, present run compares (all but the
    rank). Options are in their order, each (name, value or None)."""

    blob: str
    kind: str
    options: tuple[tuple[str, str | None], ...]
    comment: str


def _parsed_options(options: str | None) -> tuple[tuple[str, str | None], ...]:
    """authorized_key's parseoptions, in order (it keeps an option given twice twice)."""
    parsed: list[tuple[str, str | None]] = []
    for part in _OPTIONS_SPLIT.split(options)[1:-1] if options else []:
        if "=" in part:
            name, value = part.split("=", 1)
            parsed.append((name, value))
        elif part != ",":
            parsed.append((part, None))
    return tuple(parsed)


def _parsed_key(line: str) -> _Key | None:
    """authorized_key's parsekey of LINE; None where it finds no key (a comment, no known type, no key after
    the type: lines the module keeps as they are, fails on, or cannot read)."""
    lex = shlex.shlex(line.replace(r"\#", "#"))
    lex.quotes = []  # type: ignore[assignment]
    lex.commenters = ""
    lex.whitespace_split = True
    parts = list(lex)
    if not parts or parts[0] == "#":
        return None
    kind_at = next((index for index, part in enumerate(parts) if part in _SSH_KEY_TYPES), None)
    if kind_at is None or len(parts) < kind_at + 2:
        return None
    options = _parsed_options(" ".join(parts[:kind_at])) if kind_at else ()
    return _Key(parts[kind_at + 1], parts[kind_at], options, " ".join(parts[kind_at + 2 :]))


def _serialized(key: _Key) -> str:
    """The line authorized_key's serialize writes for KEY."""
    options = ",".join(name if value is None else f"{name}={value}" for name, value in key.options)
    return f"{options + ' ' if options else ''}{key.kind} {key.blob} {key.comment}\n"


def _wanted_keys(key: str, key_options: str | None) -> list[_Key] | None:
    """The keys the task wants, in its order, as the module reads its KEY and KEY_OPTIONS; None where this is
    not sure: a key fetched from a URL or a file, a line that is not a key (the module fails), a key given
    twice."""
    if key.startswith(("http", "file")):
        return None
    wanted: list[_Key] = []
    for line in key.splitlines():
        if not line or line.startswith("#"):
            continue
        parsed = _parsed_key(line)
        if parsed is None:
            return None
        if key_options is not None:
            parsed = parsed._replace(options=_parsed_options(key_options))
        wanted.append(parsed)
    if len({parsed.blob for parsed in wanted}) != len(wanted):
        return None
    return wanted


def authorized_keys_in_place(content: Any, key: Any, key_options: Any = None) -> bool:
    """True where ansible.posix.authorized_key with KEY, KEY_OPTIONS (None: the keys' own), ``exclusive:
    true`` and ``state: present`` changes nothing in the authorized_keys file whose content is CONTENT
    (slurp's base64; '' for a missing file, which the module reads as empty).

    The module parses the file's lines into keys and rewrites it where one of its keys is missing or parsed
    otherwise (type, options, comment) or where any other line is there. Here the file must hold exactly what
    the module writes, its lines in the task's order, each read back by the module's own parse as the key it
    was written for (options holding whitespace other than single spaces, or a key type, do not read back:
    the module would rewrite them every run). Anything else, a line break other than \\n included (the module
    reads the file with universal newlines), is False: the task runs and decides. No key: an empty file."""
    if not isinstance(key, str) or not (key_options is None or isinstance(key_options, str)):
        return False
    text = _text(content)
    wanted = _wanted_keys(key, key_options)
    if text is None or wanted is None or "\r" in text:
        return False
    if text != "".join(_serialized(parsed) for parsed in wanted):
        return False
    # as parsekeys reads the file: its lines, keys kept, each parsed alone
    return [_parsed_key(line) for line in text.splitlines(True)] == wanted


# ------------------------------------------------------------------ known_hosts


def known_hosts_in_place(content: Any, name: Any, key: Any) -> bool:
    """True where ansible.builtin.known_hosts with NAME and KEY (``<host> <type> <key>``), ``state: present``
    and ``hash_host: false`` changes nothing in the known_hosts file whose content is CONTENT (slurp's base64;
    '' for a missing file).

    The module asks ``ssh-keygen -F <name lowercased>`` for the file's lines of that host, in file order, and
    stops at the first that equals KEY (host field, type and key: no change) or has KEY's type with another
    host field or key (it replaces that line); lines of other types go on. Here a line is of the host where a
    name of its comma-separated host field is NAME, case aside, as ssh-keygen matches a plain name. A line
    reached first that ssh-keygen may match otherwise (a pattern, a hashed host, a marker, fewer than three
    fields), or content that is not UTF-8 text, gives False: the module then decides."""
    if not isinstance(name, str) or not isinstance(key, str):
        return False
    text = _text(content)
    wanted = key.split()
    if not text or len(wanted) != 3:
        return False
    host = name.lower()
    for line in text.split("\n"):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < 3 or fields[0].startswith(("@", "|")) or _NOT_PLAIN_HOST & set(fields[0]):
            return False
        if host not in (listed.lower() for listed in fields[0].split(",")):
            continue
        if fields[:3] == wanted:
            return True
        if fields[1] == wanted[1]:
            return False
    return False


class FilterModule:
    """authorized_keys_in_place, known_hosts_in_place."""

    def filters(self) -> dict[str, Any]:
        return {
            "authorized_keys_in_place": authorized_keys_in_place,
            "known_hosts_in_place": known_hosts_in_place,
        }
