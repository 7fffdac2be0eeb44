"""The fake-nvml control CLI and the fake pynvml's own behaviour (writes, locking, faults)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import fake_nvml_ctl
import gpu_facts
import pynvml
import pytest
import yaml
from ansible.module_utils import gpu_host
from apt_sim import MIRROR, build_mirror_module
from conftest import FAKE_NVML_DIR, ROOT, SHAPES, FakeNode, run_module


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


# --- the loaded driver's branch: the CUDA and NVML versions NVML reports ----------------------------------
# (driver version, nvmlSystemGetCudaDriverVersion, nvmlSystemGetNVMLVersion) of a driver of each branch the
# lab's mirror carries: R535 supports CUDA 12.2, R550 12.4, R580 13.0 (NVIDIA's release notes; nvidia-smi's
# "CUDA Version"), the NVML version is "<CUDA major>.<driver version>"
BRANCH_REPORTS = [
    ("535.183.06", 12020, "12.535.183.06"),
    ("550.54.15", 12040, "12.550.54.15"),
    ("580.95.05", 13000, "13.580.95.05"),
]
REPORT_KEYS = ("kernel_module_version", "cuda_driver_version", "nvml_version")


def reported(state: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(state[key] for key in REPORT_KEYS)


def nvml_reports() -> tuple[str, int, int, str]:
    """What a client reads through the fake pynvml: driver, CUDA (both calls), NVML version."""
    pynvml.nvmlInit()
    try:
        return (
            pynvml.nvmlSystemGetDriverVersion(),
            pynvml.nvmlSystemGetCudaDriverVersion(),
            pynvml.nvmlSystemGetCudaDriverVersion_v2(),
            pynvml.nvmlSystemGetNVMLVersion(),
        )
    finally:
        pynvml.nvmlShutdown()


def init_args(node: FakeNode, version: str) -> list[str]:
    """`fake-nvml init` of the node's shape and host, its kernel module at `version` (replacing its state)."""
    return ["init", "--shape", node.shape, "--host", node.host, "--force", "--kernel-version", version]


def library_is(node: FakeNode, version: str) -> None:
    """The driver's user-space library at VERSION (its package installed), the kernel module left as it is."""
    node.library_path.write_text(f"# lab stand-in\nversion={version}\n")


@pytest.mark.parametrize(("version", "cuda", "nvml_version"), BRANCH_REPORTS)
def test_nvml_reports_the_cuda_and_nvml_versions_of_the_loaded_drivers_branch(
    pcie_node: FakeNode, version: str, cuda: int, nvml_version: str
) -> None:
    """Whichever way the driver came to be loaded: a machine initialised with it, its module loaded under its
    library (kernel-version: the lab's modprobe), a reboot with its library installed (reset). Before the
    table every driver reported a 535's CUDA 12.2, where a 580 reports 13.0 and the upgrade playbook checks
    it."""
    want = (version, cuda, nvml_version)
    assert reported(fake_nvml_ctl.build_state(pcie_node.shape, pcie_node.host, version)) == want
    init = init_args(pcie_node, version)
    assert pcie_node.ctl(*init) == 0
    assert reported(pcie_node.state()) == want

    for load in (("kernel-version", version), ("reset",)):
        assert pcie_node.ctl("init", "--shape", pcie_node.shape, "--host", pcie_node.host, "--force") == 0
        assert reported(pcie_node.state()) == BRANCH_REPORTS[0]  # 535.183.06 loaded
        library_is(pcie_node, version)
        assert pcie_node.ctl(*load) == 0, load
        assert reported(pcie_node.state()) == want, load
        assert nvml_reports() == (version, cuda, cuda, nvml_version), load


@pytest.mark.parametrize("version", ["570.133.20", "999.1.2", "nvidia"])
def test_a_driver_of_a_branch_the_table_lacks_is_refused(
    pcie_node: FakeNode, capsys: pytest.CaptureFixture[str], version: str
) -> None:
    """No CUDA version is made up for a branch the fake does not know (570 is real, but the lab has no
    library of it): refused, naming the version and the known branches, with the state left as it was."""
    with pytest.raises(fake_nvml_ctl.CtlError) as info:
        fake_nvml_ctl.build_state(pcie_node.shape, pcie_node.host, version)
    message = str(info.value)
    assert repr(version) in message and "known branches: 535, 550, 580" in message, message
    before = pcie_node.state()
    capsys.readouterr()
    init = init_args(pcie_node, version)
    library_is(pcie_node, version)  # for the reset (a reboot loads the installed library's driver)
    for args in (init, ["kernel-version", version], ["reset"]):
        assert pcie_node.ctl(*args) == 1, args
        err = capsys.readouterr().err
        assert err.startswith("fake-nvml: error: ") and message in err and "Traceback" not in err, err
        assert pcie_node.state() == before, args


