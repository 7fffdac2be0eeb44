"""Canary, promote and rollback on the lab, with the gateway running for real.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_canary_on_lab.py -v

Needs the lab with the serving stage converged (StatefulSet qwen2-tiny, ConfigMaps llm-gateway-config and
prometheus-config in the cluster). What runs where:

- The playbooks (canary.yml, promote.yml, remediate/rollback-model.yml) run against the lab's API as on-call
  would run them. The API stand-in runs no containers, so the vLLM pods are played by two `vllm-sim`
  containers on the controller, one for each Service (stable `qwen2-tiny`, canary `qwen2-tiny-canary`).
- The gateway is the lab's gateway image (built from serve/Containerfile by `make lab-up`, digest in
  .lab/llm-gateway-image.digest) under podman on the controller, with the configuration read back from the
  lab API: ConfigMap llm-gateway-config, key gateway.yaml, written unchanged into the directory mounted where
  the Deployment mounts it. The upstream URLs in it name the Services (http://<name>.serving.svc:8000); the
  container resolves those names to the simulators through podman's --add-host (its /etc/hosts), on a
  network of this test's own, so nothing in the rendered configuration is edited.
- After each playbook the test re-reads the ConfigMap, rewrites the file and sends SIGHUP (what the
  Deployment's checksum rollout achieves with new pods), waits for the gateway's reload counter, then sends
  2,000 requests with the official `openai` client, each with a JWT of its own `sub` signed with the lab's
  secret (inventories/lab), and counts the X-LLM-Gateway-Upstream header.
- A real Prometheus (Debian's `prometheus`) loads prometheus.yml and alert-rules.yml read back from the
  lab's ConfigMap prometheus-config (rendered by roles/monitoring with the lab's monitoring_scrape_interval).
  Debian's 2.42 is built without Kubernetes discovery, so each job's kubernetes_sd_configs + relabel_configs
  (pod discovery) is replaced by static_configs listing the containers standing for those pods, under the
  same job names; everything else is the rendered file. The canary simulator is stopped once the canary
  phase is measured: VllmInstanceDown (`for: 1m`) fires while promote and rollback run, and clears once the
  simulator is back. The `for:` is waited out, not shortened.

The canary's version v2 is put on the nodes as the models stage would leave it (a copy of v1 with its
manifest; the stage's own sync is tested in test_models_on_lab.py) and removed at the end; the rollout is
rolled back to v1 whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jwt
import openai
import pytest
import yaml
from labrun import ROOT, on_node, playbook, podman

pytestmark = pytest.mark.lab

MODEL = "qwen2-tiny"  # served name = StatefulSet/Service name in inventories/lab
CANARY = f"{MODEL}-canary"
NAMESPACE = "serving"
CONTROL_PLANE = "gpu-node-1"
NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
NETWORK = "llm-canary-test"
SUBNET = "10.89.77"
GATEWAY_IP, STABLE_IP, CANARY_IP = f"{SUBNET}.10", f"{SUBNET}.11", f"{SUBNET}.12"
NAMES = {"gateway": "canary-test-gateway", MODEL: "canary-test-sim-stable", CANARY: "canary-test-sim-canary"}
SIM_IP = {MODEL: STABLE_IP, CANARY: CANARY_IP}
REQUESTS = 2000
PROMETHEUS = shutil.which("prometheus")
RUNNER_IMAGE = "localhost/llm-lab-node:bookworm"  # Debian 12 like the controller: runs the checkout's .venv
# the checkout (its .venv) and the Python the venv was made from, read-only at the same paths
PYTHON_HOME = Path(os.path.realpath(ROOT / ".venv/bin/python3")).parents[1]
VENV_MOUNTS = ["-v", f"{ROOT}:{ROOT}:ro", "-v", f"{PYTHON_HOME}:{PYTHON_HOME}:ro"]


def kubectl(args: str) -> str:
    proc = on_node(CONTROL_PLANE, f"{KUBECTL} {args}", timeout=60)
    assert proc.returncode == 0, f"kubectl {args}: {proc.stderr}"
    return proc.stdout


def configmap(name: str, namespace: str) -> dict[str, str] | None:
    proc = on_node(CONTROL_PLANE, f"{KUBECTL} -n {namespace} get configmap {name} -o json", timeout=60)
    return json.loads(proc.stdout).get("data", {}) if proc.returncode == 0 else None


def weights_version(statefulset: str) -> str | None:
    """The weights directory a StatefulSet mounts (<root>/<name>/<version>), None when it does not exist."""
    proc = on_node(
        CONTROL_PLANE, f"{KUBECTL} -n {NAMESPACE} get statefulset {statefulset} -o json", timeout=60
    )
    if proc.returncode != 0:
        return None
    volumes = json.loads(proc.stdout)["spec"]["template"]["spec"]["volumes"]
    return str(next(v for v in volumes if v["name"] == "weights")["hostPath"]["path"]).rsplit("/", 1)[1]


def lab_value(name: str) -> Any:
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-inventory"),
            "-i",
            "inventories/lab/hosts.yml",
            "--host",
            CONTROL_PLANE,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)[name]


def wait(what: Callable[[], Any], timeout: float, step: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"not within {timeout}s: {what.__doc__}")


def http(url: str, timeout: float = 5) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return str(answer.read().decode())
    except OSError:
        return None


JWT_SECRET = yaml.safe_load((ROOT / "inventories/lab/group_vars/k8s_cluster.yml").read_text())[
    "llm_gateway_jwt_secret"
]


def rollout(path: str, *extra: str) -> Any:
    run = playbook(path, "-e", f"model={MODEL}", "-e", "model_rollout_ready_timeout_s=120", *extra)
    assert JWT_SECRET not in run.output, f"{path}: the JWT secret appeared in the output"
    assert run.rc == 0, run.tail()
    return run


class Stack:
    """The gateway container and the two simulator containers on the test's own podman network."""

    def __init__(self, tmp: Path, image: list[str]) -> None:
        self.tmp = tmp
        self.image = image
        self.config_dir = tmp / "llm-gateway"
        self.config_dir.mkdir()
        self.secret = str(lab_value("llm_gateway_jwt_secret"))
        env_file = tmp / "gateway.env"
        env_file.write_text(f"GATEWAY_JWT_SECRET={self.secret}\n")
        env_file.chmod(0o600)
        self.env_file = env_file

    def start_sim(self, service: str) -> None:
        name = NAMES[service]
        podman("rm", "-f", name)
        proc = podman(
            "run", "-d", "--name", name, "--network", NETWORK, "--ip", SIM_IP[service],
            *VENV_MOUNTS, "--entrypoint", str(ROOT / ".venv/bin/vllm-sim"), RUNNER_IMAGE,
            "--host", "0.0.0.0", "--port", "8000", "--served-model-name", MODEL,
            "--ttft-ms", "0", "--itl-ms", "0", "--reply", service,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        wait(lambda: http(f"http://{SIM_IP[service]}:8000/health") is not None, 60)

    def stop_sim(self, service: str) -> None:
        podman("kill", NAMES[service])
        podman("rm", "-f", NAMES[service])

    def write_config(self) -> dict[str, Any]:
        data = configmap("llm-gateway-config", NAMESPACE)
        assert data, "ConfigMap serving/llm-gateway-config is missing: converge the serving stage first"
        (self.config_dir / "gateway.yaml").write_text(data["gateway.yaml"])  # same file, same mount
        return dict(yaml.safe_load(data["gateway.yaml"]))

    def start_gateway(self) -> None:
        podman("rm", "-f", NAMES["gateway"])
        proc = podman(
            "run", "-d", "--name", NAMES["gateway"], "--network", NETWORK, "--ip", GATEWAY_IP,
            "--add-host", f"{MODEL}.{NAMESPACE}.svc:{STABLE_IP}",
            "--add-host", f"{CANARY}.{NAMESPACE}.svc:{CANARY_IP}",
            "--env-file", str(self.env_file),
            "-v", f"{self.config_dir}:/etc/llm-gateway:ro",
            *self.image, "--config", "/etc/llm-gateway/gateway.yaml",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        wait(lambda: http(f"http://{GATEWAY_IP}:8000/ready") is not None, 60)

    def reloads(self) -> float:
        metrics = http(f"http://{GATEWAY_IP}:9000/metrics") or ""
        for line in metrics.splitlines():
            if line.startswith('llm_gateway_config_reloads_total{result="ok"}'):
                return float(line.split()[-1])
        return 0.0

    def reload(self) -> dict[str, Any]:
        """The ConfigMap as it is now into the running gateway (SIGHUP); returns once the gateway reloaded."""
        before = self.reloads()
        config = self.write_config()
        assert podman("kill", "--signal", "HUP", NAMES["gateway"]).returncode == 0

        def reloaded() -> bool:
            """the gateway counted the reload"""
            return self.reloads() > before

        wait(reloaded, 30)
        return config

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://{GATEWAY_IP}:8000/v1", api_key="per-request", max_retries=0)

    def token(self, sub: str) -> str:
        return str(jwt.encode({"sub": sub, "exp": int(time.time()) + 3600}, self.secret, algorithm="HS256"))

    def shares(self, phase: str) -> dict[str, float]:
        """Share of REQUESTS (one new user each) answered by each upstream, from X-LLM-Gateway-Upstream."""
        client = self.client()

        def one(i: int) -> str:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=1,
                extra_headers={"Authorization": f"Bearer {self.token(f'{phase}-user-{i}')}"},
            )
            return str(raw.headers["x-llm-gateway-upstream"])

        with ThreadPoolExecutor(8) as pool:
            counts = Counter(pool.map(one, range(REQUESTS)))
        return {name: count / REQUESTS for name, count in counts.items()}

    def stop(self) -> None:
        for name in NAMES.values():
            podman("kill", name)
            podman("rm", "-f", name)


class Prometheus:
    """Debian's Prometheus with the rendered configuration; the pods' discovery replaced by static targets."""

    def __init__(self, tmp: Path) -> None:
        data = configmap("prometheus-config", "monitoring")
        assert data, "ConfigMap monitoring/prometheus-config is missing: converge the serving stage first"
        self.dir = tmp / "prometheus"
        self.dir.mkdir()
        (self.dir / "alert-rules.yml").write_text(data["alert-rules.yml"])
        config = yaml.safe_load(data["prometheus.yml"])
        self.interval = config["global"]["evaluation_interval"]
        config["rule_files"] = [str(self.dir / "alert-rules.yml")]  # where the pod mounts it: this directory
        targets = {
            "vllm": [(f"{SIM_IP[s]}:8000", s) for s in (MODEL, CANARY)],
            "llm-gateway": [(f"{GATEWAY_IP}:9000", "llm-gateway")],
        }
        jobs = []
        for job in config["scrape_configs"]:
            if job["job_name"] not in targets:
                continue  # dcgm-exporter: no GPUs here
            assert "kubernetes_sd_configs" in job, job
            static = [
                {"targets": [t], "labels": {"namespace": NAMESPACE, "pod": pod}}
                for t, pod in targets[job["job_name"]]
            ]
            rest = {k: v for k, v in job.items() if k not in ("kubernetes_sd_configs", "relabel_configs")}
            jobs.append({**rest, "static_configs": static})
        assert {j["job_name"] for j in jobs} == set(targets)
        config["scrape_configs"] = jobs
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = "http://127.0.0.1:19091"
        assert PROMETHEUS
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                "--web.listen-address=127.0.0.1:19091",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.dir / "prometheus.log").open("w"),
        )

    def api(self, path: str) -> Any:
        text = http(f"{self.url}/api/v1/{path}")
        return json.loads(text)["data"] if text else None

    def instance_down(self) -> list[dict[str, Any]]:
        alerts = (self.api("alerts") or {"alerts": []})["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "VllmInstanceDown"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


def put_v2_on_the_nodes() -> list[str]:
    """v2 as the models stage leaves a synced version: the directory and its manifest (a copy of v1's)."""
    made = []
    for node in NODES:
        check = on_node(node, f"test -e /models/{MODEL}/v2")
        if check.returncode != 0:
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
        playbook(
            "playbooks/remediate/rollback-model.yml",
            "-e",
            f"model={MODEL}",
            "-e",
            "model_rollout_ready_timeout_s=120",
        )


def gateway_image() -> list[str]:
    """The lab's gateway image by digest; CANARY_TEST_VENV_GATEWAY=1 runs the checkout's llm-gateway console
    script in the runner image instead (for working on the test without the image; never in `make test`)."""
    if os.environ.get("CANARY_TEST_VENV_GATEWAY") == "1":
        return [*VENV_MOUNTS, "--entrypoint", str(ROOT / ".venv/bin/llm-gateway"), RUNNER_IMAGE]
    digest = ROOT / ".lab" / "llm-gateway-image.digest"
    assert digest.exists(), f"{digest} is missing: `make lab-up` builds the gateway image and writes it"
    return [f"localhost/llm-gateway@{digest.read_text().strip()}"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Prometheus]]:
    if PROMETHEUS is None:
        pytest.fail("prometheus missing: make deps installs Debian's prometheus")
    assert weights_version(MODEL) == "v1", (
        "StatefulSet serving/qwen2-tiny at v1 missing: converge the serving stage"
    )
    tmp = tmp_path_factory.mktemp("canary")
    made: list[str] = []
    stack: Stack | None = None
    prometheus: Prometheus | None = None
    podman("network", "rm", "-f", NETWORK)
    assert podman("network", "create", "--subnet", f"{SUBNET}.0/24", NETWORK).returncode == 0
    try:
        restore()
        made = put_v2_on_the_nodes()
        stack = Stack(tmp, gateway_image())
        for service in (MODEL, CANARY):
            stack.start_sim(service)
        stack.write_config()
        stack.start_gateway()
        prometheus = Prometheus(tmp)
        yield stack, prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        if stack is not None:
            stack.stop()
        podman("network", "rm", "-f", NETWORK)
        restore()
        for node in made:
            on_node(
                node,
                f"cd /models/{MODEL} && rm -rf v2 v2.manifest.json .v2.manifest.json.cache",
            )


