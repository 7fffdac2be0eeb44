"""gpu_topology: NVLink pairs over bridges and NVSwitches, GPU count, and every failure listed."""

from __future__ import annotations

from typing import Any

import gpu_facts
import gpu_settings
import gpu_topology
import pytest
from conftest import FakeNode, run_module

PCIE_PAIRS = [[0, 1], [2, 3]]


def test_pcie_bridged_pairs_pass(pcie_node: FakeNode) -> None:
    failed, result = run_module(
        gpu_topology, {"nvlink_pairs": PCIE_PAIRS, "min_links_per_pair": 12, "gpu_count": 4}
    )
    assert not failed, result["msg"]
    assert result["changed"] is False
    assert result["missing_pairs"] == []
    assert [p["active_links"] for p in result["pairs"]] == [12, 12]
    assert result["topology"][0][1] == "NV12" and result["topology"][0][2] == "SYS"


def test_pcie_unbridged_pair_is_missing(pcie_node: FakeNode) -> None:
    failed, result = run_module(gpu_topology, {"nvlink_pairs": [[0, 1], [1, 2]]})
    assert failed
    assert result["missing_pairs"] == [[1, 2]]
    assert "GPUs 1-2: 0 active NVLink(s), need at least 1" in result["msg"]


def test_hgx_every_pair_through_nvswitches(hgx_node: FakeNode) -> None:
    pairs = [[a, b] for a in range(8) for b in range(a + 1, 8)]
    failed, result = run_module(
        gpu_topology, {"nvlink_pairs": pairs, "min_links_per_pair": 12, "gpu_count": 8}
    )
    assert not failed, result["msg"]
    assert all(p["active_links"] == 12 for p in result["pairs"])
    assert all(
        cell == "NV12" for i, row in enumerate(result["topology"]) for j, cell in enumerate(row) if i != j
    )


def test_hgx_one_link_down_fails_a_strict_check(hgx_node: FakeNode) -> None:
    hgx_node.ctl("link", "--gpu", "4", "--link", "7", "--down")
    failed, result = run_module(gpu_topology, {"nvlink_pairs": [[0, 4], [0, 1]], "min_links_per_pair": 12})
    assert failed and result["missing_pairs"] == [[0, 4]]
    assert "11 active NVLink(s), need at least 12" in result["msg"]


def test_every_problem_is_listed_at_once(pcie_node: FakeNode) -> None:
    for link in range(12):
        pcie_node.ctl("link", "--gpu", "2", "--link", str(link), "--down")
    pcie_node.ctl("gpu", "--gpu", "0", "--remove")
    failed, result = run_module(
        gpu_topology, {"nvlink_pairs": [[0, 1], [1, 2], [0, 3]], "gpu_count": 4, "min_links_per_pair": 12}
    )
    assert failed
    # After the removal NVML renumbers: old GPUs 1,2,3 are now 0,1,2; old pair 2-3 is now 1-2.
    assert "expected 4 GPUs, found 3" in result["msg"]
    assert "GPUs 1-2: 0 active NVLink(s)" in result["msg"]
    assert "GPUs 0-3: GPU 3 not present" in result["msg"]
    assert result["missing_pairs"] == [[0, 1], [1, 2], [0, 3]]


def test_wrong_gpu_count_alone_fails(node: FakeNode) -> None:
    failed, result = run_module(gpu_topology, {"gpu_count": 2})
    assert failed and f"expected 2 GPUs, found {node.gpu_count}" in result["msg"]
    assert result["gpu_count"] == node.gpu_count


def test_lost_gpu_in_a_pair(pcie_node: FakeNode) -> None:
    pcie_node.ctl("gpu", "--gpu", "3", "--lost")
    failed, result = run_module(gpu_topology, {"nvlink_pairs": PCIE_PAIRS})
    assert failed and result["missing_pairs"] == [[2, 3]]
    assert "GPU is lost" in result["msg"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"nvlink_pairs": [[0, 0]]}, "two different GPU indices"),
        ({"nvlink_pairs": [[0, 1, 2]]}, "not a pair"),
        ({"nvlink_pairs": [["a", 1]]}, "not a pair"),
        ({"nvlink_pairs": [[0, 1]], "min_links_per_pair": 0}, "at least 1"),
    ],
)
def test_bad_input(pcie_node: FakeNode, args: dict[str, Any], message: str) -> None:
    failed, result = run_module(gpu_topology, args)
    assert failed and message in result["msg"]


def test_driver_missing(pcie_node: FakeNode) -> None:
    pcie_node.remove_library()
    failed, result = run_module(gpu_topology, {"nvlink_pairs": PCIE_PAIRS})
    assert failed and "NVIDIA driver is not installed" in result["msg"]


# --- facts, check: false, settings: the one read of role gpu_tuning ---------------------------------------

WANTED = {"power_limit_w": 200, "persistence_mode": True}


