"""Canary, promote and rollback on the lab's real cluster: the playbooks drive the real deployment.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_canary_on_lab.py -v

Needs the lab converged through the serving stage (make lab): StatefulSet qwen2-tiny on v1, the gateway's
Deployment behind its NodePort (30001), Prometheus and Alertmanager in the monitoring namespace. What runs
where:

- playbooks/canary.yml, promote.yml and remediate/rollback-model.yml run against the lab as on-call runs them.
  The canary is a real StatefulSet of the vLLM simulator (vLLM's image name, its GPUs from the lab's device
  plugin) with its Service and PodDisruptionBudget. Each playbook re-renders the gateway's ConfigMap, whose
  checksum annotation rolls the gateway's pods: the test waits until only pods of the new template run, Ready,
  and are the Service's endpoints, then reads the weights each running gateway pod routes with
  (llm_gateway_upstream_weight on its internal /metrics).
- Traffic: REQUESTS chat completions with the official `openai` client to the NodePort of every node in turn,
  each with a JWT of its own `sub` signed with the lab's secret (inventories/lab). The split is measured
  twice: on the X-LLM-Gateway-Upstream header of the answers, and on the simulators' own counters
  (vllm:request_success_total of every vLLM pod, read from a gateway pod, which the serving NetworkPolicy lets
  reach them); the two must agree, request for request. A share is mapped to a weights version through the
  hostPath each StatefulSet mounts, read from the cluster.
- Alerts from the cluster's own Prometheus (promtool in its pod: the image has /bin/prometheus and
  /bin/promtool only, no shell) and Alertmanager (amtool in its pod), both asked on their loopback. Once the
  canary's share is measured, its simulator is killed whenever it runs (`lab-kube-fault crashloop`: the real
  kubelet restarts it with its back-off, the pod stays Running, so Prometheus keeps its target):
  VllmInstanceDown (`for: 1m`, waited out, not shortened) fires naming the canary's pod and reaches
  Alertmanager, while the canary's users are answered by the stable version; the fault cleared, the kubelet
  starts the simulator again and the alert clears. Only then promote and rollback: promote.yml waits for a
  ready canary.

Every wait is bounded by the setting it waits on, read from the running cluster (the Deployment's and the
StatefulSets' pod specs, the rules' `for:`, Prometheus's intervals, the kubelet's /configz, kube-proxy's
configuration), plus a named margin.

The canary's version v2 is put on the nodes as the models stage would leave it (a copy of v1 with its
manifest; the stage's own sync is tested in test_models_on_lab.py) and removed at the end; the rollout is
rolled back to v1 and the fault cleared whatever happens.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jwt
import openai
import pytest
import yaml
from labrun import (
    ADMIN_KUBECTL,
    LIVE_PODS,
    NODES,
    ROOT,
    kube_json,
    on_node,
    playbook,
    running_nodes,
    wait_for,
)

pytestmark = pytest.mark.lab

LAB_VARS = yaml.safe_load((ROOT / "inventories/lab/group_vars/k8s_cluster.yml").read_text())
JWT_SECRET = LAB_VARS["llm_gateway_jwt_secret"]
MODEL = LAB_VARS["vllm_serving_models"][0]["served_model_name"]  # = the StatefulSet's and Service's name
CANARY = f"{MODEL}-canary"
NAMESPACE = yaml.safe_load((ROOT / "roles/vllm_serving/defaults/main.yml").read_text())[
    "vllm_serving_namespace"
]
MONITORING = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())["monitoring_namespace"]
CONTROL_PLANE = NODES[0]
GATEWAY = "llm-gateway"  # the Deployment, its Service and its pods' app.kubernetes.io/name
REQUESTS = 2000
SHARE_TOLERANCE = 0.02
# Margins over the real settings, for what they do not cover on these machines (two shared cores, nested
# containers), as in test_real_kubernetes_on_lab.py
POLL_S = 1
LOOP_MARGIN_S = 15  # the loop of a controller, the kubelet or Prometheus acting on the setting, and the load
POD_START_S = 120  # a pod scheduled, its image pulled from the lab's registry, started, its probes passing
KUBE_PROXY_MIN_SYNC_S = 1.0  # kube-proxy's --min-sync-period default, where its configuration leaves it 0


# ------------------------------------------------------------------------------------------------ helpers
def kubectl(args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return on_node(CONTROL_PLANE, f"{ADMIN_KUBECTL} {args}", timeout=timeout)


def kube_object(args: str) -> dict[str, Any] | None:
    """The object, None when the API says NotFound."""
    done = kubectl(f"{args} -o json")
    if done.returncode != 0 and "NotFound" in done.stderr:
        return None
    assert done.returncode == 0, f"kubectl {args}: {done.stderr}"
    return dict(json.loads(done.stdout))


def go_duration(text: str) -> float:
    """Seconds of a Go / Prometheus duration (20s, 1m, 1m0s, 5m0s, 500ms)."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"([\d.]+)(ms|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def port(pod_spec: dict[str, Any], name: str) -> int:
    """The first container's port called NAME (the workload roles name their ports)."""
    (number,) = [
        p["containerPort"] for p in pod_spec["containers"][0].get("ports", []) if p.get("name") == name
    ]
    return int(number)


def in_pod(namespace: str, target: str, script: str, *args: str, timeout: int = 120) -> str:
    """python3 -c SCRIPT ARGS in TARGET's first container (the gateway's image has python3)."""
    quoted = " ".join(shlex.quote(a) for a in (script, *args))
    done = kubectl(f"-n {namespace} exec {target} -- python3 -c {quoted}", timeout=timeout)
    assert done.returncode == 0, f"{target}: {done.stderr}"
    return done.stdout


def weights_version(statefulset: str) -> str | None:
    """The weights directory a StatefulSet mounts (<root>/<name>/<version>), None when it does not exist."""
    found = kube_object(f"-n {NAMESPACE} get statefulset {statefulset}")
    if found is None:
        return None
    volumes = found["spec"]["template"]["spec"]["volumes"]
    return str(next(v for v in volumes if v["name"] == "weights")["hostPath"]["path"]).rsplit("/", 1)[1]


def rollout_ready_timeout_s() -> int:
    """model_rollout_ready_timeout_s for the playbooks, from the stable StatefulSet as the cluster has it: its
    replicas replaced one at a time, each after the old pod's termination grace, started (POD_START_S: the
    simulator starts in seconds, where the product's default budgets a real model's weight loading)."""
    spec = kube_json("-n", NAMESPACE, "get", "statefulset", MODEL)["spec"]
    grace = int(spec["template"]["spec"].get("terminationGracePeriodSeconds", 30))
    return int(spec["replicas"]) * (grace + POD_START_S)


def rollout(path: str, *extra: str) -> Any:
    ready = f"model_rollout_ready_timeout_s={rollout_ready_timeout_s()}"
    run = playbook(path, "-e", f"model={MODEL}", "-e", ready, *extra)
    assert JWT_SECRET not in run.output, f"{path}: the JWT secret appeared in the output"
    return run


def flat(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------- the gateway
def gateway_pods() -> list[dict[str, Any]]:
    return list(
        kube_json("-n", NAMESPACE, "get", "pods", LIVE_PODS, "-l", f"app.kubernetes.io/name={GATEWAY}")[
            "items"
        ]
    )


def gateway_rollout_bound_s(deployment: dict[str, Any]) -> float:
    """How long the gateway's rollout may take, from the Deployment: its new pods made maxSurge at a time,
    each started and passing its readiness probe once, then the old ones' termination grace."""
    spec = deployment["spec"]
    pod_spec = spec["template"]["spec"]
    surge = int(spec["strategy"]["rollingUpdate"]["maxSurge"])
    readiness = pod_spec["containers"][0]["readinessProbe"]
    per_pod = POD_START_S + readiness.get("periodSeconds", 10) * readiness.get("successThreshold", 1)
    batches = -(-int(spec["replicas"]) // surge)
    return batches * per_pod + int(pod_spec.get("terminationGracePeriodSeconds", 30)) + LOOP_MARGIN_S


def kube_proxy_sync_s() -> float:
    """kube-proxy's minSyncPeriod, from its configuration in the cluster (kubeadm's ConfigMap)."""
    config = yaml.safe_load(
        kube_json("-n", "kube-system", "get", "configmap", "kube-proxy")["data"]["config.conf"]
    )
    configured = go_duration(str(config.get("minSyncPeriod") or "0s"))
    return configured or KUBE_PROXY_MIN_SYNC_S


def gateway_rolled_out() -> list[dict[str, Any]]:
    """Once the gateway runs only pods of the Deployment's current template, every one Ready and none
    terminating, and those are exactly the ready endpoints of its Service (what kube-proxy forwards the
    NodePort to): the pods. Waited for with the Deployment's own bound, then kube-proxy's sync period."""
    deployment = kube_json("-n", NAMESPACE, "get", "deployment", GATEWAY)
    template = deployment["spec"]["template"]["metadata"].get("annotations") or {}
    checksums = {k: v for k, v in template.items() if k.startswith("checksum/")}
    replicas = int(deployment["spec"]["replicas"])

    def current() -> list[dict[str, Any]] | None:
        pods = gateway_pods()
        if len(pods) != replicas:
            return None
        for pod in pods:
            annotations = pod["metadata"].get("annotations") or {}
            if pod["metadata"].get("deletionTimestamp") or not pod_ready(pod):
                return None
            if any(annotations.get(k) != v for k, v in checksums.items()):
                return None
        slices = kube_json(
            "-n", NAMESPACE, "get", "endpointslices", "-l", f"kubernetes.io/service-name={GATEWAY}"
        )
        ready = {
            address
            for item in slices["items"]
            for endpoint in item.get("endpoints") or []
            if (endpoint.get("conditions") or {}).get("ready")
            for address in endpoint["addresses"]
        }
        return pods if ready == {p["status"]["podIP"] for p in pods} else None

    pods = wait_for(
        f"Deployment {GATEWAY} rolled out, its Service's endpoints its new pods only",
        current,
        gateway_rollout_bound_s(deployment),
    )
    time.sleep(kube_proxy_sync_s() + POLL_S)  # kube-proxy writes the endpoints into the node's rules
    return list(pods)


WEIGHTS = (
    "import sys, urllib.request\n"
    "text = urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[1]}/metrics', timeout=5).read().decode()\n"
    "print('\\n'.join(l for l in text.splitlines() if l.startswith('llm_gateway_upstream_weight{')))\n"
)
WEIGHT_LINE = re.compile(r"llm_gateway_upstream_weight\{(?P<labels>[^}]*)\} (?P<value>\S+)")


def running_weights() -> list[dict[str, int]]:
    """The gateway rolled out: each of its pods' routing weights for MODEL, upstream -> weight, as the running
    process reports them (llm_gateway_upstream_weight on its internal /metrics)."""
    found = []
    for pod in gateway_rolled_out():
        text = in_pod(NAMESPACE, pod["metadata"]["name"], WEIGHTS, str(port(pod["spec"], "metrics")))
        weights = {}
        for match in WEIGHT_LINE.finditer(text):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            if labels["model"] == MODEL:
                weights[labels["upstream"]] = int(float(match["value"]))
        found.append(weights)
    return found


def configured_weights() -> dict[str, int]:
    """MODEL's upstreams and weights in the gateway's ConfigMap, as the llm_gateway role rendered them."""
    data = kube_json("-n", NAMESPACE, "get", "configmap", "llm-gateway-config")["data"]
    config = yaml.safe_load(data["gateway.yaml"])
    return {u["name"]: u["weight"] for u in config["models"][MODEL]["upstreams"]}


def assert_gateway_routes(weights: dict[str, int]) -> None:
    assert configured_weights() == weights
    assert running_weights() == [weights] * len(gateway_pods()), "a running gateway pod routes otherwise"


# ------------------------------------------------------------------------------------------------ traffic
def node_addresses() -> list[str]:
    return sorted(
        address["address"]
        for node in kube_json("get", "nodes")["items"]
        for address in node["status"]["addresses"]
        if address["type"] == "InternalIP"
    )


def token(sub: str) -> str:
    return str(jwt.encode({"sub": sub, "exp": int(time.time()) + 3600}, JWT_SECRET, algorithm="HS256"))


COUNT_SUCCESSES = (
    "import json, sys, urllib.request\n"
    "totals = {}\n"
    "for ip in sys.argv[2:]:\n"
    "    text = urllib.request.urlopen(f'http://{ip}:{sys.argv[1]}/metrics', timeout=5).read().decode()\n"
    "    totals[ip] = sum(float(l.split()[-1]) for l in text.splitlines()\n"
    "                     if l.startswith('vllm:request_success_total'))\n"
    "print(json.dumps(totals))\n"
)


def finished_requests() -> dict[tuple[str, str], float]:
    """(StatefulSet, pod uid) -> vllm:request_success_total of every running vLLM pod, read from a gateway pod
    (the serving NetworkPolicy admits the gateway on the pods' http port)."""
    listed = kube_json("-n", NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/name=vllm")
    pods = [
        p
        for p in listed["items"]
        if p["status"].get("podIP") and pod_ready(p) and not p["metadata"].get("deletionTimestamp")
    ]
    assert pods, "no vLLM pod runs"
    gateway = next(p for p in gateway_pods() if pod_ready(p))
    ports = {port(p["spec"], "http") for p in pods}
    assert len(ports) == 1, ports
    text = in_pod(
        NAMESPACE,
        gateway["metadata"]["name"],
        COUNT_SUCCESSES,
        str(ports.pop()),
        *(p["status"]["podIP"] for p in pods),
    )
    totals = json.loads(text)
    return {
        (p["metadata"]["labels"]["app.kubernetes.io/instance"], p["metadata"]["uid"]): totals[
            p["status"]["podIP"]
        ]
        for p in pods
    }


@dataclass
class Measured:
    by_header: Counter[str]  # upstream (Service = StatefulSet) named by X-LLM-Gateway-Upstream -> answers
    by_counters: Counter[str]  # StatefulSet -> requests its simulators counted as finished
    users: dict[str, list[str]]  # upstream -> the `sub`s it answered

    def share(self, version: str) -> float:
        """The share of the requests answered by an upstream whose StatefulSet mounts VERSION."""
        total = sum(self.by_header.values())
        return sum(n for name, n in self.by_header.items() if weights_version(name) == version) / total


def send(subs: list[str]) -> Measured:
    """One chat completion per `sub`, through the NodePort of every node in turn; each answer's upstream, and
    what the simulators counted meanwhile."""
    service = kube_json("-n", NAMESPACE, "get", "service", GATEWAY)
    (node_port,) = [p["nodePort"] for p in service["spec"]["ports"]]
    clients = [
        openai.OpenAI(
            base_url=f"http://{ip}:{node_port}/v1", api_key="per-request", max_retries=0, timeout=30
        )
        for ip in node_addresses()
    ]

    def one(i: int) -> tuple[str, str]:
        raw = clients[i % len(clients)].chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=1,
            extra_headers={"Authorization": f"Bearer {token(subs[i])}"},
        )
        assert "x-llm-gateway-fallback" not in raw.headers, f"{subs[i]}: answered by the fallback"
        assert raw.parse().choices, subs[i]
        return subs[i], str(raw.headers["x-llm-gateway-upstream"])

    before = finished_requests()
    with ThreadPoolExecutor(8) as pool:
        answered = list(pool.map(one, range(len(subs))))
    after = finished_requests()
    gone = set(before) - set(after)
    assert not gone, f"vLLM pods went away while the requests ran: {gone}"
    by_counters: Counter[str] = Counter()
    for key, total in after.items():
        by_counters[key[0]] += int(total - before.get(key, 0.0))
    users: dict[str, list[str]] = {}
    for sub, upstream in answered:
        users.setdefault(upstream, []).append(sub)
    measured = Measured(Counter(upstream for _, upstream in answered), +by_counters, users)
    # the header tells the truth: each answer was finished by a simulator of the upstream it names
    assert measured.by_counters == measured.by_header, (measured.by_counters, measured.by_header)
    return measured


def measure(phase: str) -> Measured:
    return send([f"{phase}-user-{i}" for i in range(REQUESTS)])


# ----------------------------------------------------------------------------------------------- monitoring
def monitoring_port(deployment: str) -> int:
    return port(
        kube_json("-n", MONITORING, "get", "deployment", deployment)["spec"]["template"]["spec"],
        "http",
    )


def prometheus(expr: str) -> list[dict[str, Any]]:
    """An instant query, asked by promtool in Prometheus's own pod on its loopback (the monitoring
    NetworkPolicy admits only Grafana in)."""
    url = f"http://127.0.0.1:{monitoring_port('prometheus')}"
    query = f"/bin/promtool query instant -o json {url} {shlex.quote(expr)}"
    done = kubectl(f"-n {MONITORING} exec deploy/prometheus -- {query}")
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def alertmanager(alertname: str) -> list[dict[str, Any]]:
    """The active alerts called ALERTNAME, as amtool in Alertmanager's own pod reads them."""
    url = f"http://127.0.0.1:{monitoring_port('alertmanager')}"
    done = kubectl(
        f"-n {MONITORING} exec deploy/alertmanager -- /bin/amtool alert query -o json "
        f"--alertmanager.url={url} alertname={alertname}"
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout) or [])


@dataclass
class Timing:
    """Prometheus's own settings and the rule's `for:`, from ConfigMap prometheus-config."""

    scrape_s: float
    evaluation_s: float
    for_s: float


def instance_down_timing() -> Timing:
    data = kube_json("-n", MONITORING, "get", "configmap", "prometheus-config")["data"]
    config = yaml.safe_load(data["prometheus.yml"])["global"]
    rules = [r for g in yaml.safe_load(data["alert-rules.yml"])["groups"] for r in g["rules"]]
    (rule,) = [r for r in rules if r.get("alert") == "VllmInstanceDown"]
    return Timing(
        go_duration(config["scrape_interval"]),
        go_duration(config["evaluation_interval"]),
        go_duration(rule["for"]),
    )


def instance_down(state: str = "") -> list[dict[str, str]]:
    """VllmInstanceDown's series in Prometheus (ALERTS: pending or firing), only STATE's when given."""
    selector = 'alertname="VllmInstanceDown"' + (f',alertstate="{state}"' if state else "")
    return [s["metric"] for s in prometheus(f"ALERTS{{{selector}}}")]


def every_vllm_pod_scraped() -> bool:
    """Prometheus scrapes every running vLLM pod, each up, and no VllmInstanceDown is pending or firing"""
    pods = {
        p["metadata"]["name"]
        for p in kube_json("-n", NAMESPACE, "get", "pods", LIVE_PODS, "-l", "app.kubernetes.io/name=vllm")[
            "items"
        ]
    }
    up = {s["metric"].get("pod"): s["value"][1] for s in prometheus('up{job="vllm"}')}
    return bool(pods) and all(up.get(pod) == "1" for pod in pods) and not instance_down()


# ------------------------------------------------------------------------------------ the canary's failure
def kubelet_restart_period_s(node: str) -> float:
    """The longest back-off of the node's kubelet before it restarts a container (its /configz)."""
    done = kubectl(f"get --raw /api/v1/nodes/{node}/proxy/configz")
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)["kubeletconfig"]
    return go_duration(str(config["crashLoopBackOff"]["maxContainerRestartPeriod"]))


@contextmanager
def canary_crashlooping() -> Iterator[dict[str, Any]]:
    """The canary's simulator killed whenever it runs (lab-kube-fault crashloop on its node); yields its pod
    as it was; the fault cleared afterwards, and waited for until the kubelet runs the simulator Ready again
    (its back-off, at most the kubelet's longest, then its startup and readiness probes)."""
    (pod,) = kube_json(
        "-n", NAMESPACE, "get", "pods", LIVE_PODS, "-l", f"app.kubernetes.io/instance={CANARY}"
    )["items"]
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    assert pod_ready(pod), f"{name} must start Ready"
    longest_backoff = kubelet_restart_period_s(node)
    container = pod["spec"]["containers"][0]
    probes = container["startupProbe"]["periodSeconds"] + container["readinessProbe"]["periodSeconds"]
    faulted = on_node(node, f"lab-kube-fault crashloop --pod {name} --namespace {NAMESPACE}")
    assert faulted.returncode == 0, faulted.stdout + faulted.stderr
    try:
        yield pod
    finally:
        on_node(node, "lab-kube-fault clear crashloop")
        wait_for(
            f"{name} running its simulator Ready again",
            lambda: pod_ready(kube_json("-n", NAMESPACE, "get", "pod", name)),
            longest_backoff + probes + POD_START_S,
        )


# ---------------------------------------------------------------------------------------------- the fixture
def put_v2_on_the_nodes() -> list[str]:
    """v2 as the models stage leaves a synced version: the directory and its manifest (a copy of v1's)."""
    made = []
    for node in NODES:
        if on_node(node, f"test -e /models/{MODEL}/v2").returncode != 0:
            proc = on_node(
                node, f"cd /models/{MODEL} && cp -a v1 v2 && cp -a v1.manifest.json v2.manifest.json"
            )
            assert proc.returncode == 0, proc.stderr
            made.append(node)
    return made


def restore() -> None:
    """Back to the lab's stable state: no canary, qwen2-tiny on v1 (the inventory's version)."""
    for _ in range(2):  # a canary left, then a promotion left
        if weights_version(CANARY) is None and weights_version(MODEL) == "v1":
            return
        rollout("playbooks/remediate/rollback-model.yml")


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    if CONTROL_PLANE not in running_nodes():
        pytest.skip("the lab is not running (make lab-up)")
    if on_node(CONTROL_PLANE, "test -s /etc/kubernetes/admin.conf").returncode != 0:
        pytest.fail("no cluster on gpu-node-1: converge the lab first (make lab)")
    assert weights_version(MODEL) == "v1", (
        "StatefulSet serving/qwen2-tiny at v1 missing: converge the serving stage"
    )
    made: list[str] = []
    try:
        restore()
        made = put_v2_on_the_nodes()
        yield
    finally:
        restore()
        for node in made:
            on_node(node, f"cd /models/{MODEL} && rm -rf v2 v2.manifest.json .v2.manifest.json.cache")


# ------------------------------------------------------------------------------------------------- the test
def test_canary_promote_rollback_move_the_running_gateways_weights(lab: None) -> None:
    timing = instance_down_timing()
    # two scrapes of every vLLM pod since the last change; an instance alert of before waited out
    wait_for(
        "every vLLM pod scraped and up, no VllmInstanceDown",
        every_vllm_pod_scraped,
        2 * timing.scrape_s + 2 * timing.evaluation_s + LOOP_MARGIN_S,
    )
    (address, *_) = node_addresses()
    (node_port,) = [
        p["nodePort"] for p in kube_json("-n", NAMESPACE, "get", "service", GATEWAY)["spec"]["ports"]
    ]
    first = openai.OpenAI(
        base_url=f"http://{address}:{node_port}/v1", api_key="per-request", max_retries=0, timeout=30
    ).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "你好"}],
        extra_headers={"Authorization": f"Bearer {token('first-user')}"},
    )
    assert first.choices[0].message.content and first.model == MODEL

    # canary: 10 % of the users to v2, on a StatefulSet, Service and PodDisruptionBudget of its own
    run = rollout("playbooks/canary.yml", "-e", "version=v2", "-e", "weight=10")
    assert run.rc == 0, run.tail()
    summary = f"Canary: model {MODEL}: {CANARY} runs version v2 beside {MODEL} (version v1); 10 %"
    assert summary in flat(run.output), run.tail()
    assert weights_version(CANARY) == "v2" and weights_version(MODEL) == "v1"
    assert kube_object(f"-n {NAMESPACE} get service {CANARY}") is not None, f"Service {CANARY} missing"
    pdb = kube_object(f"-n {NAMESPACE} get poddisruptionbudget {CANARY}")
    assert pdb is not None, f"PodDisruptionBudget {CANARY} missing"
    assert pdb["spec"]["maxUnavailable"] == 1, pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == CANARY, pdb["spec"]
    assert_gateway_routes({MODEL: 90, CANARY: 10})
    canary = measure("canary")
    share = canary.share("v2")
    print(f"canary 10 %: measured {share:.2%} on v2 over {REQUESTS} requests {dict(canary.by_header)}")
    assert abs(share - 0.10) <= SHARE_TOLERANCE, canary.by_header

    # the canary fails: an alert of its own, while its users are answered by the stable version
    the_canary_fails_alone(timing, canary.users[CANARY])

    # promote: 100 % to v2 on the stable StatefulSet; the canary's StatefulSet, Service and PDB gone
    run = rollout("playbooks/promote.yml")
    assert run.rc == 0, run.tail()
    summary = f"{MODEL} moved from version v1 to v2, 100 % of users on it, canary removed"
    assert summary in flat(run.output), run.tail()
    assert weights_version(CANARY) is None and weights_version(MODEL) == "v2"
    assert kube_object(f"-n {NAMESPACE} get service {CANARY}") is None, f"Service {CANARY} left"
    assert kube_object(f"-n {NAMESPACE} get poddisruptionbudget {CANARY}") is None, f"PDB {CANARY} left"
    assert_gateway_routes({MODEL: 100})
    promoted = measure("promote")
    share = promoted.share("v2")
    print(f"promote 100 %: measured {share:.2%} on v2 over {REQUESTS} requests {dict(promoted.by_header)}")
    assert share >= 1 - SHARE_TOLERANCE, promoted.by_header

    # rollback: back to v1, 0 % on v2
    run = rollout("playbooks/remediate/rollback-model.yml")
    assert run.rc == 0, run.tail()
    assert f"{MODEL} moved back from version v2 to v1 (recorded at promotion)" in flat(run.output), run.tail()
    assert weights_version(MODEL) == "v1"
    assert_gateway_routes({MODEL: 100})
    rolled_back = measure("rollback")
    share = rolled_back.share("v2")
    print(f"rollback 0 %: measured {share:.2%} on v2 over {REQUESTS} requests {dict(rolled_back.by_header)}")
    assert share <= SHARE_TOLERANCE, rolled_back.by_header

    # a second rollback has nothing to do
    again = rollout("playbooks/remediate/rollback-model.yml")
    assert again.rc == 0, again.tail()
    assert again.changed()[CONTROL_PLANE] == 0, again.changed_tasks()
    assert "nothing to roll back" in again.output


