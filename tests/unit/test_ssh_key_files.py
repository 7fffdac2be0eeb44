"""plugins/filter/ssh_key_files.py: the shared verdicts on authorized_keys and known_hosts, held to the real
modules they stand for, ansible.posix.authorized_key (exclusive, present) and ansible.builtin.known_hosts
(present, with the real ssh-keygen), over files' content as the roles' reads answer it (files_in_place's
slurp: base64). A file called in place is one the module leaves as it is; where the module would write, the
verdict is never in place. The filters run on the controller, and so does this test (not a node-side one:
scripts/node-python.py). The roles' own use of them (the values they pass, their gates):
test_model_sync_reads.py, test_control_plane_roles.py (etcd_backup)."""

from __future__ import annotations

import base64
import importlib.util
import os
import subprocess
from pathlib import Path
from typing import Any

import ansible.modules.known_hosts as real_known_hosts
import pytest
from ansible_collections.ansible.posix.plugins.modules import authorized_key as real_authorized_key
from conftest import run_module

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("ssh_key_files", ROOT / "plugins/filter/ssh_key_files.py")
assert _SPEC and _SPEC.loader
ssh_key_files = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ssh_key_files)

# model_sync's options (rrsync into the staging area, from the source node) and etcd_backup's (rrsync with
# -no-del into this control plane's directory)
SYNC_OPTIONS = 'restrict,from="10.89.42.11",command="/usr/local/bin/rrsync -wo /models/.incoming"'
COPY_OPTIONS = (
    'restrict,from="10.89.42.11",command="/usr/bin/rrsync -wo -no-del /srv/etcd-backups/gpu-node-1"'
)


