"""A real Prometheus (Debian's `prometheus`) loads the role's alert rules, scrapes the running simulator,
gateway and GPU health agent (its own metrics server, module_utils/gpu_health_agent.py) under the role's job
names, the vLLM instance-down alert goes pending when the simulator stops and clears when it is back, and
the agent-down alert likewise when the agent's server stops. Debian's build lacks Kubernetes discovery, so
the jobs get `static_configs` here (the role's relabelling is for pods and nodes); the rules, the job names
and the metrics are the real ones. The alerts' `for:` is not waited out: pending is the expression firing on
real scraped data."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from ansible.module_utils.gpu_health_agent import Agent, Config, serve_metrics
from monitoring_promql import RULES, ServingStack, http_get, rule_exprs

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus missing: apt-get install prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(predicate: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout}s: {predicate.__doc__}")


class AgentServer:
    """The GPU health agent's metrics server (serve_metrics, as the service runs it) for an agent that polled
    once; stop() and start() again on the same port."""

    def __init__(self) -> None:
        config = Config(
            node_name="gpu-node-2",
            api_server="https://127.0.0.1:6443",
            ca_file="ca.crt",
            token_file="token",
            lease_namespace="gpu-health",
            lease_name="gpu-health-breaker",
            metrics_address="127.0.0.1",
            metrics_port=free_port(),
        )
        self.agent = Agent(config, nvml=None, api=None)  # type: ignore[arg-type]  # no poll runs here
        self.agent.state.polls = 1
        self.port = config.metrics_port
        self.server: Any = None

    def start(self) -> None:
        self.server = serve_metrics(self.agent)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.server = None


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentServer]:
    server = AgentServer()
    server.start()
    yield server
    if server.server is not None:
        server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, agent: AgentServer) -> Iterator[tuple[ServingStack, str]]:
    tmp = tmp_path_factory.mktemp("prometheus")
    serving = ServingStack(tmp)
    if not serving.installed:
        pytest.skip("serve/ is not installed in this venv (make venv installs it)")
    prometheus: subprocess.Popen[bytes] | None = None
    try:
        serving.start()
        serving.chat()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{serving.sim_port}"]}]},
                {
                    "job_name": "llm-gateway",
                    "static_configs": [{"targets": [f"127.0.0.1:{serving.ports['internal']}"]}],
                },
                {
                    "job_name": "gpu-health-agent",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{agent.port}"], "labels": {"node": "gpu-node-2"}}
                    ],
                },
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        address = f"127.0.0.1:{free_port()}"
        assert PROMETHEUS
        prometheus = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address={address}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        yield serving, f"http://{address}"
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=20)
        serving.stop()


def api(base: str, path: str, **params: str) -> Any:
    try:
        answer = json.loads(http_get(f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"))
    except OSError:
        return None
    assert answer["status"] == "success", answer
    return answer["data"]


def vllm_alerts(base: str) -> list[dict[str, Any]]:
    data = api(base, "alerts") or {"alerts": []}
    return [a for a in data["alerts"] if a["labels"]["alertname"] in ("VllmInstanceDown", "VllmNoInstance")]


def test_prometheus_loads_the_rules_and_scrapes_all_three(stack: tuple[ServingStack, str]) -> None:
    _, base = stack

    def all_up() -> bool:
        """the three targets up"""
        data = api(base, "targets")
        return bool(data) and sorted(t["health"] for t in data["activeTargets"]) == ["up", "up", "up"]

    wait(all_up)
    groups = api(base, "rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    # every rule of the file (the control plane's, whose job is not scraped here, evaluate too)
    assert len(rules) == len(list(rule_exprs())) == 20 and {rule["health"] for rule in rules} == {"ok"}
    for query in (
        'vllm:gpu_cache_usage_perc{job="vllm"}',
        'http_request_duration_seconds_count{job="llm-gateway"}',
        'gpu_health_agent_polls_total{job="gpu-health-agent",node="gpu-node-2"} == 1',
    ):
        wait(lambda q=query: api(base, "query", query=q)["result"])


def test_instance_down_goes_pending_when_the_simulator_stops_and_clears_when_back(
    stack: tuple[ServingStack, str],
) -> None:
    serving, base = stack

    def scraped() -> bool:
        """the simulator is scraped"""
        return bool((api(base, "query", query='up{job="vllm"} == 1') or {"result": []})["result"])

    def quiet() -> bool:
        """no vLLM alert (VllmNoInstance is pending until the first scrape has been evaluated)"""
        return vllm_alerts(base) == []

    wait(scraped)
    wait(quiet)
    serving.stop_sim()

    def pending() -> list[dict[str, Any]]:
        """VllmInstanceDown pending"""
        return [a for a in vllm_alerts(base) if a["labels"]["alertname"] == "VllmInstanceDown"]

    alert = wait(pending)[0]
    assert alert["state"] == "pending" and alert["labels"]["instance"] == f"127.0.0.1:{serving.sim_port}"
    serving.start_sim()

    wait(quiet)


def test_agent_down_goes_pending_when_its_server_stops_and_clears_when_back(
    stack: tuple[ServingStack, str], agent: AgentServer
) -> None:
    _, base = stack

    def agent_alerts() -> list[dict[str, Any]]:
        data = api(base, "alerts") or {"alerts": []}
        return [a for a in data["alerts"] if a["labels"]["alertname"].startswith("GpuHealthAgent")]

    def scraped() -> bool:
        """the agent is scraped"""
        return bool((api(base, "query", query='up{job="gpu-health-agent"} == 1') or {"result": []})["result"])

    def quiet() -> bool:
        """no agent alert (GpuHealthAgentMissing is pending until the first scrape has been evaluated)"""
        return agent_alerts() == []

    wait(scraped)
    wait(quiet)
    agent.stop()

    def pending() -> list[dict[str, Any]]:
        """GpuHealthAgentDown pending"""
        return [a for a in agent_alerts() if a["labels"]["alertname"] == "GpuHealthAgentDown"]

    alert = wait(pending)[0]
    assert alert["state"] == "pending" and alert["labels"]["node"] == "gpu-node-2"
    agent.start()
    wait(quiet)
