"""gpu_settings: idempotence, validation before change, check/diff mode, unsupported and error paths."""

from __future__ import annotations

from typing import Any

import gpu_settings
import pytest
from conftest import FakeNode, run_module


def limits(node: FakeNode) -> list[int]:
    return [g["power"]["limit_mw"] for g in node.state()["gpus"]]


def supports_target_temperature(node: FakeNode, current: int = 83) -> None:
    """Make every GPU one with a settable target temperature (fan-cooled boards have one)."""

    def change(state: dict[str, Any]) -> None:
        for gpu in state["gpus"]:
            gpu["temperature"].update(target=current, target_min=65, target_max=88)

    node.edit(change)


def test_power_limit_changes_once_then_is_ok(node: FakeNode) -> None:
    failed, result = run_module(gpu_settings, {"power_limit_w": 200})
    assert not failed and result["changed"]
    assert limits(node) == [200000] * node.gpu_count
    assert all(g["power_limit_w"] == 200 and g["changed"] == ["power_limit_w"] for g in result["gpus"])
    assert "power_limit_w" in result["msg"] and "-> 200 W" in result["msg"]

    failed, again = run_module(gpu_settings, {"power_limit_w": 200})
    assert not failed and not again["changed"]
    assert again["msg"] == "all requested settings already in place"


def test_out_of_range_fails_naming_the_gpu_and_range_and_changes_nothing(pcie_node: FakeNode) -> None:
    failed, result = run_module(gpu_settings, {"power_limit_w": 300, "persistence_mode": True})
    assert failed
    assert "GPU 0 (00000000:17:00.0)" in result["msg"]
    assert "150-250 W" in result["msg"]
    assert "Nothing changed" in result["msg"]
    assert limits(pcie_node) == [250000] * 4
    assert all(g["persistence_mode"] == 0 for g in pcie_node.state()["gpus"])


def test_hgx_range_is_its_own(hgx_node: FakeNode) -> None:
    failed, result = run_module(gpu_settings, {"power_limit_w": 50})
    assert failed and "100-400 W" in result["msg"]
    failed, result = run_module(gpu_settings, {"power_limit_w": 300})
    assert not failed and result["changed"]
    assert limits(hgx_node) == [300000] * 8


def test_check_mode_with_diff_shows_before_after_and_changes_nothing(pcie_node: FakeNode) -> None:
    before = pcie_node.state()
    failed, result = run_module(
        gpu_settings, {"power_limit_w": 200, "persistence_mode": True}, check_mode=True, diff=True
    )
    assert not failed and result["changed"]
    assert result["diff"]["before"]["gpu0"] == {"power_limit_w": 250, "persistence_mode": False}
    assert result["diff"]["after"]["gpu0"] == {"power_limit_w": 200, "persistence_mode": True}
    assert set(result["diff"]["before"]) == {"gpu0", "gpu1", "gpu2", "gpu3"}
    assert pcie_node.state() == before


def test_diff_only_in_diff_mode(pcie_node: FakeNode) -> None:
    failed, result = run_module(gpu_settings, {"power_limit_w": 200})
    assert not failed and "diff" not in result


def test_only_the_selected_gpus_and_only_what_differs(pcie_node: FakeNode) -> None:
    pcie_node.ctl("power", "--gpu", "3", "--limit-w", "200")
    failed, result = run_module(gpu_settings, {"power_limit_w": 200, "gpus": [2, 3]}, diff=True)
    assert not failed and result["changed"]
    assert [g["index"] for g in result["gpus"]] == [2, 3]
    assert result["diff"]["after"] == {"gpu2": {"power_limit_w": 200}}
    assert limits(pcie_node) == [250000, 250000, 200000, 200000]


def test_drift_is_put_back(pcie_node: FakeNode) -> None:
    run_module(gpu_settings, {"power_limit_w": 200})
    pcie_node.ctl("power", "--gpu", "1", "--limit-w", "175")
    failed, result = run_module(gpu_settings, {"power_limit_w": 200})
    assert not failed and result["changed"]
    assert "power_limit_w 175 -> 200 W on GPU 1" in result["msg"]