def test_the_branch_table_is_the_serving_roles_and_covers_the_mirrors_branches() -> None:
    """The CUDA each branch reports is the newest CUDA the serving stage says it runs (the one table the
    product has, roles/vllm_serving/vars/main.yml), and every driver branch the lab's mirror carries has an
    entry: the mirror's nvidia-dkms stand-in loads its version through `fake-nvml kernel-version`."""
    serving = yaml.safe_load((ROOT / "roles/vllm_serving/vars/main.yml").read_text())
    max_cuda = serving["vllm_serving_driver_max_cuda"]
    for branch, cuda in fake_nvml_ctl.CUDA_BY_BRANCH.items():
        assert max_cuda.get(branch) == f"{cuda // 1000}.{cuda % 1000 // 10}", branch
    packages = yaml.safe_load((MIRROR / "packages.yml").read_text())
    assert {release["branch"] for release in packages["driver_branches"]} == set(fake_nvml_ctl.CUDA_BY_BRANCH)


def driver_files(branch: str, version: str) -> tuple[str, str]:
    """The nvidia-dkms stand-in's module hook and the NVML library file of one driver release, as
    tests/lab/mirror/build_mirror.py puts them in its packages."""
    packages = {p.name: p for p in build_mirror_module().driver_packages(branch, version, "cuda")}
    hook = packages[f"nvidia-dkms-{branch}"].files["/usr/lib/lab-kmod/hooks/nvidia"][0]
    library = packages[f"libnvidia-compute-{branch}"].files["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"][0]
    return hook, library


def test_the_branch_upgrade_as_the_labs_stand_ins_do_it(
    pcie_node: FakeNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """535 -> 580 -> 535 on a lab node, without a reboot (the lab's nvidia_driver_reboot is false): the 580
    packages put their library in place (NVML: the mismatch, the 535 module still loaded), then the module
    reload runs the nvidia-dkms-580 stand-in's hook as the lab's modprobe does (`HOOK load`, the hook as the
    mirror ships it): gpu_facts, which playbooks/upgrade-driver.yml verifies the node with, reports driver
    580.95.05 and CUDA 13.0; the way back to 535 reports 12.2 again."""
    ctl = tmp_path / "fake-nvml"
    ctl.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_NVML_DIR / "fake_nvml_ctl.py"} "$@"\n')
    ctl.chmod(0o755)
    # gpu_facts reads this machine's /proc and PCI devices too: empty ones here
    for name, attribute in (("proc", "PROC_ROOT"), ("pci-devices", "PCI_DEVICES_DIR")):
        (tmp_path / name).mkdir()
        monkeypatch.setattr(gpu_host, attribute, str(tmp_path / name))

    def upgrade_to(branch: str, version: str) -> dict[str, Any]:
        hook, library = driver_files(branch, version)
        pcie_node.library_path.write_text(library)
        with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
            pynvml.nvmlInit()
        # the hook's paths on a node, here this test's (each must be in it: the hook is what the test runs)
        for path, here in (
            ("/usr/local/sbin/fake-nvml", ctl),
            ("/var/lib/fake-nvml/state.json", pcie_node.state_path),
            ("/dev/nvidiactl", tmp_path / "nvidiactl"),
        ):
            assert path in hook, path
            hook = hook.replace(path, str(here))
        script = tmp_path / f"hook-{branch}"
        script.write_text(hook)
        loaded = subprocess.run(["sh", str(script), "load"], capture_output=True, text=True, check=False)
        assert loaded.returncode == 0, loaded.stderr
        failed, result = run_module(gpu_facts)
        assert not failed, result["msg"]
        return dict(result["ansible_facts"]["nvidia"])

    nvidia = upgrade_to("580", "580.95.05")
    assert (nvidia["driver_version"], nvidia["cuda_driver_version"]) == ("580.95.05", "13.0")
    assert nvidia["nvml_version"] == "13.580.95.05"
    assert reported(pcie_node.state()) == BRANCH_REPORTS[2]

    nvidia = upgrade_to("535", "535.183.06")
    assert (nvidia["driver_version"], nvidia["cuda_driver_version"]) == ("535.183.06", "12.2")
    assert reported(pcie_node.state()) == BRANCH_REPORTS[0]


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