def the_canary_fails_alone(timing: Timing, canary_users: list[str]) -> None:
    """The canary's simulator crash-looping: VllmInstanceDown fires for its pod in Prometheus, after its
    `for:`, and reaches Alertmanager; meanwhile its users are answered by the stable version; the alert clears
    once the kubelet runs the simulator again."""
    with canary_crashlooping() as pod:
        name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
        killed = time.monotonic()

        def firing() -> list[dict[str, str]]:
            return [a for a in instance_down("firing") if a.get("pod") == name]

        # its first failed scrape within a scrape interval, then the rule's `for:` from the evaluation that
        # saw it, and the evaluation that fires it
        (alert,) = wait_for(
            f"VllmInstanceDown firing for {name}",
            firing,
            timing.scrape_s + 2 * timing.evaluation_s + timing.for_s + LOOP_MARGIN_S,
        )
        fired = time.monotonic() - killed
        assert fired >= timing.for_s, (
            f"firing {fired:.0f} s after the fault, within its for: ({timing.for_s} s)"
        )
        assert alert["instance"].split(":")[0] == ip and alert["namespace"] == NAMESPACE, alert

        def received() -> list[dict[str, Any]]:
            return [a for a in alertmanager("VllmInstanceDown") if a["labels"].get("pod") == name]

        # Prometheus sends a firing alert to Alertmanager after the evaluation that fired it
        (held,) = wait_for(
            f"Alertmanager holding VllmInstanceDown for {name}", received, timing.evaluation_s + LOOP_MARGIN_S
        )
        assert held["status"]["state"] == "active", held  # neither silenced nor inhibited

        # every user of the canary answered by the stable version (the gateway's next choice for each)
        meanwhile = send(canary_users)
        assert meanwhile.by_header == {MODEL: len(canary_users)}, meanwhile.by_header
    back = time.monotonic()  # the simulator Ready again (the context waited for it)

    def cleared() -> bool:
        return not [a for a in instance_down() if a.get("pod") == name] and not received()

    # the next scrape answers, the next evaluation resolves the alert and sends the resolution
    wait_for(
        f"VllmInstanceDown for {name} cleared in Prometheus and Alertmanager",
        cleared,
        timing.scrape_s + 2 * timing.evaluation_s + LOOP_MARGIN_S,
    )
    print(
        f"VllmInstanceDown (for: {timing.for_s:.0f} s, evaluation every {timing.evaluation_s:.0f} s): firing "
        f"{fired:.0f} s after the canary's simulator was first killed, cleared "
        f"{time.monotonic() - back:.0f} s after it was Ready again"
    )
