"""model_admission: every gate passes the good test model and refuses its bad variant, naming the file.

ClamAV runs for real (``clamscan`` from Debian's clamav, installed by scripts/ensure-host-deps.sh) with a
database the test writes (the EICAR signature); bandit, picklescan and tokenizers are the pinned packages.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import model_admission
import modelgen
import pytest
import safetensors
from ansible.module_utils import model_admission_gates as gates
from conftest import run_module

CLAMSCAN = shutil.which("clamscan")


@pytest.fixture(scope="session", autouse=True)
def _clamscan_installed() -> None:
    assert CLAMSCAN, "clamscan is missing: run scripts/ensure-host-deps.sh (Debian package clamav)"


@pytest.fixture
def base() -> Iterator[Path]:
    """A scratch directory the serving uid can enter (pytest's tmp_path sits under a 0700 directory, which
    the permissions gate would rightly report)."""
    path = Path(tempfile.mkdtemp(prefix="model-admission-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(base: Path) -> dict[str, Path]:
    return {
        "model": base / "model",
        "publisher": modelgen.write_publisher_manifest(base / "publisher.json"),
        "database": modelgen.write_eicar_database(base / "clamav"),
    }


def admit(env: dict[str, Path], **kwargs: Any) -> tuple[bool, dict[str, Any]]:
    args: dict[str, Any] = {
        "path": str(env["model"]),
        "publisher_manifest": str(env["publisher"]),
        "clamav_database": str(env["database"]),
    }
    args.update(kwargs)
    check_mode = args.pop("check_mode", False)
    diff = args.pop("diff", False)
    return run_module(model_admission, args, check_mode=check_mode, diff=diff)


def errors(result: dict[str, Any], gate: str) -> list[tuple[str | None, str]]:
    return [(f["file"], f["message"]) for f in result["gates"][gate]["findings"] if f["level"] == "error"]


# The good model -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["model_manifest", "sha256sum", "hf_json"])
def test_good_model_is_admitted_by_every_gate(env: dict[str, Path], form: str) -> None:
    modelgen.write_good_model(env["model"])
    env["publisher"].write_text(modelgen.publisher_listing(env["model"], form))
    failed, result = admit(env)
    assert not failed, result["msg"]
    assert result["admitted"] and result["refused_by"] == [] and not result["changed"]
    assert {name: g["verdict"] for name, g in result["gates"].items()} == dict.fromkeys(gates.GATES, "passed")
    assert form in result["gates"]["publisher"]["summary"]


def test_generated_shards_pass_the_reference_parser(env: dict[str, Path]) -> None:
    """The test model is a real safetensors model: the format's own library reads every shard."""
    model = modelgen.write_good_model(env["model"])
    index = json.loads((model / modelgen.INDEX).read_text())
    for shard in (modelgen.SHARD_1, modelgen.SHARD_2):
        tensors = dict(safetensors.deserialize((model / shard).read_bytes()))
        assert set(tensors) == {t for t, s in index["weight_map"].items() if s == shard}


# Each bad variant: refused by its gate, naming its file --------------------------------------------------


@pytest.mark.parametrize("variant", modelgen.VARIANTS)
def test_bad_variant_is_refused_by_its_gate_naming_the_file(env: dict[str, Path], variant: str) -> None:
    modelgen.write_variant(env["model"], variant)
    failed, result = admit(env)
    gate, file = modelgen.EXPECTED_REFUSAL[variant]
    assert failed and not result["admitted"]
    assert gate in result["refused_by"]
    assert file in [f for f, _ in errors(result, gate)]
    assert f"{gate} (" in result["msg"] and file in result["msg"]


def test_refusal_without_failing_the_task(env: dict[str, Path]) -> None:
    modelgen.write_variant(env["model"], "header_past_end")
    failed, result = admit(env, fail_on_refusal=False)
    assert not failed and not result["admitted"] and "safetensors" in result["refused_by"]


