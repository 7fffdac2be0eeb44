"""model_manifest: generate, verify, the stat cache, check mode, diff and errors naming the file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import model_manifest
import modelgen
import pytest
from ansible.module_utils import model_manifest_core as core
from conftest import run_module


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return modelgen.write_good_model(tmp_path / "model")


def _manifest_path(model: Path) -> Path:
    return model.parent / "model.manifest.json"


def generate(model: Path, **kwargs: Any) -> tuple[bool, dict[str, Any]]:
    args = {"path": str(model), "manifest": str(_manifest_path(model)), "state": "generate", **kwargs}
    check_mode = args.pop("check_mode", False)
    diff = args.pop("diff", False)
    return run_module(model_manifest, args, check_mode=check_mode, diff=diff)


def verify(model: Path, **kwargs: Any) -> tuple[bool, dict[str, Any]]:
    args = {"path": str(model), "manifest": str(_manifest_path(model)), "state": "verify", **kwargs}
    check_mode = args.pop("check_mode", False)
    return run_module(model_manifest, args, check_mode=check_mode)


def test_generate_lists_every_file_with_size_and_sha256(model: Path) -> None:
    failed, result = generate(model)
    assert not failed and result["changed"]
    data = json.loads(_manifest_path(model).read_text())
    assert data["format"] == "model-manifest/1"
    listed = {f["path"]: f for f in data["files"]}
    on_disk = sorted(p.relative_to(model).as_posix() for p in model.rglob("*") if p.is_file())
    assert sorted(listed) == on_disk
    for relpath, entry in listed.items():
        content = (model / relpath).read_bytes()
        assert entry["size"] == len(content)
        assert entry["sha256"] == hashlib.sha256(content).hexdigest()
    assert result["file_count"] == len(on_disk) and result["total_size"] == sum(
        f["size"] for f in listed.values()
    )
    assert oct(_manifest_path(model).stat().st_mode & 0o777) == "0o644"


def test_generate_again_is_unchanged_and_uses_the_cache(model: Path) -> None:
    generate(model)
    before = _manifest_path(model).stat().st_mtime_ns
    failed, result = generate(model)
    assert not failed and not result["changed"]
    assert result["stats"]["hashed_files"] == 0 and result["stats"]["cache_hits"] == result["file_count"]
    assert _manifest_path(model).stat().st_mtime_ns == before


def test_generate_check_mode_writes_nothing_and_diff_shows_the_lines(model: Path) -> None:
    failed, result = generate(model, check_mode=True, diff=True)
    assert not failed and result["changed"]
    assert not _manifest_path(model).exists()
    assert not Path(core.default_cache_path(str(_manifest_path(model)))).exists()
    shard_line = next(line for line in result["diff"]["after"].splitlines() if modelgen.SHARD_2 in line)
    assert shard_line.split()[0] == hashlib.sha256((model / modelgen.SHARD_2).read_bytes()).hexdigest()
    assert result["diff"]["before"] == ""


def test_verify_good_model_then_from_the_cache(model: Path) -> None:
    generate(model, cache=False)
    failed, first = verify(model)
    assert not failed and first["matches"] and not first["changed"]
    assert first["stats"]["hashed_files"] == first["file_count"]
    failed, second = verify(model)
    assert not failed and second["matches"]
    assert second["stats"]["hashed_files"] == 0 and second["stats"]["cache_hits"] == second["file_count"]


def test_verify_flipped_byte_names_the_shard_even_with_a_warm_cache(model: Path) -> None:
    generate(model)
    verify(model)  # warm cache
    shard = model / modelgen.SHARD_2
    data = bytearray(shard.read_bytes())
    data[-100] ^= 1
    shard.write_bytes(bytes(data))  # same size, same inode, new mtime
    failed, result = verify(model)
    assert failed and not result["matches"]
    assert [m["path"] for m in result["mismatched"]] == [modelgen.SHARD_2]
    assert result["mismatched"][0]["reason"] == "sha256"
    assert modelgen.SHARD_2 in result["msg"]


def test_verify_missing_extra_and_size_mismatch(model: Path) -> None:
    generate(model)
    (model / modelgen.SHARD_1).unlink()
    (model / "extra.bin").write_bytes(b"x")
    with open(model / modelgen.SHARD_2, "r+b") as f:
        f.truncate(1000)
    failed, result = verify(model, fail_on_mismatch=False)
    assert not failed and not result["matches"]
    assert result["missing"] == [modelgen.SHARD_1]
    assert result["extra"] == ["extra.bin"]
    assert result["mismatched"][0]["path"] == modelgen.SHARD_2
    assert result["mismatched"][0]["reason"] == "size"
    assert result["mismatched"][0]["actual_sha256"] is None  # not hashed
    assert result["stats"]["hashed_files"] == 0 or result["stats"]["hashed_bytes"] < 1_000_000


def test_cache_of_another_directory_is_not_trusted(tmp_path: Path) -> None:
    one = modelgen.write_good_model(tmp_path / "one")
    other = modelgen.write_good_model(tmp_path / "other", version="2")
    cache = tmp_path / "shared.cache"
    manifest = tmp_path / "one.json"
    run_module(
        model_manifest,
        {"path": str(one), "manifest": str(manifest), "state": "generate", "cache_path": str(cache)},
    )
    failed, result = run_module(
        model_manifest, {"path": str(other), "manifest": str(manifest), "cache_path": str(cache)}
    )
    assert failed and {m["path"] for m in result["mismatched"]} >= {modelgen.SHARD_1, modelgen.SHARD_2}
    assert result["stats"]["cache_hits"] == 0


def test_cache_follows_a_renamed_directory(tmp_path: Path) -> None:
    staged = modelgen.write_good_model(tmp_path / "staging")
    manifest = str(tmp_path / "v1.manifest.json")
    run_module(model_manifest, {"path": str(staged), "manifest": manifest, "state": "generate"})
    staged.rename(tmp_path / "v1")
    failed, result = run_module(model_manifest, {"path": str(tmp_path / "v1"), "manifest": manifest})
    assert not failed and result["matches"]
    assert result["stats"]["hashed_files"] == 0 and result["stats"]["cache_hits"] == result["file_count"]


def test_manifest_inside_the_directory_is_left_out(model: Path) -> None:
    manifest = model / "MANIFEST.json"
    failed, result = run_module(
        model_manifest, {"path": str(model), "manifest": str(manifest), "state": "generate"}
    )
    assert not failed
    listed = [f["path"] for f in json.loads(manifest.read_text())["files"]]
    assert "MANIFEST.json" not in listed and not any(p.endswith(".cache") for p in listed)
    failed, result = run_module(model_manifest, {"path": str(model), "manifest": str(manifest)})
    assert not failed and result["matches"]


def test_exclude_patterns(model: Path) -> None:
    (model / ".rsync-partial").mkdir()
    (model / ".rsync-partial" / "half").write_bytes(b"half a shard")
    generate(model, exclude=[".rsync-partial/*"])
    listed = [f["path"] for f in json.loads(_manifest_path(model).read_text())["files"]]
    assert not any(p.startswith(".rsync-partial") for p in listed)


def test_one_worker_and_many_agree(model: Path) -> None:
    files = core.scan_tree(str(model))
    one, _ = core.hash_tree(str(model), files, workers=1, block_size=4096)
    many, _ = core.hash_tree(str(model), files, workers=4)
    assert one == many


def test_symlink_is_an_error_naming_it(model: Path) -> None:
    os.symlink(model / modelgen.SHARD_1, model / "link.safetensors")
    failed, result = generate(model)
    assert failed and "link.safetensors" in result["msg"] and "symlink" in result["msg"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("not json", "not valid JSON"),
        ('{"format": "other"}', "field 'format'"),
        ('{"format": "model-manifest/1", "files": [{"path": "a", "size": 1}]}', "files[0] (a): sha256"),
        (
            '{"format": "model-manifest/1", "files": [{"path": "../a", "size": 1, "sha256": "'
            + "0" * 64
            + '"}]}',
            "'../a'",
        ),
    ],
)
def test_bad_manifest_is_an_error_naming_file_and_field(model: Path, content: str, expected: str) -> None:
    _manifest_path(model).write_text(content)
    failed, result = verify(model)
    assert failed and str(_manifest_path(model)) in result["msg"] and expected in result["msg"]


def test_unreadable_file_is_named(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = open

    def failing_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith(modelgen.SHARD_1):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    failed, result = generate(model, cache=False)
    assert failed and modelgen.SHARD_1 in result["msg"] and "cannot read" in result["msg"]


def test_bad_options_are_named(model: Path, tmp_path: Path) -> None:
    failed, result = generate(model, workers=-1)
    assert failed and "workers" in result["msg"]
    failed, result = run_module(
        model_manifest,
        {"path": str(tmp_path / "nope"), "manifest": str(tmp_path / "m.json"), "state": "generate"},
    )
    assert failed and "path:" in result["msg"]
    failed, result = run_module(
        model_manifest, {"path": str(model), "manifest": str(tmp_path / "no" / "m.json")}
    )
    assert failed and "manifest:" in result["msg"]
