"""The boot-time apply of role gpu_tuning: module_utils' apply_saved_settings against the fake NVML, and the
installed script run as systemd runs it, from only the files the role installs (no Ansible importable)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml
from ansible.module_utils.gpu_settings_core import apply_saved_settings
from conftest import FAKE_NVML_DIR, ROOT, FakeNode

ROLE = ROOT / "roles" / "gpu_tuning"
SCRIPT = ROLE / "files" / "gpu_tuning_apply.py"


def saved(**settings: Any) -> dict[str, Any]:
    return {
        "gpus": [],
        "power_limit_w": None,
        "target_temperature_c": None,
        "persistence_mode": None,
        **settings,
    }


def limits(node: FakeNode) -> list[int]:
    return [g["power"]["limit_mw"] // 1000 for g in node.state()["gpus"]]


def apply(settings: dict[str, Any]) -> tuple[list[str], list[str]]:
    pynvml.nvmlInit()
    try:
        return apply_saved_settings(pynvml, settings)
    finally:
        pynvml.nvmlShutdown()


def test_puts_drifted_settings_back_and_skips_what_the_gpu_lacks(pcie_node: FakeNode) -> None:
    pcie_node.ctl("power", "--gpu", "1", "--limit-w", "180")
    done, failures = apply(saved(power_limit_w=200, persistence_mode=True, target_temperature_c=80))
    assert failures == []
    assert limits(pcie_node) == [200] * 4
    assert all(g["persistence_mode"] == 1 for g in pcie_node.state()["gpus"])
    power_lines = [line for line in done if "power_limit_w" in line]
    assert len(power_lines) == 4
    assert "GPU 1 (00000000:31:00.0): power_limit_w 180 -> 200 W" in power_lines
    # A100s have no target temperature: said and skipped, not a failure
    assert sum("target_temperature_c not supported" in line for line in done) == 4
    again, failures = apply(saved(power_limit_w=200, persistence_mode=True))
    assert again == [] and failures == []


def test_only_the_named_gpus(pcie_node: FakeNode) -> None:
    done, failures = apply(saved(gpus=[2, 2], power_limit_w=150))
    assert failures == [] and len(done) == 1
    assert limits(pcie_node) == [250, 250, 150, 250]


def test_goes_on_after_a_failure_and_reports_it(pcie_node: FakeNode) -> None:
    pcie_node.ctl("gpu", "--gpu", "1", "--lost")
    _, failures = apply(saved(gpus=[0, 1, 7], power_limit_w=200))
    assert limits(pcie_node)[0] == 200
    assert len(failures) == 2
    assert "GPU 1" in failures[0] and "lost" in failures[0].lower()
    assert failures[1] == "GPU 7: not present (4 GPUs)"


def test_out_of_range_value_is_a_failure_not_a_crash(pcie_node: FakeNode) -> None:
    done, failures = apply(saved(gpus=[0], power_limit_w=400))
    assert done == [] and len(failures) == 1 and "GPU 0" in failures[0]
    assert limits(pcie_node)[0] == 250


def installed_module_utils() -> list[str]:
    """The module_utils files install-boot-unit.yml copies next to the script (the role's vars)."""
    return list(yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__gpu_tuning_boot_module_utils"])


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """The script and its module_utils in one directory, as the role installs them."""
    boot_dir = tmp_path / "gpu-tuning"
    boot_dir.mkdir()
    for name in installed_module_utils():
        shutil.copy(ROOT / "module_utils" / name, boot_dir / name)
    shutil.copy(SCRIPT, boot_dir / SCRIPT.name)
    return boot_dir / SCRIPT.name


def run_script(script: Path, settings_file: Path) -> subprocess.CompletedProcess[str]:
    # -S: no site-packages, so neither Ansible nor the real nvidia-ml-py; pynvml is the lab's fake
    env = {**os.environ, "PYTHONPATH": str(FAKE_NVML_DIR)}
    return subprocess.run(
        [sys.executable, "-S", str(script), str(settings_file)], capture_output=True, text=True, env=env
    )


def test_installed_script_runs_without_ansible(pcie_node: FakeNode, installed: Path, tmp_path: Path) -> None:
    pcie_node.ctl("power", "--gpu", "3", "--limit-w", "170")
    settings_file = tmp_path / "gpu-tuning.json"
    settings_file.write_text(json.dumps(saved(power_limit_w=200, persistence_mode=True)))
    proc = run_script(installed, settings_file)
    assert proc.returncode == 0, proc.stderr
    assert limits(pcie_node) == [200] * 4
    assert "power_limit_w 170 -> 200 W" in proc.stdout
    proc = run_script(installed, settings_file)
    assert proc.returncode == 0 and proc.stdout.strip() == "all settings already in place"


def test_installed_script_fails_when_nvml_cannot_start(
    pcie_node: FakeNode, installed: Path, tmp_path: Path
) -> None:
    pcie_node.ctl("kernel-version", "550.54.15")
    settings_file = tmp_path / "gpu-tuning.json"
    settings_file.write_text(json.dumps(saved(power_limit_w=200)))
    proc = run_script(installed, settings_file)
    assert proc.returncode == 1
    assert "GPU settings not applied" in proc.stderr and "version mismatch" in proc.stderr