def test_gates_not_selected_are_skipped(env: dict[str, Path]) -> None:
    modelgen.write_variant(env["model"], "eicar")
    failed, result = admit(env, gates=["safetensors", "tokenizer"])
    assert not failed and result["admitted"]
    assert result["gates"]["clamav"]["verdict"] == "skipped"
    assert result["gates"]["publisher"]["verdict"] == "skipped"


# Gate 1: publisher ---------------------------------------------------------------------------------------


def test_publisher_gate_needs_a_list(env: dict[str, Path]) -> None:
    modelgen.write_good_model(env["model"])
    failed, result = run_module(
        model_admission, {"path": str(env["model"]), "clamav_database": str(env["database"])}
    )
    assert failed and "publisher_manifest is required" in result["msg"]


def test_publisher_hf_json_checks_small_files_by_git_blob_id(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    env["publisher"].write_text(modelgen.publisher_listing(model, "hf_json"))
    config = json.loads((model / "config.json").read_text())
    config["num_hidden_layers"] = 3  # same size, different content
    (model / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    failed, result = admit(env, gates=["publisher"])
    assert failed and errors(result, "publisher")[0][0] == "config.json"
    assert "git blob id" in errors(result, "publisher")[0][1]


def test_publisher_ignore_and_unreadable_list(env: dict[str, Path], tmp_path: Path) -> None:
    model = modelgen.write_good_model(env["model"])
    (model / "README.md").write_text("# tiny\n")
    failed, _ = admit(env, gates=["publisher"])
    assert not failed  # *.md is ignored by default
    failed, result = admit(env, gates=["publisher"], publisher_ignore=[])
    assert failed and errors(result, "publisher") == [
        ("README.md", "present here, not listed by the publisher")
    ]
    failed, result = admit(env, gates=["publisher"], publisher_manifest=str(tmp_path / "absent.json"))
    assert failed and "cannot read the publisher's list" in errors(result, "publisher")[0][1]
    (tmp_path / "bad.sha256").write_text("not a sha256sum line\n")
    failed, result = admit(env, gates=["publisher"], publisher_manifest=str(tmp_path / "bad.sha256"))
    assert failed and "bad.sha256:1" in errors(result, "publisher")[0][1]


def test_publisher_cache_avoids_rehashing(env: dict[str, Path], tmp_path: Path) -> None:
    modelgen.write_good_model(env["model"])
    cache = str(tmp_path / "admission.cache")
    admit(env, gates=["publisher"], cache_path=cache)
    failed, result = admit(env, gates=["publisher"], cache_path=cache)
    assert not failed and "0 hashed" in result["gates"]["publisher"]["summary"]


# Gate 2: safetensors -------------------------------------------------------------------------------------


def _rewrite_header(path: Path, change: Any) -> None:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    change(header)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length :])


def _first_tensor(header: dict[str, Any]) -> dict[str, Any]:
    return next(v for k, v in header.items() if k != "__metadata__")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda h: _first_tensor(h).update(dtype="Q7"), "unknown dtype 'Q7'"),
        (lambda h: _first_tensor(h).update(shape=[3, 3]), "bytes of data for shape [3, 3]"),
        (lambda h: _first_tensor(h)["data_offsets"].__setitem__(0, 2), "not contiguous"),
        (lambda h: _first_tensor(h).update(data_offsets=[5, 1]), "0 <= begin <= end"),
        (lambda h: h.update(__metadata__={"format": 1}), "__metadata__"),
    ],
)
def test_safetensors_structure_errors(env: dict[str, Path], change: Any, expected: str) -> None:
    model = modelgen.write_good_model(env["model"])
    _rewrite_header(model / modelgen.SHARD_1, change)
    failed, result = admit(env, gates=["safetensors"])
    assert failed
    assert any(f == modelgen.SHARD_1 and expected in m for f, m in errors(result, "safetensors")), result[
        "msg"
    ]


