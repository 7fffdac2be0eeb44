"""gpu_topology: NVLink pairs over bridges and NVSwitches, GPU count, and every failure listed."""

from __future__ import annotations

from typing import Any

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
