"""PromQL helpers for the monitoring tests: the expressions of the alert rules and the dashboards, the metric
names an expression reads, and the names the exporters of this stack really emit."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "monitoring"
RULES = ROLE / "files" / "prometheus" / "alert-rules.yml"
DASHBOARDS = sorted((ROLE / "files" / "grafana" / "dashboards").glob("*.json"))
COUNTERS = ROLE / "files" / "dcgm-exporter" / "counters.csv"

# Grafana's variables, replaced by values of the same syntactic kind before PromQL parses the expression
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
_KEYWORDS_WITH_LABEL_LIST = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_OPERATOR_WORDS = {"and", "or", "unless", "bool", "offset", "atan2"}
# aggregations may put `by (...)` between their name and their `(`: `sum by (le) (rate(...))`
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk"}
_AGGREGATIONS |= {"topk", "quantile", "limitk", "limit_ratio"}
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*[A-Za-z_][A-Za-z0-9_]*\)$")


def rule_exprs() -> Iterator[tuple[str, str]]:
    """(alert name, expr) of every rule in the alert rule file."""
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]


def dashboard(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable (label_values' selector)."""
    for path in DASHBOARDS:
        board = dashboard(path)
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                yield f"{path.name} panel {panel['id']} {target['refId']}", target["expr"]
        for var in board["templating"]["list"]:
            if var["type"] != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = _LABEL_VALUES.match(query)
            assert match, f"{path.name} variable {var['name']}: only label_values(selector, label) is used"
            yield f"{path.name} variable {var['name']}", match["selector"]


def as_promql(expr: str) -> str:
    """A dashboard expression with Grafana's variables replaced ($name inside a label matcher -> .*)."""
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return re.sub(r"\$[A-Za-z_][A-Za-z0-9_]*", ".*", expr)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers outside strings, label matchers, ranges and label
    lists (by/on/...), not followed by `(` (functions, aggregations)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    names: set[str] = set()
    tokens = list(re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*|\(|\)", text))
    i = 0
    while i < len(tokens):
        token = tokens[i].group()
        following = text[tokens[i].end() :].lstrip()
        if token in _KEYWORDS_WITH_LABEL_LIST and following.startswith("("):
            depth = 0
            while i < len(tokens):  # skip the label list
                depth += {"(": 1, ")": -1}.get(tokens[i].group(), 0)
                if tokens[i].group() == ")" and depth == 0:
                    break
                i += 1
        elif (
            token not in "()"
            and token not in _OPERATOR_WORDS | _AGGREGATIONS
            and not following.startswith("(")
        ):
            start = tokens[i].start()
            if not (start and (text[start - 1].isdigit() or text[start - 1] == ".")):  # 5m, 1e3
                names.add(token)
        i += 1
    return names


def dcgm_exported_names() -> set[str]:
    """The Prometheus names dcgm-exporter exports for the counters file: the DCGM field name itself, for
    every field of type gauge or counter (type `label` adds a label, not a series)."""
    names = set()
    for line in COUNTERS.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        field, kind, *_ = (part.strip() for part in line.split(","))
        if kind in ("gauge", "counter"):
            names.add(field)
    return names


def exposition_names(text: str) -> set[str]:
    """Series names of a Prometheus text exposition, including those a family declares but has not yet
    observed (a labelled counter before its first increment): counters `_total`, histograms `_bucket`,
    `_sum`, `_count`."""
    from prometheus_client.parser import text_string_to_metric_families

    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("_sum", "_count"),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names