def content(path: Path) -> str:
    """The file's content as the roles' read answers it (files_in_place's slurp: base64 of its bytes) and as
    the roles pass it on (`| default('')` for a missing file, where the read answers nothing)."""
    return base64.b64encode(path.read_bytes()).decode() if path.exists() else ""


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Real public keys, `<type> <key>`: three ed25519 ones, an ECDSA one."""
    folder = tmp_path_factory.mktemp("keys")
    found = {}
    for name, kind in (("a", "ed25519"), ("b", "ed25519"), ("c", "ed25519"), ("ecdsa", "ecdsa")):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "", "-f", str(folder / name)], check=True
        )
        found[name] = " ".join((folder / f"{name}.pub").read_text().split()[:2])
    return found


# ------------------------------------------------------------------ authorized_keys


def authorized_key(path: Path, key: str, options: str | None, check_mode: bool = True) -> tuple[bool, str]:
    """The real module as the roles' tasks run it (exclusive, present, manage_dir) on PATH, as root: whether
    it changes the file, and what it writes (in check mode: would write)."""
    args: dict[str, Any] = {
        "user": "root",
        "path": str(path),
        "key": key,
        "exclusive": True,
        "manage_dir": True,
    }
    if options is not None:
        args["key_options"] = options
    failed, result = run_module(real_authorized_key, args, check_mode=check_mode, diff=True)
    assert not failed, result["msg"]
    return bool(result.get("changed")), result.get("diff", {}).get("after", "")


def wanted(keys: dict[str, str], name: str) -> tuple[str, str | None]:
    """The roles' keys and options: model_sync's and etcd_backup's key (with and without a comment) with its
    options; and keys as an operator account's task gives them (common_ops_users: one, several, none, one with
    options of its own), without."""
    return {
        "sync": (keys["a"], SYNC_OPTIONS),
        "sync-commented": (keys["a"] + " modelsync@gpu-node-1 model weights sync", SYNC_OPTIONS),
        "copy": (keys["a"], COPY_OPTIONS),
        "operator": (keys["a"] + " ops@laptop", None),
        "operators": ("\n".join([keys["a"] + " ops@laptop", keys["b"], keys["ecdsa"] + " on-call"]), None),
        "operators-blank-line": ("\n".join([keys["a"], "", "# the on-call laptop", keys["b"]]), None),
        "no-operator-key": ("", None),
        "key-with-own-options": ('no-pty,from="10.0.0.0/8" ' + keys["a"] + " ops", None),
        "option-twice": (keys["a"], 'from="10.0.0.1",from="10.0.0.2"'),
        "escaped-hash": (keys["a"] + r" ops \#1", None),
    }[name]


WANTED = [
    "sync",
    "sync-commented",
    "copy",
    "operator",
    "operators",
    "operators-blank-line",
    "no-operator-key",
    "key-with-own-options",
    "option-twice",
    "escaped-hash",
]


@pytest.mark.parametrize("name", WANTED)
def test_what_the_module_writes_is_in_place_and_the_module_then_leaves_it(
    tmp_path: Path, keys: dict[str, str], name: str
) -> None:
    key, options = wanted(keys, name)
    path = tmp_path / ".ssh/authorized_keys"
    changed, written = authorized_key(path, key, options)
    assert changed is bool(key), "a missing file: the module adds the keys (and has none to add without any)"
    assert ssh_key_files.authorized_keys_in_place(content(path), key, options) is not bool(key)
    path.parent.mkdir(exist_ok=True)
    path.write_text(written)
    assert ssh_key_files.authorized_keys_in_place(content(path), key, options) is True
    assert authorized_key(path, key, options) == (False, "")


def test_the_module_really_writes_those_bytes(tmp_path: Path, keys: dict[str, str]) -> None:
    """Not only its check mode's diff: the file it writes (its owner made root's: as root only)."""
    if os.geteuid() != 0:
        pytest.skip("authorized_key sets the file's owner: run as root")
    key, options = wanted(keys, "operators")
    path = tmp_path / ".ssh/authorized_keys"
    assert authorized_key(path, key, options, check_mode=False)[0] is True
    assert ssh_key_files.authorized_keys_in_place(content(path), key, options) is True
    assert authorized_key(path, key, options, check_mode=False)[0] is False


def drifts(written: str, keys: dict[str, str]) -> dict[str, str]:
    """Other files than WRITTEN: each is never in place (the module may or may not rewrite it)."""
    lines = written.splitlines(True)
    return {
        "empty": "",
        "a-comment-first": "# added by hand\n" + written,
        "a-blank-line-more": written + "\n",
        "another-key-more": written + keys["c"] + " \n",
        "one-key-less": "".join(lines[1:]),
        "keys-reordered": "".join(lines[::-1]),
        "no-final-line-break": written.rstrip("\n"),
        "no-trailing-space": written.replace(" \n", "\n"),
        "crlf": written.replace("\n", "\r\n"),
        "another-key": written.replace(keys["a"].split()[1], keys["c"].split()[1]),
        "no-options": written.replace("restrict,", ""),
        "other-source-address": written.replace("10.89.42.11", "10.89.42.21"),
        "tab-for-space": written.replace(" ", "\t", 1),
    }


@pytest.mark.parametrize("name", ["sync", "copy", "operators"])
def test_anything_else_in_the_file_is_not_in_place(tmp_path: Path, keys: dict[str, str], name: str) -> None:
    key, options = wanted(keys, name)
    path = tmp_path / "authorized_keys"
    written = authorized_key(path, key, options)[1]
    for drift, text in drifts(written, keys).items():
        if text == written:
            continue  # a drift this case has no part for (no options to drop, one key only)
        path.write_bytes(text.encode())
        assert ssh_key_files.authorized_keys_in_place(content(path), key, options) is False, drift
        if drift in ("empty", "a-comment-first", "a-blank-line-more", "another-key-more", "another-key"):
            assert authorized_key(path, key, options)[0] is True, drift  # and the module does write
    path.unlink()
    assert ssh_key_files.authorized_keys_in_place(content(path), key, options) is False


@pytest.mark.parametrize(
    "options",
    [
        'restrict,command="/opt/rr  sync -wo /models/.incoming"',  # two spaces: the module reads back one
        'restrict,command="/usr/bin/rrsync\t-wo /models/.incoming"',  # a tab: read back as a space
        'restrict,command="/usr/bin/rrsync ssh-ed25519 /models"',  # a key type: its parse starts there
    ],
    ids=["two-spaces", "tab", "key-type"],
)
def test_options_the_module_reads_back_otherwise_are_never_in_place(
    tmp_path: Path, keys: dict[str, str], options: str
) -> None:
    """The module rewrites its own line every run there (it never matches the key): the task runs, as it
    would change the file."""
    path = tmp_path / "authorized_keys"
    written = authorized_key(path, keys["a"], options)[1]
    path.write_text(written)
    assert ssh_key_files.authorized_keys_in_place(content(path), keys["a"], options) is False
    assert authorized_key(path, keys["a"], options)[0] is True


@pytest.mark.parametrize(
    ("key", "options"),
    [
        ("not-a-type AAAA", None),  # the module fails: invalid key
        ("ssh-ed25519", None),  # a type without a key
        ("https://keys.example/ops.keys", None),  # fetched by the module
        ("file:///etc/ops.keys", None),  # read by the module
        ("{a}\n{a} again", None),  # the same key twice
        (None, None),
        ("{a}", 42),
    ],
    ids=["no-type", "type-only", "url", "file", "twice", "no-key", "options-not-text"],
)
def test_a_key_this_cannot_be_sure_of_is_never_in_place(keys: dict[str, str], key: Any, options: Any) -> None:
    key = key.format(**keys) if isinstance(key, str) else key
    for found in ("", base64.b64encode(f"{key} \n".encode()).decode() if key else ""):
        assert ssh_key_files.authorized_keys_in_place(found, key, options) is False


@pytest.mark.parametrize("found", [None, "not base64!", base64.b64encode(b"\xff\xfe").decode()])
def test_content_that_is_not_base64_text_is_never_in_place(found: Any) -> None:
    assert ssh_key_files.authorized_keys_in_place(found, "", None) is False


# ------------------------------------------------------------------ known_hosts


def known_hosts_changes(path: Path, name: str, key: str) -> tuple[bool, str]:
    """The real module as the roles' tasks run it (present, hash_host false), in check mode: whether it
    changes PATH, and what it would write."""
    failed, result = run_module(
        real_known_hosts,
        {"path": str(path), "name": name, "key": key, "state": "present"},
        check_mode=True,
        diff=True,
    )
    assert not failed, result["msg"]
    return bool(result["changed"]), result["diff"]["after"]


NODE = "10.89.42.12"
KNOWN_HOSTS = {
    "the-line": ("{wanted}\n", True),
    "the-line-twice": ("{wanted}\n{wanted}\n", True),
    "among-others": ("10.89.42.13 ssh-ed25519 {b}\n{wanted}\n10.89.42.14 ssh-ed25519 {b}\n", True),
    "ecdsa-line-first": ("10.89.42.12 ecdsa-sha2-nistp256 {ecdsa}\n{wanted}\n", True),
    "with-a-comment": ("# the nodes\n\n{wanted} root@gpu-node-2\n", True),
    "no-final-line-break": ("{wanted}", True),
    "missing": (None, False),
    "empty": ("", False),
    "other-host": ("10.89.42.13 ssh-ed25519 {a}\n", False),
    "other-key": ("10.89.42.12 ssh-ed25519 {b}\n", False),
    "stale-key-first": ("10.89.42.12 ssh-ed25519 {b}\n{wanted}\n", False),
    "listed-with-a-name": ("10.89.42.12,gpu-node-2 ssh-ed25519 {a}\n", False),
    "name-list-first": ("gpu-node-2,10.89.42.12 ssh-ed25519 {b}\n{wanted}\n", False),
    "pattern-first": ("10.89.42.* ssh-ed25519 {b}\n{wanted}\n", False),
    "marker-first": ("@revoked 10.89.42.12 ssh-ed25519 {b}\n{wanted}\n", False),
    "not-utf8": ("# \udcff\n{wanted}\n", False),
}


@pytest.mark.parametrize("name", list(KNOWN_HOSTS))
def test_a_known_host_is_in_place_only_where_the_module_changes_nothing(
    tmp_path: Path, keys: dict[str, str], name: str
) -> None:
    host_key = f"{NODE} {keys['a']}"
    text, in_place = KNOWN_HOSTS[name]
    path = tmp_path / "known_hosts"
    if text is not None:
        path.write_bytes(text.format(wanted=host_key, **keys).encode("utf-8", "surrogateescape"))
    verdict = ssh_key_files.known_hosts_in_place(content(path), NODE, host_key)
    assert verdict is in_place
    if verdict:
        assert known_hosts_changes(path, NODE, host_key)[0] is False
    elif name not in ("pattern-first", "marker-first", "not-utf8"):
        # plain files: "differs" is where the module changes the file too (nothing run for nothing)
        assert known_hosts_changes(path, NODE, host_key)[0] is True


def test_what_the_module_adds_is_in_place(tmp_path: Path, keys: dict[str, str]) -> None:
    host_key = f"{NODE} {keys['a']}"
    path = tmp_path / "known_hosts"
    changed, written = known_hosts_changes(path, NODE, host_key)
    assert changed and written == host_key + "\n"
    path.write_text(written)
    assert ssh_key_files.known_hosts_in_place(content(path), NODE, host_key) is True
    # a name the key's host field does not hold: the module refuses it; never in place
    assert ssh_key_files.known_hosts_in_place(content(path), "10.89.42.13", host_key) is False


@pytest.mark.parametrize(
    ("name", "key"),
    [(NODE, "ssh-ed25519 AAAA"), (NODE, f"{NODE} ssh-ed25519 AAAA more"), (None, f"{NODE} ssh-ed25519 AAAA")],
    ids=["two-fields", "four-fields", "no-name"],
)
def test_a_host_key_this_cannot_be_sure_of_is_never_in_place(name: Any, key: str) -> None:
    found = base64.b64encode(f"{key}\n".encode()).decode()
    assert ssh_key_files.known_hosts_in_place(found, name, key) is False