def test_safetensors_header_length_and_json(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    shard = model / modelgen.SHARD_1
    data = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", len(data) * 2) + data[8:])
    failed, result = admit(env, gates=["safetensors"])
    assert failed and "runs past the end of the file" in errors(result, "safetensors")[0][1]
    shard.write_bytes(struct.pack("<Q", 4) + b"nope" + data[8:])
    failed, result = admit(env, gates=["safetensors"])
    assert failed and "does not start with '{'" in errors(result, "safetensors")[0][1]
    shard.write_bytes(b"abc")
    failed, result = admit(env, gates=["safetensors"])
    assert failed and "too short" in errors(result, "safetensors")[0][1]


def test_safetensors_trailing_bytes_and_index_tensors(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    with open(model / modelgen.SHARD_1, "ab") as f:
        f.write(b"\0" * 16)
    index = json.loads((model / modelgen.INDEX).read_text())
    index["weight_map"]["model.ghost.weight"] = modelgen.SHARD_2
    (model / modelgen.INDEX).write_text(json.dumps(index))
    failed, result = admit(env, gates=["safetensors"])
    found = errors(result, "safetensors")
    assert failed and (modelgen.SHARD_1, "16 bytes after the last tensor's data") in found
    assert any(f == modelgen.SHARD_2 and "'model.ghost.weight'" in m for f, m in found)


def test_no_safetensors_or_shards_without_index(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    (model / modelgen.INDEX).unlink()
    failed, result = admit(env, gates=["safetensors"])
    assert failed and "no *.safetensors.index.json" in errors(result, "safetensors")[0][1]
    for shard in (modelgen.SHARD_1, modelgen.SHARD_2):
        (model / shard).unlink()
    failed, result = admit(env, gates=["safetensors"])
    assert failed and "no *.safetensors weights" in errors(result, "safetensors")[0][1]


# Gate 3: pickle ------------------------------------------------------------------------------------------


def _global_pickle(module: str, name: str) -> bytes:
    return b"\x80\x02c" + f"{module}\n{name}\n".encode() + b")R."


@pytest.mark.parametrize(
    ("module", "name"),
    [("posix", "system"), ("subprocess", "Popen"), ("builtins", "eval"), ("builtins", "exec")],
)
def test_pickle_importing_code_execution_is_refused(env: dict[str, Path], module: str, name: str) -> None:
    model = modelgen.write_good_model(env["model"])
    (model / "optimizer.pt").write_bytes(_global_pickle(module, name))
    failed, result = admit(env, gates=["pickle"])
    assert failed and result["pickle_files"] == ["optimizer.pt"]
    assert errors(result, "pickle") == [
        ("optimizer.pt", f"imports {module}.{name}: dangerous (code execution when loaded)")
    ]


def test_pickle_detected_by_its_header_whatever_the_name(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    (model / "extra_config.json").write_bytes(modelgen.malicious_pickle_bytes())
    failed, result = admit(env, gates=["pickle"])
    assert failed and "extra_config.json" in result["pickle_files"]


def test_innocuous_pickle_passes_the_scan_but_not_refuse(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    (model / "state.pkl").write_bytes(_global_pickle("collections", "OrderedDict"))
    failed, result = admit(env, gates=["pickle"])
    assert not failed, result["msg"]
    failed, result = admit(env, gates=["pickle"], pickle_policy="refuse")
    assert failed and errors(result, "pickle")[0][0] == "state.pkl"


def test_pickle_with_unknown_global_or_garbage_is_refused(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    (model / "a.pkl").write_bytes(_global_pickle("mypackage.hooks", "setup"))
    (model / "b.bin").write_bytes(b"\x80\x02garbage")
    failed, result = admit(env, gates=["pickle"])
    found = dict(errors(result, "pickle"))
    assert failed and "not known to be innocuous" in found["a.pkl"] and "b.bin" in found


# Gate 4: python ------------------------------------------------------------------------------------------


def test_python_files_reported_and_clean_code_passes(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    (model / "configuration_tiny.py").write_text("def size(config):\n    return config['hidden_size'] * 2\n")
    failed, result = admit(env, gates=["python"])
    assert not failed and result["python_files"] == ["configuration_tiny.py"]
    assert result["gates"]["python"]["findings"][0]["level"] == "warning"
    failed, result = admit(env, gates=["python"], python_policy="refuse")
    assert failed and errors(result, "python")[0][0] == "configuration_tiny.py"


@pytest.mark.parametrize(
    ("code", "test_id"),
    [
        ("exec(open('x').read())\n", "B102"),
        ("import subprocess\nsubprocess.run(['ls'])\n", "B603"),
        ("import os\nos.system('ls')\n", "B605"),
    ],
)
def test_python_exec_subprocess_system_are_refused(env: dict[str, Path], code: str, test_id: str) -> None:
    model = modelgen.write_good_model(env["model"])
    (model / "modeling_tiny.py").write_text(code)
    failed, result = admit(env, gates=["python"])
    assert failed and any(f == "modeling_tiny.py" and test_id in m for f, m in errors(result, "python"))


def test_python_gate_fails_when_bandit_cannot_run(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    (model / "x.py").write_text("print(1)\n")
    result = gates.gate_python(str(model), ["x.py"], "scan", lambda argv: (2, "", "bandit: crashed"))
    assert result.verdict == "failed" and "bandit failed" in result.findings[0].message


# Gate 5: clamav ------------------------------------------------------------------------------------------


def test_clamav_database_missing_or_empty_is_not_a_pass(env: dict[str, Path], tmp_path: Path) -> None:
    modelgen.write_good_model(env["model"])
    failed, result = admit(env, gates=["clamav"], clamav_database=str(tmp_path / "absent"))
    assert failed and errors(result, "clamav")[0][0] == str(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    failed, result = admit(env, gates=["clamav"], clamav_database=str(tmp_path / "empty"))
    assert failed and "no ClamAV signature database" in errors(result, "clamav")[0][1]
    failed, result = run_module(
        model_admission,
        {"path": str(env["model"]), "publisher_manifest": str(env["publisher"]), "gates": ["clamav"]},
    )
    assert failed and "clamav_database is required" in result["msg"]


def test_clamav_without_clamscan_fails(env: dict[str, Path]) -> None:
    modelgen.write_good_model(env["model"])
    failed, result = admit(env, gates=["clamav"], clamscan="/nonexistent/clamscan")
    assert failed and "clamscan not found" in errors(result, "clamav")[0][1]


def test_clamav_error_exit_is_a_failure(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    files = {p: os.stat(model / p) for p in os.listdir(model)}
    result = gates.gate_clamav(
        str(model), files, str(env["database"]), CLAMSCAN or "", lambda a: (2, "", "boom")
    )
    assert result.verdict == "failed" and "clamscan failed (rc 2)" in result.findings[0].message


# Gate 6: tokenizer ---------------------------------------------------------------------------------------


def test_tokenizer_files_must_exist_and_parse(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    (model / "tokenizer_config.json").unlink()
    (model / "config.json").write_text("{broken")
    failed, result = admit(env, gates=["tokenizer"])
    found = dict(errors(result, "tokenizer"))
    assert failed and found["tokenizer_config.json"] == "missing" and "not valid JSON" in found["config.json"]


def test_tokenizer_that_cannot_load_or_round_trip(env: dict[str, Path]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = modelgen.write_good_model(env["model"])
    (model / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    failed, result = admit(env, gates=["tokenizer"])
    assert failed and "cannot load it" in errors(result, "tokenizer")[0][1]
    english_only = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    english_only.pre_tokenizer = pre_tokenizers.Whitespace()
    english_only.save(str(model / "tokenizer.json"))
    failed, result = admit(env, gates=["tokenizer"])
    assert failed and all(f == "tokenizer.json" and "round trip" in m for f, m in errors(result, "tokenizer"))
    assert len(errors(result, "tokenizer")) == 2  # the Chinese and the English sentence


# Gate 7: permissions -------------------------------------------------------------------------------------


def test_unreadable_file_reported_then_fixed_with_check_mode_and_diff(env: dict[str, Path]) -> None:
    model = modelgen.write_variant(env["model"], "unreadable_0600")
    index = model / modelgen.INDEX
    failed, result = admit(env, gates=["permissions"], fix_permissions=True, check_mode=True, diff=True)
    assert not failed and result["changed"] and oct(index.stat().st_mode & 0o777) == "0o600"
    assert f"0600 0:0 {modelgen.INDEX}" in result["diff"]["before"] or "0600" in result["diff"]["before"]
    assert f"0604 {index.stat().st_uid}:{index.stat().st_gid} {modelgen.INDEX}" in result["diff"]["after"]
    failed, result = admit(env, gates=["permissions"], fix_permissions=True)
    assert not failed and result["changed"] and oct(index.stat().st_mode & 0o777) == "0o604"
    fixed = [f for f in result["gates"]["permissions"]["findings"] if f["level"] == "fixed"]
    assert [f["file"] for f in fixed] == [modelgen.INDEX]
    failed, result = admit(env, gates=["permissions"], fix_permissions=True)
    assert not failed and not result["changed"]


def test_permissions_use_the_class_that_applies_to_the_uid(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    shard = model / modelgen.SHARD_1
    shard.chmod(0o640)
    gid = shard.stat().st_gid
    failed, result = admit(env, gates=["permissions"])
    assert failed and errors(result, "permissions")[0][0] == modelgen.SHARD_1
    failed, result = admit(env, gates=["permissions"], serving_gid=[gid])
    assert not failed  # group-readable and the uid is in the file's group
    failed, result = admit(env, gates=["permissions"], serving_uid=shard.stat().st_uid)
    assert not failed  # the owner reads it


def test_permissions_fix_owner_and_unsearchable_directories(env: dict[str, Path], base: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    model = modelgen.write_good_model(env["model"])
    (model / "sub").mkdir(mode=0o700)
    (model / "sub" / "notes.txt").write_text("x")
    failed, result = admit(env, gates=["permissions"])
    assert failed and "sub" in [f for f, _ in errors(result, "permissions")]
    failed, result = admit(env, gates=["permissions"], fix_permissions=True, owner=1001, group=1001)
    assert not failed and (model / modelgen.SHARD_1).stat().st_uid == 1001
    assert oct((model / "sub").stat().st_mode & 0o777) == "0o700"  # owner 1001 already has rwx
    base.chmod(0o700)  # a directory above the model
    try:
        failed, result = admit(env, gates=["permissions"])
        assert failed and (str(base), "mode 0700: uid 1001 cannot enter it (above the model)") in errors(
            result, "permissions"
        )
    finally:
        base.chmod(0o755)


def test_owner_without_fix_is_refused(env: dict[str, Path]) -> None:
    modelgen.write_good_model(env["model"])
    failed, result = admit(env, gates=["permissions"], owner=0)
    assert failed and "owner and group apply only with fix_permissions" in result["msg"]


# Tools ---------------------------------------------------------------------------------------------------


def test_tools_are_imported_only_for_the_selected_gates() -> None:
    assert gates.tools_for(["safetensors", "clamav"], "scan", "scan") == []
    assert gates.tools_for(gates.GATES, "scan", "scan") == ["tokenizers", "picklescan.scanner", "bandit"]
    assert gates.tools_for(["pickle", "python"], "refuse", "refuse") == []


def test_missing_tool_names_the_venv(env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    modelgen.write_good_model(env["model"])
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails
    monkeypatch.setattr("ansible.module_utils.common.respawn.has_respawned", lambda: True)
    failed, result = admit(env, gates=["tokenizer"])
    assert failed and "tokenizers" in result["msg"] and "/opt/model-tools" in result["msg"]


def test_a_symlink_in_the_model_refuses_admission(env: dict[str, Path]) -> None:
    model = modelgen.write_good_model(env["model"])
    os.symlink("/etc/passwd", model / "vocab.txt")
    failed, result = admit(env, gates=["safetensors"])
    assert failed and "vocab.txt" in result["msg"] and "symlink" in result["msg"]
