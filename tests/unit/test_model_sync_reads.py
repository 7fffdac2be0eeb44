"""roles/model_sync reads once, in prepare-nodes.yml's files_in_place call, what its later tasks decide on,
and skips a task whose module runs whole to decide only where that task would change nothing. The role's own
verdict, roles/model_sync/filter_plugins/model_sync_reads.py, is held here to the real module it stands for:
community.general.decompress (rrsync from its documentation copy), on files read as the role reads them
(module_utils/path_reads.py, files_in_place's stat and slurp); the shared verdicts on known_hosts and
authorized_keys are held to theirs in test_ssh_key_files.py. Then the role's own expressions: the paths it
reads are the ones its tasks name, the SSH tasks' gates pass the shared verdicts the read's content, and
`current` is switched and pruned around as before. rrsync end to end: test_model_sync_rrsync.py."""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from ansible.module_utils.path_reads import slurp_of, stat_of
from ansible.plugins.loader import filter_loader, init_plugin_loader
from ansible.utils.collection_loader import AnsibleCollectionConfig
from ansible_collections.community.general.plugins.modules import decompress as decompress_module
from role_render import RoleVars

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles/model_sync"
PERL_RRSYNC = b"#!/usr/bin/perl\n# rrsync of rsync 3.2.3 (stand-in)\nprint 'ok';\n"
SYNC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeSyncKeyOfTheSourceNodeModelSync000000"
OPTIONS = 'restrict,from="10.89.42.11",command="/usr/local/bin/rrsync -wo /models/.incoming"'
NODE = "10.89.42.12"


def reads() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "model_sync_reads", ROLE / "filter_plugins/model_sync_reads.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


READS = reads()


def content(path: Path) -> str:
    return str(slurp_of(str(path)).get("content", ""))


# ------------------------------------------------------------------ rrsync's documentation copy, decompressed


def decompressed(gz: Path, dest: Path) -> bytes:
    """What community.general.decompress writes from GZ (its own function and handler)."""
    decompress_module.decompress(str(gz).encode(), str(dest).encode(), decompress_module.gzip_decompress)
    return dest.read_bytes()


@pytest.mark.parametrize(
    "packed",
    [
        gzip.compress(PERL_RRSYNC),
        gzip.compress(PERL_RRSYNC[:20]) + gzip.compress(PERL_RRSYNC[20:]),  # two members
        gzip.compress(PERL_RRSYNC) + b"\0" * 16,  # padded with zeroes
        gzip.compress(b""),
    ],
    ids=["one-member", "two-members", "zero-padded", "empty-script"],
)
def test_the_digest_is_that_of_what_decompress_writes(tmp_path: Path, packed: bytes) -> None:
    gz = tmp_path / "rrsync.gz"
    gz.write_bytes(packed)
    written = decompressed(gz, tmp_path / "rrsync")
    assert READS.gunzipped_sha1(content(gz)) == hashlib.sha1(written).hexdigest()
    assert stat_of(str(tmp_path / "rrsync"))["checksum"] == READS.gunzipped_sha1(content(gz))


@pytest.mark.parametrize("value", ["", None, "not base64!", base64.b64encode(b"not gzip").decode()])
def test_what_is_not_a_gzip_file_matches_no_checksum(value: Any) -> None:
    assert READS.gunzipped_sha1(value) == ""


def rrsync_in_place(tmp_path: Path, installed: bytes | None, mode: int = 0o755) -> bool:
    """__model_sync_rrsync_installed_in_place, rendered on the read of TMP_PATH's copies."""
    doc, dest = tmp_path / "rrsync.gz", tmp_path / "rrsync"
    doc.write_bytes(gzip.compress(PERL_RRSYNC))
    if installed is not None:
        dest.write_bytes(installed)
        dest.chmod(mode)
    found = {"stat": {str(p): stat_of(str(p)) for p in (doc, dest)}, "slurp": {str(doc): slurp_of(str(doc))}}
    role = role_vars(
        __model_sync_rrsync_doc_copy=str(doc),
        __model_sync_rrsync_installed=str(dest),
        __model_sync_rrsync_read=found,
        __model_sync_rrsync_look={"skipped": True, "changed": False},
    )
    return bool(role.when("__model_sync_rrsync_installed_in_place | bool"))


