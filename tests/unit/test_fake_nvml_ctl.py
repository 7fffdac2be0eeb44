"""The fake-nvml control CLI and the fake pynvml's own behaviour (writes, locking, faults)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import fake_nvml_ctl
import pynvml
import pytest
from conftest import FAKE_NVML_DIR, SHAPES, FakeNode


def test_shapes_are_generated(node: FakeNode) -> None:
    state = node.state()
    shape = fake_nvml_ctl.SHAPES[node.shape]
    assert state["kernel_module_version"] == "535.183.06"
    assert state["cuda_driver_version"] == 12020
    assert len(state["gpus"]) == shape.gpu_count
    for gpu in state["gpus"]:
        assert len(gpu["nvlinks"]) == 12
        assert gpu["power"]["default_mw"] == shape.default_limit_w * 1000


def test_init_refuses_to_overwrite_without_force(
    pcie_node: FakeNode, capsys: pytest.CaptureFixture[str]
) -> None:
    assert pcie_node.ctl("init", "--shape", "a100-sxm4-40gb-x8", "--host", "x") == 1
    assert "use --force" in capsys.readouterr().err
    assert pcie_node.ctl("init", "--shape", "a100-sxm4-40gb-x8", "--host", "x", "--force") == 0
    assert pcie_node.state()["shape"] == "a100-sxm4-40gb-x8"


def test_init_creates_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "var" / "lib" / "fake-nvml" / "state.json"
    monkeypatch.setenv("FAKE_NVML_STATE", str(path))
    assert fake_nvml_ctl.main(["init", "--shape", SHAPES[0], "--host", "gpu-node-3"]) == 0
    state = json.loads(path.read_text())
    assert state["host"] == "gpu-node-3"
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_unknown_shape_is_rejected(pcie_node: FakeNode) -> None:
    with pytest.raises(SystemExit) as exit_info:
        pcie_node.ctl("init", "--shape", "h100-x8", "--force")
    assert exit_info.value.code == 2
    with pytest.raises(fake_nvml_ctl.CtlError, match="unknown shape"):
        fake_nvml_ctl.build_state("h100-x8", "h")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ecc", "--gpu", "9", "--corrected", "1"], "no GPU 9"),
        (["link", "--gpu", "0", "--link", "12", "--down"], "NVLinks 0-11, not 12"),
        (["power", "--gpu", "0", "--limit-w", "300"], "outside 150-250 W"),
        (["temp", "--gpu", "0", "--celsius", "400"], "between 0 and 150"),
        (["kernel-version", " "], "invalid version"),
        (["process", "--gpu", "0", "--add"], "--add needs --pid"),
    ],
)
def test_bad_input_is_one_clear_line(
    pcie_node: FakeNode, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    before = pcie_node.state()
    assert pcie_node.ctl(*args) == 1
    err = capsys.readouterr().err
    assert err.startswith("fake-nvml: error: ") and message in err and "Traceback" not in err
    assert pcie_node.state() == before


@pytest.mark.parametrize(
    "args",
    [
        ["ecc", "--gpu", "0"],
        ["ecc", "--gpu", "0", "--corrected", "-1"],
        ["remap", "--gpu", "0"],
        ["link", "--gpu", "0", "--link", "1"],
        ["gpu", "--gpu", "0"],
    ],
)
def test_argument_errors(pcie_node: FakeNode, args: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        pcie_node.ctl(*args)
    assert exit_info.value.code == 2


def test_no_state_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAKE_NVML_STATE", str(tmp_path / "none.json"))
    assert fake_nvml_ctl.main(["show"]) == 1
    assert "fake-nvml init --shape" in capsys.readouterr().err


def test_faults_and_reset(pcie_node: FakeNode, capsys: pytest.CaptureFixture[str]) -> None:
    ctl = pcie_node.ctl
    assert ctl("ecc", "--gpu", "2", "--uncorrectable", "1") == 0
    assert ctl("ecc", "--gpu", "2", "--corrected", "7", "--aggregate") == 0
    assert ctl("remap", "--gpu", "1", "--pending", "--failure", "--uncorrectable", "3") == 0
    assert ctl("link", "--gpu", "0", "--link", "4", "--down") == 0
    assert ctl("gpu", "--gpu", "3", "--lost") == 0
    assert ctl("power", "--gpu", "0", "--limit-w", "175") == 0
    assert ctl("temp", "--gpu", "0", "--celsius", "91") == 0
    assert ctl("process", "--gpu", "0", "--pid", "77", "--add") == 0
    assert ctl("kernel-version", "550.54.15") == 0
    state = pcie_node.state()
    gpus = state["gpus"]
    assert gpus[2]["ecc"]["volatile"] == {"corrected": 0, "uncorrected": 1}
    assert gpus[2]["ecc"]["aggregate"] == {"corrected": 7, "uncorrected": 1}
    assert gpus[1]["remapped_rows"] == {
        "correctable": 0,
        "uncorrectable": 3,
        "pending": 1,
        "failure": 1,
        "histogram": {"max": 639, "high": 0, "partial": 0, "low": 0, "none": 1},  # a bank out of spare rows
    }
    assert not gpus[0]["nvlinks"][4]["active"] and not gpus[1]["nvlinks"][4]["active"]  # both ends
    assert gpus[3]["lost"] and gpus[0]["power"]["limit_mw"] == 175000
    assert state["kernel_module_version"] == "550.54.15"
    capsys.readouterr()
    assert ctl("show") == 0
    shown = capsys.readouterr().out
    assert "NVML init fails: Driver/library version mismatch" in shown and "[LOST]" in shown
    assert ctl("show", "--json") == 0
    assert json.loads(capsys.readouterr().out) == state

    assert ctl("reset") == 0
    fresh = fake_nvml_ctl.build_state(pcie_node.shape, pcie_node.host)
    assert pcie_node.state() == fresh


def test_gpu_restore_and_process_clear(pcie_node: FakeNode) -> None:
    pcie_node.ctl("gpu", "--gpu", "1", "--remove")
    assert not pcie_node.gpu(1)["present"]
    pcie_node.ctl("gpu", "--gpu", "1", "--restore")
    assert pcie_node.gpu(1)["present"] and not pcie_node.gpu(1)["lost"]
    pcie_node.ctl("process", "--gpu", "0", "--pid", "1", "--add")
    pcie_node.ctl("process", "--gpu", "0", "--pid", "2", "--add")
    pcie_node.ctl("process", "--gpu", "0", "--pid", "1", "--clear")
    assert [p["pid"] for p in pcie_node.gpu(0)["processes"]] == [2]
    pcie_node.ctl("process", "--gpu", "0", "--clear")
    assert pcie_node.gpu(0)["processes"] == []


def test_cli_runs_as_a_script_with_stdlib_only(pcie_node: FakeNode, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": ""}
    # -I: no PYTHONPATH, no user site; -S: no site module, so no site-packages (the venv's included)
    out = subprocess.run(
        [sys.executable, "-I", "-S", str(FAKE_NVML_DIR / "fake_nvml_ctl.py"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert "kernel-version" in out.stdout


# --- the fake pynvml itself ---------------------------------------------------------------------


def test_calls_before_init_are_uninitialized(pcie_node: FakeNode) -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_init_errors(pcie_node: FakeNode) -> None:
    pcie_node.ctl("kernel-version", "535.104.05")
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch) as info:
        pynvml.nvmlInit()
    assert info.value.value == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    pcie_node.remove_library()
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()


@pytest.fixture
def nvml(pcie_node: FakeNode) -> Any:
    pynvml.nvmlInit()
    yield pynvml
    pynvml.nvmlShutdown()


def test_writes_change_the_state_file(pcie_node: FakeNode, nvml: Any) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceSetPowerManagementLimit(handle, 180000)
    nvml.nvmlDeviceSetPersistenceMode(handle, nvml.NVML_FEATURE_ENABLED)
    assert pcie_node.gpu(1)["power"]["limit_mw"] == 180000
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 180000
    assert nvml.nvmlDeviceGetPersistenceMode(handle) == 1
    assert not list(Path(pcie_node.state_path).parent.glob(".state-*"))  # no temp files left


def test_write_errors(pcie_node: FakeNode, nvml: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetPowerManagementLimit(handle, 251000)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetPersistenceMode(handle, 7)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceSetTemperatureThreshold(handle, nvml.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR, 80)
    monkeypatch.setattr(pynvml.os, "geteuid", lambda: 1000)
    with pytest.raises(nvml.NVMLError_NoPermission):
        nvml.nvmlDeviceSetPowerManagementLimit(handle, 200000)
    assert pcie_node.gpu(0)["power"]["limit_mw"] == 250000


def test_lookups_and_queries(pcie_node: FakeNode, nvml: Any) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(2)
    uuid = nvml.nvmlDeviceGetUUID(handle)
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(uuid)) == 2
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByPciBusId("0000:B1:00.0")) == 2
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-nope")
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(4)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(handle, 18)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(handle, 12)
    assert nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, 0) == nvml.NVML_NVLINK_DEVICE_TYPE_GPU
    assert nvml.nvmlDeviceGetTopologyCommonAncestor(handle, nvml.nvmlDeviceGetHandleByIndex(0)) == 50
    assert nvml.nvmlDeviceGetTotalEccErrors(handle, 1, nvml.NVML_VOLATILE_ECC) == 0
    assert nvml.nvmlDeviceGetMemoryErrorCounter(handle, 1, 0, nvml.NVML_MEMORY_LOCATION_DRAM) == 0
    assert nvml.nvmlDeviceGetTemperatureThreshold(handle, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 89
    assert nvml.nvmlDeviceGetCudaComputeCapability(handle) == (8, 0)
    assert nvml.nvmlDeviceGetMemoryInfo(handle, nvml.nvmlMemory_v2).total == 40960 * 1024 * 1024
    assert nvml.nvmlSystemGetNVMLVersion() == "12.535.183.06"


def test_handle_of_a_gpu_lost_later(pcie_node: FakeNode, nvml: Any) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(3)
    pcie_node.ctl("gpu", "--gpu", "3", "--lost")
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetName(handle)
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(3)
    assert nvml.nvmlDeviceGetCount() == 4


def test_show_json_and_load_round_trip(
    pcie_node: FakeNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "saved.json"
    capsys.readouterr()
    pcie_node.ctl("show", "--json")
    saved.write_text(capsys.readouterr().out)
    pcie_node.ctl("ecc", "--gpu", "0", "--uncorrectable", "1")
    assert pcie_node.ctl("load", str(saved)) == 0
    assert pcie_node.state() == json.loads(saved.read_text())
    saved.write_text("{}")
    assert pcie_node.ctl("load", str(saved)) == 1
    assert "not a fake-nvml state" in capsys.readouterr().err
