"""The Grafana dashboards load as dashboard JSON: schema version, unique panel ids, every panel and query
on the datasource chosen by the `datasource` variable (never a fixed one), the three boards and their
panels the serving stage promises (docs/serving.md)."""

from __future__ import annotations

from typing import Any

import pytest
from monitoring_promql import DASHBOARDS, dashboard

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(params=DASHBOARDS, ids=lambda p: p.name)
def board(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dashboard(request.param)


def test_the_three_boards_and_their_panels() -> None:
    titles = {dashboard(p)["uid"]: {panel["title"] for panel in dashboard(p)["panels"]} for p in DASHBOARDS}
    assert set(titles) == {"llm-serving-overview", "llm-serving-vllm-instance", "llm-serving-gpu-health"}
    assert titles["llm-serving-overview"] == {
        "Latency p50 / p99 (gateway, completions)",
        "Requests per second",
        "Error rate (5xx share)",
        "GPU utilisation",
    }
    assert titles["llm-serving-vllm-instance"] == {
        "Requests running",
        "Requests waiting",
        "KV-cache usage",
        "Time to first token p50 / p99",
    }
    assert titles["llm-serving-gpu-health"] == {
        "Temperature and slowdown point",
        "Power draw against the cap",
        "ECC errors (volatile)",
        "Row remapping",
    }


def test_dashboard_model(board: dict[str, Any]) -> None:
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert board["uid"] and len(board["uid"]) <= 40 and board["title"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), f"duplicate panel ids {ids}"
    assert all(isinstance(i, int) and i > 0 for i in ids)
    variables = {var["name"]: var for var in board["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )


def test_everything_uses_the_datasource_variable(board: dict[str, Any]) -> None:
    for panel in board["panels"]:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, f"{panel['title']} {target['refId']}"
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]


def test_panels_do_not_overlap(board: dict[str, Any]) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