def test_facts_are_gpu_facts_own(pcie_node: FakeNode) -> None:
    failed, result = run_module(gpu_topology, {"nvlink_pairs": PCIE_PAIRS, "facts": True})
    assert not failed, result["msg"]
    failed, facts = run_module(gpu_facts)
    assert not failed, facts["msg"]
    assert result["ansible_facts"]["nvidia"] == facts["ansible_facts"]["nvidia"]
    # without the option, no facts (the check alone, as before)
    assert "ansible_facts" not in run_module(gpu_topology, {"nvlink_pairs": PCIE_PAIRS})[1]


def test_check_false_reports_the_problems_without_failing(pcie_node: FakeNode) -> None:
    args = {"nvlink_pairs": [[0, 1], [1, 2]], "gpu_count": 3, "check": False, "facts": True}
    failed, result = run_module(gpu_topology, args)
    assert not failed
    assert result["missing_pairs"] == [[1, 2]]
    assert result["problems"] == ["expected 3 GPUs, found 4", "GPUs 1-2: 0 active NVLink(s), need at least 1"]
    assert result["ansible_facts"]["nvidia"]["gpu_count"] == 4
    failed, result = run_module(gpu_topology, {"nvlink_pairs": PCIE_PAIRS, "check": False})
    assert not failed and result["problems"] == []


def test_check_false_still_fails_where_nvml_does_not_answer(pcie_node: FakeNode) -> None:
    pcie_node.remove_library()
    failed, result = run_module(gpu_topology, {"check": False, "facts": True})
    assert failed and "NVIDIA driver is not installed" in result["msg"] and "ansible_facts" not in result


def test_boot_id_of_the_read(pcie_node: FakeNode) -> None:
    _failed, result = run_module(gpu_topology, {})
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as source:
        assert result["boot_id"] == source.read().strip()


def pending_and_settings_run(
    settings: dict[str, Any], unsupported: str = "warn"
) -> tuple[list[Any], bool, bool]:
    """What the read finds pending, and whether gpu_settings given the same values then changes or fails
    (or warns): the read must find something pending exactly where gpu_settings has something to do."""
    failed, read = run_module(gpu_topology, {"settings": settings})
    assert not failed, read["msg"]
    args = {name: value for name, value in settings.items() if value is not None}
    failed, applied = run_module(gpu_settings, {**args, "unsupported": unsupported})
    return read["settings_pending"], bool(applied.get("changed")) or failed, bool(applied["warnings"])


def test_settings_pending_is_what_gpu_settings_changes(pcie_node: FakeNode) -> None:
    # a fresh node: 250 W and persistence mode off on every GPU
    pending, acted, _warned = pending_and_settings_run(WANTED)
    assert acted
    assert [(p["gpu"], p["setting"], p["action"]) for p in pending] == [
        (gpu, setting, "change") for gpu in range(4) for setting in ("power_limit_w", "persistence_mode")
    ]
    # converged: nothing pending, and gpu_settings indeed changes nothing
    pending, acted, _warned = pending_and_settings_run(WANTED)
    assert pending == [] and not acted
    # the lab's drift: one GPU's power cap changed through the fake NVML
    pcie_node.ctl("power", "--gpu", "2", "--limit-w", "180")
    failed, read = run_module(gpu_topology, {"settings": WANTED, "facts": True})
    assert not failed
    assert read["settings_pending"] == [
        {
            "gpu": 2,
            "setting": "power_limit_w",
            "action": "change",
            "before": 180,
            "after": 200,
            "message": "GPU 2 (00000000:B1:00.0): power_limit_w 180 -> 200 W",
        }
    ]
    pending, acted, _warned = pending_and_settings_run(WANTED)
    assert pending and acted
    assert run_module(gpu_topology, {"settings": WANTED})[1]["settings_pending"] == []


def test_settings_pending_only_on_the_managed_gpus(pcie_node: FakeNode) -> None:
    pending_and_settings_run(WANTED)
    pcie_node.ctl("power", "--gpu", "3", "--limit-w", "180")
    pending, acted, _warned = pending_and_settings_run({**WANTED, "gpus": [0, 1]})
    assert pending == [] and not acted
    pending, acted, _warned = pending_and_settings_run({**WANTED, "gpus": [3]})
    assert [(p["gpu"], p["action"]) for p in pending] == [(3, "change")] and acted


@pytest.mark.parametrize(
    ("settings", "action"),
    [
        ({"power_limit_w": 400}, "out_of_range"),
        ({"power_limit_w": 200, "gpus": [7]}, "absent"),
        ({"target_temperature_c": 80}, "unsupported"),  # A100s have none: gpu_settings warns every run
        ({"persistence_mode": True}, "change"),  # off on a fresh fake node
    ],
)
def test_settings_pending_wherever_gpu_settings_fails_or_warns(
    pcie_node: FakeNode, settings: dict[str, Any], action: str
) -> None:
    pending, acted, warned = pending_and_settings_run(settings)
    assert action in {p["action"] for p in pending}
    assert acted or warned