def test_persistence_mode(node: FakeNode) -> None:
    failed, result = run_module(gpu_settings, {"persistence_mode": True})
    assert not failed and result["changed"]
    assert all(g["persistence_mode"] == 1 for g in node.state()["gpus"])
    failed, result = run_module(gpu_settings, {"persistence_mode": True})
    assert not failed and not result["changed"]
    failed, result = run_module(gpu_settings, {"persistence_mode": False})
    assert result["changed"] and all(g["persistence_mode"] == 0 for g in node.state()["gpus"])


def test_unknown_gpu_index_fails(pcie_node: FakeNode) -> None:
    failed, result = run_module(gpu_settings, {"power_limit_w": 200, "gpus": [1, 7]})
    assert failed and "No GPU 7" in result["msg"] and "0-3" in result["msg"]
    assert limits(pcie_node) == [250000] * 4


def test_some_setting_is_required(pcie_node: FakeNode) -> None:
    failed, result = run_module(gpu_settings, {"gpus": [0]})
    assert failed and "one of the following is required" in result["msg"]


def test_target_temperature_unsupported_on_a100_fails_by_default(node: FakeNode) -> None:
    failed, result = run_module(gpu_settings, {"target_temperature_c": 80, "power_limit_w": 200})
    assert failed
    assert "does not support target_temperature_c" in result["msg"]
    assert limits(node)[0] == node.state()["gpus"][0]["power"]["default_mw"]


def test_target_temperature_unsupported_warns_and_skips_with_warn(pcie_node: FakeNode) -> None:
    failed, result = run_module(
        gpu_settings, {"target_temperature_c": 80, "power_limit_w": 200, "unsupported": "warn"}
    )
    assert not failed and result["changed"]
    assert limits(pcie_node) == [200000] * 4
    assert any("does not support target_temperature_c" in w for w in result["warnings"])
    assert result["gpus"][0]["target_temperature_c"] is None


def test_target_temperature_where_supported(pcie_node: FakeNode) -> None:
    supports_target_temperature(pcie_node)
    failed, result = run_module(gpu_settings, {"target_temperature_c": 80}, diff=True)
    assert not failed and result["changed"]
    assert result["diff"]["before"]["gpu0"] == {"target_temperature_c": 83}
    assert [g["temperature"]["target"] for g in pcie_node.state()["gpus"]] == [80] * 4
    failed, result = run_module(gpu_settings, {"target_temperature_c": 95})
    assert failed and "65-88 C" in result["msg"]


def test_no_permission_names_become(pcie_node: FakeNode, not_root: None) -> None:
    failed, result = run_module(gpu_settings, {"power_limit_w": 200})
    assert failed
    assert "insufficient permissions" in result["msg"] and "become: true" in result["msg"]
    assert limits(pcie_node) == [250000] * 4


def test_no_permission_is_no_problem_when_nothing_changes(pcie_node: FakeNode, not_root: None) -> None:
    failed, result = run_module(gpu_settings, {"power_limit_w": 250})
    assert not failed and not result["changed"]


def test_lost_gpu_fails_with_the_fix(pcie_node: FakeNode) -> None:
    pcie_node.ctl("gpu", "--gpu", "2", "--lost")
    failed, result = run_module(gpu_settings, {"power_limit_w": 200})
    assert failed and "GPU 2" in result["msg"] and "GPU is lost" in result["msg"]
    assert limits(pcie_node) == [250000] * 4


def test_power_management_unsupported(pcie_node: FakeNode) -> None:
    pcie_node.edit(lambda s: s["gpus"][1].update(power=None))
    failed, result = run_module(gpu_settings, {"power_limit_w": 200})
    assert failed and "GPU 1 (00000000:31:00.0) does not support power_limit_w" in result["msg"]
    failed, result = run_module(gpu_settings, {"power_limit_w": 200, "unsupported": "warn"})
    assert not failed and result["changed"]
    assert [g["index"] for g in result["gpus"] if g["changed"]] == [0, 2, 3]


@pytest.mark.parametrize("fault", ["no_library", "mismatch"])
def test_nvml_start_failures(pcie_node: FakeNode, fault: str) -> None:
    if fault == "no_library":
        pcie_node.remove_library()
    else:
        pcie_node.ctl("kernel-version", "535.104.05")
    failed, result = run_module(gpu_settings, {"power_limit_w": 200})
    assert failed
    assert ("not installed" if fault == "no_library" else "version mismatch") in result["msg"]