def upstream_weights(config: dict[str, Any]) -> dict[str, int]:
    return {u["name"]: u["weight"] for u in config["models"][MODEL]["upstreams"]}


def new_version_share(shares: dict[str, float]) -> float:
    """Share of the requests answered by an upstream whose StatefulSet mounts v2 (read from the cluster)."""
    return sum(share for name, share in shares.items() if weights_version(name) == "v2")


def test_canary_promote_rollback_move_the_running_gateways_weights(lab: tuple[Stack, Prometheus]) -> None:
    stack, prometheus = lab
    first = stack.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "你好"}],
        extra_headers={"Authorization": f"Bearer {stack.token('first-user')}"},
    )
    assert first.choices[0].message.content and first.model == MODEL

    def scraped() -> bool:
        """Prometheus scrapes both simulators and the gateway, and no vLLM alert is active"""
        up = prometheus.api("query?query=up%20%3D%3D%201")
        return bool(up) and len(up["result"]) == 3 and not prometheus.instance_down()

    wait(scraped, 60)

    # canary: 10 % of the users to v2
    run = rollout("playbooks/canary.yml", "-e", "version=v2", "-e", "weight=10")
    assert (
        "Canary: model qwen2-tiny: qwen2-tiny-canary runs version v2 beside qwen2-tiny (version v1); 10 %"
        in " ".join(run.output.split())
    )
    assert upstream_weights(stack.reload()) == {MODEL: 90, CANARY: 10}
    shares = stack.shares("canary")
    canary_share = new_version_share(shares)
    print(f"canary 10 %: measured {canary_share:.2%} on v2 over {REQUESTS} requests {shares}")
    assert abs(canary_share - 0.10) <= 0.02, shares

    # the canary's simulator goes away; VllmInstanceDown must fire while promote and rollback run
    stack.stop_sim(CANARY)
    stopped = time.monotonic()

    # promote: 100 % to v2 on the stable StatefulSet, the canary gone
    run = rollout("playbooks/promote.yml")
    assert "qwen2-tiny moved from version v1 to v2, 100 % of users on it, canary removed" in " ".join(
        run.output.split()
    )
    assert weights_version(CANARY) is None and weights_version(MODEL) == "v2"
    assert upstream_weights(stack.reload()) == {MODEL: 100}
    shares = stack.shares("promote")
    promoted = new_version_share(shares)
    print(f"promote 100 %: measured {promoted:.2%} on v2 over {REQUESTS} requests {shares}")
    assert promoted >= 0.98, shares

    # rollback: back to v1, 0 % on v2
    run = rollout("playbooks/remediate/rollback-model.yml")
    assert "qwen2-tiny moved back from version v2 to v1 (recorded at promotion)" in " ".join(
        run.output.split()
    )
    assert weights_version(MODEL) == "v1"
    assert upstream_weights(stack.reload()) == {MODEL: 100}
    shares = stack.shares("rollback")
    rolled_back = new_version_share(shares)
    print(f"rollback 0 %: measured {rolled_back:.2%} on v2 over {REQUESTS} requests {shares}")
    assert rolled_back <= 0.02, shares

    # a second rollback has nothing to do
    again = rollout("playbooks/remediate/rollback-model.yml")
    assert again.changed()[CONTROL_PLANE] == 0, again.changed_tasks()
    assert "nothing to roll back" in again.output

    def firing() -> list[dict[str, Any]]:
        """VllmInstanceDown firing for the stopped simulator"""
        return [
            a
            for a in prometheus.instance_down()
            if a["state"] == "firing" and a["labels"]["instance"] == f"{CANARY_IP}:8000"
        ]

    wait(firing, 120, step=1)
    fired = time.monotonic() - stopped
    stack.start_sim(CANARY)
    back = time.monotonic()

    def cleared() -> bool:
        """VllmInstanceDown cleared"""
        return not prometheus.instance_down()

    wait(cleared, 60, step=1)
    print(
        f"VllmInstanceDown (for: 1m, interval {prometheus.interval}): firing {fired:.0f} s after the "
        f"simulator stopped, cleared {time.monotonic() - back:.0f} s after it was back"
    )
