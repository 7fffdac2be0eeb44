"""Every metric name the alert rules and the dashboards read is one an exporter of this stack emits: the
simulator's /metrics (vLLM's names of the pinned version), the gateway's internal /metrics, dcgm-exporter
for the role's counters file, the GPU health agent's /metrics (module_utils/gpu_health_agent.py, after a
poll), the control plane's metrics exporter (roles control_plane_metrics and etcd_backup), or Prometheus
itself (`up`). Both serving processes are started for real.
The article's alert on `vllm_request_success_total` is the example of a name nobody emits."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible.module_utils.gpu_health_agent import Agent, Config
from lab.upstream_manifests import UpstreamError, manifest
from monitoring_promql import (
    COUNTERS,
    ServingStack,
    as_promql,
    dashboard_exprs,
    dcgm_exported_names,
    exposition_names,
    http_get,
    metric_names,
    rule_exprs,
)

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_COUNTERS = "dcgm-exporter/4.5.3-4.8.2/default-counters.csv"  # lab/upstream_manifests.py
PROMETHEUS_OWN = {"up"}  # written by Prometheus for every target


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The simulator and the gateway in front of it, as processes; their /metrics after one request."""
    stack = ServingStack(tmp_path_factory.mktemp("serving"))
    if not stack.installed:
        pytest.skip("serve/ is not installed in this venv (make venv installs it)")
    try:
        stack.start()
        stack.chat()
        yield {
            "vllm": http_get(f"http://127.0.0.1:{stack.sim_port}/metrics"),
            "gateway": http_get(f"http://127.0.0.1:{stack.ports['internal']}/metrics"),
        }
    finally:
        stack.stop()


def agent_metrics() -> str:
    """The GPU health agent's /metrics text (its own metrics(), as its HTTP handler serves it) after a poll of
    a GPU with a reason code, so every family has a sample."""
    config = Config(
        node_name="gpu-node-2",
        api_server="https://127.0.0.1:6443",
        ca_file="ca.crt",
        token_file="token",
        lease_namespace="gpu-health",
        lease_name="gpu-health-breaker",
    )
    agent = Agent(config, nvml=None, api=None)  # type: ignore[arg-type]  # metrics() reads its state only
    agent.state.health = {
        "verdict": "degraded",
        "reasons": [],
        "gpus": [{"index": 0, "uuid": "GPU-a", "verdict": "degraded", "reasons": ["temperature_slowdown"]}],
    }
    return agent.metrics()


def control_plane_metrics(tmp_path: Path) -> str:
    """The control plane's exporter (role control_plane_metrics) serving the files its certificate check
    and role etcd_backup's run write: each program's own text, a sample in every family (a copy's too)."""
    programs = {}
    for role in ("control_plane_metrics", "etcd_backup"):
        (path,) = (ROOT / "roles" / role / "files").glob("*.py")
        spec = importlib.util.spec_from_file_location(f"{role}_program", path)
        assert spec and spec.loader
        programs[role] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(programs[role])
    report = {"certificates": [{"name": "apiserver", "expirationDate": "2027-12-01T18:33:53Z"}]}
    (tmp_path / "kubeadm_certificates.prom").write_text(
        programs["control_plane_metrics"].certificate_metrics(report, "", 0.0)
    )
    backup = {"dir": str(tmp_path / "none"), "max_age_s": 10800}
    outcome = {"ran": 0.0, "saved": True, "copies": {"gpu-node-2": True}}
    (tmp_path / "etcd_backup.prom").write_text(programs["etcd_backup"].metrics_text(backup, outcome))
    return str(programs["control_plane_metrics"].exposition(str(tmp_path)))


@pytest.fixture(scope="module")
def emitted(serving: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return (
        exposition_names(serving["vllm"])
        | exposition_names(serving["gateway"])
        | exposition_names(agent_metrics())
        | exposition_names(control_plane_metrics(tmp_path_factory.mktemp("control-plane-metrics")))
        | dcgm_exported_names()
        | PROMETHEUS_OWN
    )


def _unknown(expr: str, emitted: set[str]) -> set[str]:
    return metric_names(as_promql(expr)) - emitted


@pytest.mark.parametrize(
    ("where", "expr"), [*rule_exprs(), *dashboard_exprs()], ids=lambda v: v.split("\n")[0][:60]
)
def test_every_name_is_emitted(where: str, expr: str, emitted: set[str]) -> None:
    assert metric_names(as_promql(expr)), f"{where}: reads no metric at all"
    assert _unknown(expr, emitted) == set(), f"{where}: no exporter of this stack emits these"


def test_a_name_nobody_emits_is_caught(emitted: set[str]) -> None:
    # the article's alert, and the names later vLLM releases use: none is emitted by the pinned version
    assert _unknown("sum(rate(vllm_request_success_total[5m])) by (model) == 0", emitted) == {
        "vllm_request_success_total"
    }
    assert _unknown("vllm:kv_cache_usage_perc > 0.9", emitted) == {"vllm:kv_cache_usage_perc"}


def test_exporters_answered(serving: dict[str, str]) -> None:
    assert 'vllm:request_success_total{finished_reason="stop",model_name="m"} 1.0' in serving["vllm"]
    assert {"gpu_health_agent_polls_total", "gpu_health_agent_poll_errors_total"} <= exposition_names(
        agent_metrics()
    )
    assert "http_request_duration_seconds_bucket" in serving["gateway"]
    assert "llm_gateway_upstream_breaker_state" in serving["gateway"]


def test_counters_file_is_upstreams_plus_additions() -> None:
    ours = COUNTERS.read_text()
    try:
        upstream = manifest(UPSTREAM_COUNTERS)
    except UpstreamError as error:
        pytest.skip(str(error))
    assert ours.startswith(upstream.read_text()), "the upstream part of counters.csv was edited"
    assert {
        "DCGM_FI_DEV_SLOWDOWN_TEMP",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
    } <= (dcgm_exported_names())