def test_the_installed_copy_is_in_place_only_as_decompress_leaves_it(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the installed copy is root's: run as root")
    assert rrsync_in_place(tmp_path, PERL_RRSYNC)
    assert not rrsync_in_place(tmp_path, PERL_RRSYNC + b"# edited\n")
    assert not rrsync_in_place(tmp_path, PERL_RRSYNC, mode=0o644)
    assert not rrsync_in_place(tmp_path, b"")
    (tmp_path / "rrsync").unlink()
    assert not rrsync_in_place(tmp_path, None)


# ------------------------------------------------------------------ the role's expressions


def role_vars(**overrides: Any) -> RoleVars:
    """The role's variables, with its own filters loaded as a play loads them (the shared ones of
    plugins/filter: role_render)."""
    if AnsibleCollectionConfig.collection_finder is None:
        init_plugin_loader()
    filter_loader.add_directory(str(ROLE / "filter_plugins"))
    values: dict[str, Any] = {
        "inventory_hostname": "gpu-node-2",
        "model_sync_source_node": "gpu-node-1",
        "model_sync_root": "/models",
        "model_sync_user": "modelsync",
        "model_sync_rrsync_path": "",
        "ansible_check_mode": False,
    }
    return RoleVars("model_sync", **(values | overrides))


MODELS = [{"name": "qwen2-tiny", "version": "v1"}, {"name": "llama", "version": "2024-06-06"}]


def test_the_read_takes_each_models_paths_as_its_tasks_name_them() -> None:
    paths = role_vars(model_sync_models=MODELS)["__model_sync_model_paths"]
    for model, read in zip(MODELS, paths, strict=True):
        per_model = role_vars(model_sync_models=MODELS, model_sync_model=model)
        assert read == {
            "name": model["name"],
            "dir": per_model["__model_sync_dir"],
            "version_dir": per_model["__model_sync_version_dir"],
            "manifest": per_model["__model_sync_manifest"],
            "current": per_model["__model_sync_dir"] + "/current",
        }
    receiver = role_vars(model_sync_models=MODELS)
    assert set(receiver["__model_sync_read_stat"]) >= {
        "/models/qwen2-tiny/v1",
        "/models/llama/2024-06-06.manifest.json",
        "/models/llama/current",
        "/usr/bin/rrsync",
        "/usr/share/doc/rsync/scripts/rrsync.gz",
        "/usr/local/bin/rrsync",
    }
    assert receiver["__model_sync_read_slurp"] == [
        "/usr/share/doc/rsync/scripts/rrsync.gz",
        "/var/lib/modelsync/.ssh/authorized_keys",
    ]
    site_rrsync = role_vars(model_sync_models=MODELS, model_sync_rrsync_path="/opt/rrsync")
    assert site_rrsync["__model_sync_read_slurp"] == ["/var/lib/modelsync/.ssh/authorized_keys"]
    source = role_vars(model_sync_models=MODELS, inventory_hostname="gpu-node-1")
    assert source["__model_sync_read_slurp"] == [
        "/models/qwen2-tiny/v1.manifest.json",
        "/models/llama/2024-06-06.manifest.json",
        "/var/lib/modelsync/.ssh/known_hosts",
    ]


def test_the_key_options_are_the_ones_the_lab_checks() -> None:
    role = role_vars(
        hostvars={"gpu-node-1": {"__model_sync_address": "10.89.42.11"}},
        __model_sync_rrsync="/usr/local/bin/rrsync",
    )
    assert role["__model_sync_key_options"] == OPTIONS


def task(path: str, name: str) -> dict[str, Any]:
    (found,) = [t for t in yaml.safe_load((ROLE / path).read_text()) if t.get("name") == name]
    return dict(found)


def switch_runs(current: dict[str, Any], version_dir: dict[str, Any]) -> bool:
    switch = task(
        "tasks/switch-current.yml", "Point current at the verified version, {{ __model_sync_label }}"
    )
    found = {"stat": {"/models/qwen2-tiny/current": current, "/models/qwen2-tiny/v1": version_dir}}
    return role_vars(model_sync_model=MODELS[0], __model_sync_found=found).when(switch["when"])


ROOTS_DIR = {"exists": True, "isdir": True, "islnk": False, "uid": 0, "gid": 0}


def test_current_is_switched_unless_the_read_found_it_as_the_link_task_leaves_it() -> None:
    link = {"exists": True, "islnk": True, "isdir": False, "lnk_target": "v1"}
    assert not switch_runs(link, ROOTS_DIR)
    assert switch_runs(link | {"lnk_target": "v0"}, ROOTS_DIR)
    assert switch_runs(link | {"lnk_target": "/models/qwen2-tiny/v1"}, ROOTS_DIR)
    assert switch_runs({"exists": True, "islnk": False, "isdir": True, "uid": 0, "gid": 0}, ROOTS_DIR)
    assert switch_runs({"exists": False}, ROOTS_DIR)
    # the file task sets owner and group on the link's target, the version's directory
    assert switch_runs(link, ROOTS_DIR | {"uid": 1001})
    assert switch_runs(link, ROOTS_DIR | {"gid": 1001})
    assert switch_runs(link, {"exists": False})


def prune_paths(check_mode: bool, replaced: list[str], now: dict[str, Any]) -> list[str]:
    """__model_sync_prune_paths, where the role's read listed qwen2-tiny's versions below and found `current`
    naming v0 (llama has none), and main.yml's find listed NOW."""
    listed = [
        {"path": "/models/qwen2-tiny/v0", "ctime": 1.0},
        {"path": "/models/qwen2-tiny/v1", "ctime": 3.0},
        {"path": "/models/qwen2-tiny/v-1", "ctime": 0.5},
        {"path": "/models/qwen2-tiny/v2", "ctime": 2.0},
    ]
    current = {"exists": True, "islnk": True, "lnk_target": "v0"}
    role = role_vars(
        model_sync_models=MODELS,
        model_sync_keep_versions=2,
        __model_sync_found={
            "stat": {"/models/qwen2-tiny/current": current, "/models/llama/current": {"exists": False}},
            "found": {"versions": {"files": listed}},
        },
        __model_sync_replaced=replaced,
        __model_sync_versions_now=now,
        ansible_check_mode=check_mode,
    )
    return list(role["__model_sync_prune_paths"])


def cache_of(version_dir: str) -> list[str]:
    parent, name = version_dir.rsplit("/", 1)
    return [version_dir, f"{version_dir}.manifest.json", f"{parent}/.{name}.manifest.json.cache"]


def test_pruning_keeps_the_version_current_names() -> None:
    skipped = {"changed": False, "skipped": True}
    # a real run switched current to the listed version v1 (or found it so): v0 goes, v2 is kept beside it
    assert prune_paths(False, [], skipped) == cache_of("/models/qwen2-tiny/v0") + cache_of(
        "/models/qwen2-tiny/v-1"
    )
    # --check switched nothing: current still names v0, as the read found it
    assert prune_paths(True, [], skipped) == cache_of("/models/qwen2-tiny/v2") + cache_of(
        "/models/qwen2-tiny/v-1"
    )


def test_pruning_lists_again_the_models_whose_version_the_run_replaced() -> None:
    """A version moved into place since the read counts: main.yml's find of that model wins over the read's;
    a model left as the read found it keeps the read's list (another model's find does not list it)."""
    now = {
        "files": [
            {"path": "/models/llama/2024-06-06", "ctime": 9.0},
            {"path": "/models/llama/2024-01-01", "ctime": 1.0},
            {"path": "/models/llama/2023-12-01", "ctime": 0.5},
        ]
    }
    assert prune_paths(False, ["llama"], now) == (
        cache_of("/models/qwen2-tiny/v0")
        + cache_of("/models/qwen2-tiny/v-1")
        + cache_of("/models/llama/2023-12-01")
    )
    now["files"] += [
        {"path": "/models/qwen2-tiny/v1", "ctime": 9.0},
        {"path": "/models/qwen2-tiny/v5", "ctime": 7.0},
        {"path": "/models/qwen2-tiny/v4", "ctime": 6.0},
    ]
    assert prune_paths(False, ["qwen2-tiny"], now) == cache_of("/models/qwen2-tiny/v4")
    # --check lists nothing again (nothing was replaced): the read's list holds
    assert prune_paths(True, ["qwen2-tiny"], {"changed": False, "skipped": True}) == prune_paths(True, [], {})


def test_the_source_shares_the_manifests_read_and_those_published_in_this_run() -> None:
    share = task("tasks/share-manifests.yml", "Mark the source node as published")
    found = {
        "slurp": {
            "/models/qwen2-tiny/v1.manifest.json": {"content": "T0xE"},
            "/models/llama/2024-06-06.manifest.json": {},
        }
    }

    def shared(results: list[dict[str, Any]]) -> Any:
        role = role_vars(
            model_sync_models=MODELS,
            inventory_hostname="gpu-node-1",
            __model_sync_found=found,
            __model_sync_manifest_files={"results": results},
        )
        return role.template(share["ansible.builtin.set_fact"]["__model_sync_manifest_content"])

    # a model not published yet (--check) has no manifest: its nodes report the sync instead
    assert shared([]) == {"qwen2-tiny": "T0xE"}
    # read again once published: the content read now wins over the read's
    again = [{"item": MODELS[1], "content": "TkVX"}, {"item": MODELS[0], "content": "TkVXRVI="}]
    assert shared(again) == {"qwen2-tiny": "TkVXRVI=", "llama": "TkVX"}


def test_the_key_is_authorized_unless_the_file_holds_exactly_its_line() -> None:
    authorize = task(
        "tasks/authorize-source.yml",
        "Authorize the source node's key for rrsync into {{ __model_sync_incoming }}",
    )
    line = f"{OPTIONS} {SYNC_KEY} \n"

    def runs(public_key: str, found: str | None) -> bool:
        """The task's gate where the read slurped FOUND as authorized_keys (None: nothing there)."""
        slurped = {"content": base64.b64encode(found.encode()).decode()} if found is not None else {}
        role = role_vars(
            hostvars={
                "gpu-node-1": {
                    "__model_sync_address": "10.89.42.11",
                    "__model_sync_keypair": {"changed": False, "public_key": public_key},
                }
            },
            __model_sync_rrsync="/usr/local/bin/rrsync",
            __model_sync_found={"slurp": {"/var/lib/modelsync/.ssh/authorized_keys": slurped}},
        )
        return role.when(authorize["when"])

    assert not runs(SYNC_KEY, line)
    assert runs(SYNC_KEY, line + line)
    assert runs(SYNC_KEY, line.replace("10.89.42.11", "10.89.42.21"))
    assert runs(SYNC_KEY, None)
    assert not runs("", None)  # --check, no key on the source node yet: reported instead


def test_the_source_nodes_public_key_is_the_one_its_key_task_registered() -> None:
    def key(source: dict[str, Any]) -> Any:
        return role_vars(hostvars={"gpu-node-1": source})["__model_sync_source_public_key"]

    assert key({"__model_sync_keypair": {"changed": False, "public_key": SYNC_KEY}}) == SYNC_KEY
    assert key({"__model_sync_keypair": {"changed": False, "public_key": ""}}) == ""
    assert key({"__model_sync_keypair": {"failed": True, "msg": "no"}}) == ""  # it failed there
    assert key({}) == ""  # the source node failed before its key task


def test_a_nodes_host_key_is_trusted_unless_known_hosts_holds_it() -> None:
    trust = task("tasks/prepare-source.yml", "Trust the other nodes' host keys for the sync account")
    key = "AAAAC3NzaC1lZDI1NTE5AAAAIE"

    def runs(item: str, known: str | None) -> bool:
        slurped = {"content": base64.b64encode(known.encode()).decode()} if known is not None else {}
        role = role_vars(
            inventory_hostname="gpu-node-1",
            item=item,
            hostvars={
                "gpu-node-2": {
                    "__model_sync_address": NODE,
                    "ansible_facts": {"ssh_host_key_ed25519_public": key},
                },
                "gpu-node-3": {"ansible_facts": {}},
            },
            __model_sync_found={"slurp": {"/var/lib/modelsync/.ssh/known_hosts": slurped}},
            __model_sync_host_key=trust["vars"]["__model_sync_host_key"],
        )
        return role.when(trust["when"])

    assert not runs("gpu-node-2", f"{NODE} ssh-ed25519 {key}\n")
    assert runs("gpu-node-2", f"{NODE} ssh-ed25519 {key}x\n")
    assert runs("gpu-node-2", None)
    assert not runs("gpu-node-3", None)  # no host key gathered: not trusted, not synced to


# ------------------------------------------------------- the sync account, as the user task leaves it

PASSWD = "modelsync:x:998:998:model weights sync (rsync only):/var/lib/modelsync:/bin/sh\n"
SHADOW = "modelsync:!:19700::::::\n"


def account_in_place(tmp_path: Path, passwd: str, shadow: str, home: bool = True) -> bool:
    """__model_sync_account_in_place, on what files_in_place finds of the role's finds in TMP_PATH standing
    for /etc (passwd and shadow there, with root's and another account's lines around the sync account's)."""
    import files_in_place
    from conftest import run_module

    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    others = "root:x:0:0:root:/root:/bin/bash\n", "root:*:19700:0:99999:7:::\n"
    (etc / "passwd").write_text(others[0] + passwd + "modelsync2:x:1:1::/:/bin/sh\n")
    (etc / "shadow").write_text(others[1] + shadow)
    finds = [
        entry | {"paths": [str(etc)]}
        for entry in role_vars(model_sync_models=MODELS)["__model_sync_read_find"]
        if entry["name"] != "versions"
    ]
    failed, read = run_module(files_in_place, {"find": finds})
    assert not failed, read
    home_stat = {"exists": home}
    role = role_vars(__model_sync_found={"found": read["found"], "stat": {"/var/lib/modelsync": home_stat}})
    return bool(role.when("__model_sync_account_in_place | bool"))


def test_the_account_is_in_place_only_as_the_user_task_leaves_it(tmp_path: Path) -> None:
    """The user module changes an existing account where its comment, home or shell differ, where its
    password with the '!'s stripped is not empty, or where its home is not there; not on its uid or gid."""
    assert account_in_place(tmp_path, PASSWD, SHADOW)
    assert account_in_place(tmp_path, PASSWD.replace("998:998", "120:130"), SHADOW.replace(":!:", ":!!:"))
    assert not account_in_place(tmp_path, PASSWD, SHADOW, home=False)
    assert not account_in_place(tmp_path, "", SHADOW)  # no account
    assert not account_in_place(tmp_path, PASSWD, "")
    assert not account_in_place(tmp_path, PASSWD.replace("/bin/sh", "/bin/bash"), SHADOW)
    assert not account_in_place(tmp_path, PASSWD.replace("/bin/sh", "/bin/sh2"), SHADOW)
    assert not account_in_place(tmp_path, PASSWD.replace("/var/lib/modelsync", "/home/modelsync"), SHADOW)
    assert not account_in_place(tmp_path, PASSWD.replace("(rsync only)", "rsync only"), SHADOW)
    assert not account_in_place(tmp_path, PASSWD, SHADOW.replace(":!:", ":$6$salt$hash:"))
    assert not account_in_place(tmp_path, PASSWD, SHADOW.replace(":!:", ":!$6$salt$hash:"))
    assert not account_in_place(tmp_path, PASSWD, SHADOW.replace(":!:", ":*:"))
    # a password written into /etc/passwd itself: the module reads it as the account's password
    assert not account_in_place(tmp_path, PASSWD.replace(":x:", ":$6$salt$hash:"), SHADOW)
    assert account_in_place(tmp_path, PASSWD.replace(":x:", "::"), SHADOW)


# ------------------------------------------------ validate.yml's check of each model entry, in one task

GOOD = {"name": "qwen2", "version": "v1", "source": "/srv/inbox/q", "publisher_manifest": "/srv/inbox/q.json"}


@pytest.mark.parametrize(
    "entry",
    [
        "qwen2-tiny",
        GOOD | {"name": ".hidden"},
        GOOD | {"name": "a/b"},
        {k: v for k, v in GOOD.items() if k != "version"},
        GOOD | {"version": "current"},
        GOOD | {"version": ""},
        GOOD | {"source": "inbox/q"},
        GOOD | {"publisher_manifest": ""},
        GOOD | {"serving_uid": "1001"},
        GOOD | {"extra": True},
    ],
)
def test_each_model_entry_not_as_validate_wants_it_is_named(entry: Any) -> None:
    (check,) = [
        c
        for c in yaml.safe_load((ROLE / "tasks/validate.yml").read_text())[0]["value_checks"]["checks"]
        if c["that"] == "__model_sync_bad_entries | length == 0"
    ]
    other = GOOD | {"name": "b", "version": "2024-06-06", "serving_uid": 0}
    good = role_vars(model_sync_models=[GOOD, other])
    assert good.when(check["that"])
    role = role_vars(model_sync_models=[GOOD, entry, GOOD | {"name": "c"}], model_sync_serving_uid=1001)
    assert not role.when(check["that"])
    message = " ".join(str(role.template(check["fail_msg"])).split())
    assert message.startswith("model_sync_models[1] must each have"), message
    assert message.endswith(f"got {json.dumps([entry])}."), message
