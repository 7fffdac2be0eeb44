"""files_in_place's `find` (module_utils/path_finds.py), held to the real ansible.builtin.find: both modules
run on the same trees with the same options, for each combination of options the roles use (kubernetes_node's
three finds, containerd's two, gpu_health_agent's one, rendered from the roles' own variables) and around them
(hidden names and directories, links to files and directories, dangling links, a FIFO, names that do not
match, depth, a missing path, a path that is a file, lines with other line breaks, a file that is not UTF-8,
an entry or a directory that may not be looked at). They must find the same entries in the same order, each
field files_in_place returns equal to find's, and count and skip the same.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ansible.modules.find as real_find
import files_in_place
import pytest
import yaml
from ansible.module_utils.common import warnings as ansible_warnings
from conftest import run_module
from role_render import ROOT, RoleVars

FIELDS = ("path", "isreg", "isdir", "islnk", "mode", "uid", "gid", "pw_name", "gr_name", "size", "mtime",
          "ctime", "checksum")  # fmt: skip
MODULE_LINE = "(?: *(?:overlay|br_netfilter) *|options (?:overlay|br_netfilter) \\w+=\\S+ *)(?:[#;].*)?$"


def builtin_find(args: dict[str, Any]) -> dict[str, Any]:
    failed, result = run_module(real_find, args)
    assert not failed, result
    return result


def ours(args: dict[str, Any], name: str = "it") -> dict[str, Any]:
    ansible_warnings._global_warnings.clear()  # the builtin's, run before in the same process
    failed, result = run_module(files_in_place, {"find": [{"name": name, **args}]})
    assert not failed, result["msg"]
    assert result["changed"] is False and result["checked"] == 0 and result["in_place"] is True
    assert result["warnings"] == []  # find's warnings about skipped paths are not repeated
    return result["found"][name]


def assert_finds_as_the_builtin(args: dict[str, Any]) -> dict[str, Any]:
    """Both modules over the same tree: the same entries in the same order, every field ours returns equal to
    find's (and none of those find returns left out), the same counts and skipped paths. Ours, returned."""
    theirs, found = builtin_find(args), ours(args)
    assert [f["path"] for f in found["files"]] == [f["path"] for f in theirs["files"]]
    for mine, its in zip(found["files"], theirs["files"], strict=True):
        assert set(mine) <= set(FIELDS), mine["path"]
        assert mine == {field: its[field] for field in mine}, mine["path"]
        assert {field for field in FIELDS if field in its} == set(mine), mine["path"]
    assert found["matched"] == theirs["matched"]
    assert found["examined"] == theirs["examined"]
    assert found["skipped_paths"] == theirs["skipped_paths"]
    return found


