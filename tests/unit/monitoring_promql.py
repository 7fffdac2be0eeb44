"""PromQL helpers for the monitoring tests: the expressions of the alert rules and the dashboards, the metric
names an expression reads, and the names the exporters of this stack really emit."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
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


class ServingStack:
    """The simulator and the gateway in front of it as real processes (the venv's `vllm-sim` and
    `llm-gateway`), with auth off; the simulator can be stopped and started again on the same port."""

    def __init__(self, tmp: Path) -> None:
        import sys

        self.bin = Path(sys.executable).parent
        self.tmp = tmp
        self.sim: subprocess.Popen[bytes] | None = None
        self.gateway: subprocess.Popen[bytes] | None = None
        self.sim_port = 0
        self.ports: dict[str, int] = {}

    @property
    def installed(self) -> bool:
        return (self.bin / "vllm-sim").exists() and (self.bin / "llm-gateway").exists()

    def _wait_port_file(self, path: Path, proc: subprocess.Popen[bytes]) -> dict[str, int]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if path.exists():
                return json.loads(path.read_text())
            assert proc.poll() is None, f"{proc.args} exited {proc.returncode}"
            time.sleep(0.05)
        raise AssertionError(f"{proc.args} wrote no port file")

    def start_sim(self) -> None:
        port_file = self.tmp / "sim.json"
        port_file.unlink(missing_ok=True)
        cmd = [str(self.bin / "vllm-sim"), "--port", str(self.sim_port), "--port-file", str(port_file)]
        self.sim = subprocess.Popen([*cmd, "--served-model-name", "m", "--reply", "a", "b"])
        self.sim_port = self._wait_port_file(port_file, self.sim)["port"]

    def stop_sim(self) -> None:
        assert self.sim is not None
        self.sim.terminate()
        self.sim.wait(timeout=10)
        self.sim = None

    def start(self) -> None:
        self.start_sim()
        upstream = {
            "name": "stable",
            "url": f"http://127.0.0.1:{self.sim_port}",
            "served_model": "m",
            "weight": 1,
        }
        config = {
            "listen": {"host": "127.0.0.1", "port": 0},
            "internal": {"host": "127.0.0.1", "port": 0},
            "auth": {"mode": "none"},
            "models": {"m": {"upstreams": [upstream]}},
            "audit": {"path": str(self.tmp / "audit.jsonl")},
        }
        (self.tmp / "gateway.json").write_text(json.dumps(config))
        cmd = [str(self.bin / "llm-gateway"), "--config", str(self.tmp / "gateway.json")]
        self.gateway = subprocess.Popen([*cmd, "--port-file", str(self.tmp / "gw.json")])
        self.ports = self._wait_port_file(self.tmp / "gw.json", self.gateway)

    def chat(self) -> str:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        return http_get(f"http://127.0.0.1:{self.ports['listen']}/v1/chat/completions", body)

    def stop(self) -> None:
        for proc in (self.sim, self.gateway):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)


def http_get(url: str, data: bytes | None = None) -> str:
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()