def write(path: Path, text: str | bytes = "x\n", mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A directory with what a role's find meets: files that match and files that do not, hidden names, a
    hidden directory with files in it, directories three deep, links to a file, to a directory and to nothing,
    and a FIFO."""
    root = tmp_path / "tree"
    write(root / "config.toml", "version = 3\n")
    write(root / "old.toml.dpkg-old", "version = 2\n")
    write(root / ".hidden.toml", "x = 1\n", mode=0o600)
    write(root / "notes.txt", "")
    write(root / "conf.d" / "99-nvidia.toml", "[plugins]\n", mode=0o640)
    write(root / "conf.d" / "deep" / "a.toml", "a\n")
    write(root / "conf.d" / "deep" / "deeper" / "b.toml", "b\n")
    write(root / ".registry" / "hosts.toml", "server = 'x'\n")
    write(root / ".registry" / ".managed-by-ansible-role-containerd", "# mark\n")
    (root / "empty").mkdir(mode=0o700)
    (root / "link-to-file.toml").symlink_to(root / "config.toml")
    (root / "link-to-dir").symlink_to(root / "conf.d")
    (root / "dangling.toml").symlink_to(root / "nothing")
    os.mkfifo(root / "fifo.toml")
    return root


OPTION_SETS = {
    "defaults": {},
    "globs": {"patterns": ["*.toml"]},
    "two globs, one a name": {"patterns": ["config.toml", "*.txt"]},
    "glob with a class": {"patterns": ["[a-c]*"]},
    "checksums": {"get_checksum": True},
    "links": {"file_type": "link"},
    "directories": {"file_type": "directory"},
    "directories, recursive": {"file_type": "directory", "recurse": True},
    "any": {"file_type": "any", "get_checksum": True},
    "any, hidden": {"file_type": "any", "hidden": True, "get_checksum": True},
    "any, recursive (gpu_health_agent)": {"file_type": "any", "recurse": True, "get_checksum": True},
    "any, hidden, recursive, depth 2 (containerd's registry)": {
        "file_type": "any", "hidden": True, "recurse": True, "depth": 2, "get_checksum": True,
    },
    "depth 1": {"file_type": "any", "recurse": True, "depth": 1},
    "depth 3, hidden": {"file_type": "any", "recurse": True, "depth": 3, "hidden": True},
    "depth 0 is no limit": {"file_type": "any", "recurse": True, "depth": 0},
    "depth without recurse": {"file_type": "any", "depth": 2},
    "recursive globs, hidden directory walked into": {"patterns": ["*.toml"], "recurse": True},
    "recursive globs, hidden": {
        "patterns": ["*.toml"], "recurse": True, "hidden": True, "get_checksum": True,
    },
    "hidden links": {"file_type": "link", "hidden": True, "recurse": True},
}  # fmt: skip


@pytest.mark.parametrize("options", OPTION_SETS.values(), ids=OPTION_SETS.keys())
def test_finds_as_the_builtin_find_does(tree: Path, options: dict[str, Any]) -> None:
    assert_finds_as_the_builtin({"paths": [str(tree)], **options})


def test_the_trees_entries_are_found_where_the_builtin_finds_them(tree: Path) -> None:
    """What the comparisons above rest on, spelled out for the registry's find: hidden names found, links not
    followed (a link to a directory is an entry, not walked into), nothing below depth 2."""
    found = assert_finds_as_the_builtin(
        {"paths": [str(tree)], "file_type": "any", "hidden": True, "recurse": True, "depth": 2,
         "get_checksum": True}
    )  # fmt: skip
    by_path = {Path(f["path"]).relative_to(tree).as_posix(): f for f in found["files"]}
    assert ".registry/.managed-by-ansible-role-containerd" in by_path and ".hidden.toml" in by_path
    assert by_path["link-to-dir"]["islnk"] and not by_path["link-to-dir"]["isdir"]
    assert "link-to-dir/99-nvidia.toml" not in by_path
    assert "conf.d/deep" in by_path and "conf.d/deep/a.toml" not in by_path
    assert "checksum" in by_path["config.toml"] and "checksum" not in by_path["link-to-file.toml"]
    assert by_path["fifo.toml"]["isreg"] is False and found["matched"] == len(by_path)


@pytest.mark.parametrize(
    "paths",
    [["missing"], ["config.toml"], ["missing", "conf.d", "config.toml"], ["link-to-dir"], ["conf.d/"],
     ["conf.d", "conf.d"], ["dangling.toml"]],
    ids=["missing", "a file", "missing, a directory and a file", "a link to a directory", "a trailing slash",
         "twice", "a dangling link"],
)  # fmt: skip
def test_a_path_that_is_not_a_directory_is_skipped_as_the_builtin_skips_it(
    tree: Path, paths: list[str]
) -> None:
    for options in ({}, {"file_type": "any", "recurse": True, "depth": 2}):
        assert_finds_as_the_builtin({"paths": [str(tree / p) for p in paths], **options})
    found = ours({"paths": [str(tree / "missing")]})
    assert found == {
        "files": [],
        "matched": 0,
        "examined": 0,
        "skipped_paths": {str(tree / "missing"): f"'{tree / 'missing'}' is not a directory"},
    }


CONTAINS_LINES = {
    "match.conf": "overlay\n",
    "options.conf": "# site\noptions overlay redirect_dir=on\n",
    "commented.conf": "# overlay\n",
    "other.conf": "overlay2\nblacklist br_netfilter\n",
    "crlf.conf": "br_netfilter\r\n",
    "cr.conf": "x\roverlay\r",
    "no-newline.conf": "overlay",
    "empty.conf": "",
    ".hidden.conf": "overlay\n",
}


def test_contains_as_the_builtin_for_kubernetes_nodes_module_files(tmp_path: Path) -> None:
    """Line by line, re.match, text with universal newlines (a CRLF or CR line matches as its text), only
    regular files (a link to a matching file is not read), with checksums."""
    loads, options = tmp_path / "modules-load.d", tmp_path / "modprobe.d"
    for name, text in CONTAINS_LINES.items():
        write(loads / name, text)
    write(options / "site.conf", "options br_netfilter x=1 # site\n")
    (options / "link.conf").symlink_to(loads / "match.conf")
    (options / "subdir").mkdir()
    args = {"paths": [str(loads), str(options)], "contains": MODULE_LINE, "get_checksum": True}
    found = assert_finds_as_the_builtin(args)
    names = {Path(f["path"]).name for f in found["files"]}
    assert names == {"match.conf", "options.conf", "crlf.conf", "cr.conf", "no-newline.conf", "site.conf"}
    assert_finds_as_the_builtin({**args, "recurse": True, "hidden": True})
    # contains is find's for file_type file only: ignored with the others, as find ignores it
    assert_finds_as_the_builtin({**args, "file_type": "any"})


def test_a_file_that_is_not_text_ends_the_path_for_contains_as_the_builtin(tmp_path: Path) -> None:
    """find stops walking a path at a file it cannot decode looking for `contains`: skipped, with its message,
    and what it found there before kept (the order of the directory's listing decides which)."""
    first, second = tmp_path / "first", tmp_path / "second"
    write(first / "a.conf", "overlay\n")
    write(first / "latin1.conf", "caf\xe9\n".encode("latin-1"))
    write(first / "z.conf", "overlay\n")
    write(second / "b.conf", "br_netfilter\n")
    found = assert_finds_as_the_builtin({"paths": [str(first), str(second)], "contains": MODULE_LINE})
    assert list(found["skipped_paths"]) == [str(first)]
    assert "due to an encoding error" in found["skipped_paths"][str(first)]
    assert str(second / "b.conf") in [f["path"] for f in found["files"]]


def test_an_entry_that_may_not_be_looked_at_is_skipped_as_the_builtin_skips_it(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_lstat = os.lstat
    denied = str(tree / "config.toml")

    def lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if os.fspath(path) == denied:
            raise PermissionError(13, "Permission denied", denied)
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    theirs = builtin_find({"paths": [str(tree)]})
    found = ours({"paths": [str(tree)]})
    assert (
        found["skipped_paths"]
        == theirs["skipped_paths"]
        == {denied: f"[Errno 13] Permission denied: '{denied}'"}
    )
    assert [f["path"] for f in found["files"]] == [f["path"] for f in theirs["files"]]


def test_a_directory_that_may_not_be_listed_is_skipped_as_the_builtin_skips_it(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_scandir = os.scandir
    denied = str(tree / "conf.d" / "deep")

    def scandir(path: Any = ".") -> Any:
        if os.fspath(path) == denied:
            raise PermissionError(13, "Permission denied", denied)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    args = {"paths": [str(tree)], "file_type": "any", "recurse": True}
    found = assert_finds_as_the_builtin(args)
    assert list(found["skipped_paths"]) == [denied]
    # the top directory itself: find and ours skip it so too, with nothing found
    found = assert_finds_as_the_builtin({"paths": [denied], "file_type": "any"})
    assert found["files"] == [] and list(found["skipped_paths"]) == [denied]


def test_several_finds_in_one_call_each_under_its_name(tree: Path) -> None:
    failed, result = run_module(
        files_in_place,
        {"find": [{"name": "tomls", "paths": [str(tree)], "patterns": ["*.toml"]},
                  {"name": "links", "paths": [str(tree)], "file_type": "link"}]},
    )  # fmt: skip
    assert not failed, result["msg"]
    assert list(result["found"]) == ["tomls", "links"]
    tomls = builtin_find({"paths": [str(tree)], "patterns": ["*.toml"]})["files"]
    assert [f["path"] for f in result["found"]["tomls"]["files"]] == [f["path"] for f in tomls]
    assert {Path(f["path"]).name for f in result["found"]["links"]["files"]} == {
        "link-to-file.toml", "link-to-dir", "dangling.toml"
    }  # fmt: skip


def test_without_find_nothing_is_found() -> None:
    failed, result = run_module(files_in_place, {})
    assert not failed and result["found"] == {}


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (
            {"name": "x", "paths": ["etc/modprobe.d"]},
            "find[0].paths[0]: 'etc/modprobe.d' is not an absolute path",
        ),
        (
            {"name": "x", "paths": ["/etc"], "contains": "(unclosed"},
            "find[0].contains: '(unclosed' is not a regular",
        ),
        ({"name": "x", "paths": ["/etc"], "file_type": "socket"}, "file_type"),
        ({"name": "x", "paths": ["/etc"], "use_regex": True}, "use_regex"),
        ({"paths": ["/etc"]}, "name"),
    ],
    ids=["relative path", "bad regular expression", "file_type", "an option of find's not taken", "no name"],
)
def test_a_find_it_cannot_answer_as_the_builtin_is_refused(entry: dict[str, Any], says: str) -> None:
    failed, result = run_module(files_in_place, {"find": [entry]})
    assert failed and says in result["msg"], result["msg"]


def test_a_name_given_twice_names_both_finds() -> None:
    failed, result = run_module(
        files_in_place, {"find": [{"name": "a", "paths": ["/etc"]}, {"name": "a", "paths": ["/tmp"]}]}
    )
    assert failed and result["msg"] == "find[0].name and find[1].name both name a"


# ------------------------------------------------------------ the roles' own finds, rendered from their vars


def role_finds() -> dict[str, dict[str, Any]]:
    kubernetes = {f["name"]: f for f in RoleVars("kubernetes_node")["__kubernetes_node_finds"]}
    containerd = {f["name"]: f for f in RoleVars("containerd")["__containerd_finds"]}
    install_agent = yaml.safe_load((ROOT / "roles/gpu_health_agent/tasks/install-agent.yml").read_text())
    (agent_read,) = [task["files_in_place"] for task in install_agent if "files_in_place" in task]
    return {
        **{f"kubernetes_node {name}": find for name, find in kubernetes.items()},
        **{f"containerd {name}": find for name, find in containerd.items()},
        "gpu_health_agent code": RoleVars("gpu_health_agent").template(agent_read["find"][0]),
    }


def node_files(root: Path) -> None:
    """Under ROOT, a node's files as the roles' finds meet them, drift and strangers included."""
    for module in ("overlay", "br_netfilter", "ip_vs"):
        write(root / f"etc/modules-load.d/{module}.conf", f"{module}\n")
    write(root / "etc/modules-load.d/site.conf", "# nothing\n")
    write(root / "etc/modprobe.d/blacklist.conf", "blacklist nouveau\n")
    write(root / "etc/modprobe.d/nf.conf", "options nf_conntrack hashsize=1\n")
    (root / "etc/modprobe.d/link.conf").symlink_to(root / "etc/modprobe.d/nf.conf")
    write(root / "etc/sysctl.d/90-kubernetes.conf", "net.ipv4.ip_forward=1\n")
    write(root / "etc/sysctl.d/99-site.conf", "vm.swappiness=1\n")
    write(root / "proc/sys/net/ipv4/ip_forward", "1\n")
    write(root / "proc/sys/net/ipv4/ip_forward_use_pmtu", "0\n")
    # net/bridge not there: br_netfilter not loaded when the read runs
    write(root / "etc/containerd/config.toml", "version = 3\n")
    write(root / "etc/containerd/conf.d/99-nvidia.toml", "[plugins]\n")
    write(root / "etc/containerd/certs.d/quay.io/hosts.toml", "server = 'https://quay.io'\n")
    write(root / "etc/containerd/certs.d/quay.io/.managed-by-ansible-role-containerd", "# mark\n")
    write(root / "etc/containerd/certs.d/quay.io/ca.crt", "CA\n", mode=0o600)
    write(root / "etc/containerd/certs.d/site.example/hosts.toml", "server = 'https://site.example'\n")
    write(root / "etc/containerd/certs.d/site.example/sub/deeper.toml", "x\n")
    write(root / "opt/gpu-health-agent/lib/ansible/module_utils/gpu_health_agent.py", "# agent\n")
    write(root / "opt/gpu-health-agent/lib/ansible/module_utils/gpu_xid.py", "# xid\n", mode=0o600)
    write(root / "opt/gpu-health-agent/lib/ansible/module_utils/__pycache__/x.pyc", b"\x00\x01")


@pytest.mark.parametrize("which", list(role_finds()))
def test_each_roles_find_answers_as_the_builtin_find(tmp_path: Path, which: str) -> None:
    """Each find a role's read makes, with its options as the role renders them, over a node's files (its
    absolute paths moved under a scratch root)."""
    node_files(tmp_path)
    find = dict(role_finds()[which])
    find.pop("name")
    find["paths"] = [str(tmp_path) + path for path in find["paths"]]
    found = assert_finds_as_the_builtin(find)
    assert found["matched"] > 0
