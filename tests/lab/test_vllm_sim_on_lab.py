"""The lab's stand-in for vllm/vllm-openai:v0.4.2 (serve/tools/Containerfile.lab: vllm-sim-openai-api-server)
running the serving stage's own pod template under the real kubelet, containerd and runc.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_vllm_sim_on_lab.py -v

The lab model's StatefulSet is Ready through its real probes: vLLM 0.4.2's command line as the role renders it
accepted, the model's config.json read as uid 1001, two GPUs from the device plugin, NCCL found where the
product's VLLM_NCCL_SO_PATH points. The same pod template without that variable fails at start the way vLLM
0.4.2's image fails as uid 1001 (vllm-project/vllm#4312): exit 1, "Cannot find libnccl.so.2 in the system.",
then NameError ncclGetVersion. So the lab proves the fix, not only that the variable is set. Runs after the
serving stage (converges it when the StatefulSet is missing).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from labrun import ROOT, on_node, playbook, running_nodes

pytestmark = pytest.mark.lab

ROLE = ROOT / "roles/vllm_serving"
DEFAULTS = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
ROLE_VARS = yaml.safe_load((ROLE / "vars/main.yml").read_text())
LAB_VARS = yaml.safe_load((ROOT / "inventories/lab/group_vars/k8s_cluster.yml").read_text())
MODEL = LAB_VARS["vllm_serving_models"][0]
NAMESPACE = DEFAULTS["vllm_serving_namespace"]
KUBECTL = f"kubectl --kubeconfig /etc/kubernetes/admin.conf -n {NAMESPACE}"
PROBE_POD = "vllm-sim-without-nccl-path"


def kubectl(args: str, stdin: str | None = None, timeout: int = 180) -> Any:
    command = f"{KUBECTL} {args}" if stdin is None else f"{KUBECTL} {args} <<'EOF'\n{stdin}\nEOF"
    return on_node("gpu-node-1", command, timeout=timeout)


def kubectl_json(args: str) -> dict[str, Any]:
    result = kubectl(f"{args} -o json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def nccl_path() -> str:
    """The product's fix for the image tag the lab runs (roles/vllm_serving/vars/main.yml)."""
    runtime = ROLE_VARS.get("vllm_serving_image_runtime", {}).get(DEFAULTS["vllm_serving_image_tag"], {})
    path = runtime.get("env", {}).get("VLLM_NCCL_SO_PATH")
    assert path, "the product sets no VLLM_NCCL_SO_PATH for its vLLM image: its pods cannot start"
    return str(path)


@pytest.fixture(scope="module")
def statefulset() -> dict[str, Any]:
    if "gpu-node-1" not in running_nodes():
        pytest.skip("the lab is not running (make lab-up)")
    if on_node("gpu-node-1", "test -s /etc/kubernetes/admin.conf").returncode != 0:
        pytest.fail("no cluster on gpu-node-1: converge the Kubernetes stage first (make lab)")
    if kubectl(f"get statefulset {MODEL['name']}").returncode != 0:
        run = playbook("playbooks/serving.yml", timeout=900)
        assert run.rc == 0, f"serving.yml failed (rc {run.rc}):\n{run.tail()}"
    return kubectl_json(f"get statefulset {MODEL['name']}")


@pytest.fixture
def probe_pod() -> Iterator[str]:
    yield PROBE_POD
    kubectl(f"delete pod {PROBE_POD} --ignore-not-found --wait=false")


def test_the_model_is_ready_on_the_simulator_with_the_product_s_command_line(
    statefulset: dict[str, Any],
) -> None:
    assert statefulset["status"].get("readyReplicas") == MODEL["replicas"], statefulset["status"]
    logs = kubectl(f"logs {MODEL['name']}-0 -c vllm")
    assert logs.returncode == 0, logs.stderr
    assert "vLLM API server version 0.4.2" in logs.stdout
    assert f"Found nccl from environment variable VLLM_NCCL_SO_PATH={nccl_path()}" in logs.stdout
    assert "Failed to import NCCL library" not in logs.stdout


def test_without_vllm_nccl_so_path_the_same_pod_fails_as_vllm_0_4_2_does(
    statefulset: dict[str, Any], probe_pod: str
) -> None:
    spec = statefulset["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert any(e["name"] == "VLLM_NCCL_SO_PATH" for e in container["env"]), container["env"]
    container["env"] = [e for e in container["env"] if e["name"] != "VLLM_NCCL_SO_PATH"]
    # a bare pod outside the model's Service, PDB and spreading; everything else as the StatefulSet runs it
    spec.pop("topologySpreadConstraints", None)
    spec["restartPolicy"] = "Never"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": probe_pod, "labels": {"app.kubernetes.io/name": "vllm-sim-probe"}},
        "spec": spec,
    }
    created = kubectl("apply -f -", stdin=json.dumps(pod))
    assert created.returncode == 0, created.stderr
    done = kubectl(
        f"wait --for=jsonpath='{{.status.phase}}'=Failed pod/{probe_pod} --timeout=240s", timeout=300
    )
    assert done.returncode == 0, kubectl(f"describe pod {probe_pod}").stdout
    status = kubectl_json(f"get pod {probe_pod}")["status"]["containerStatuses"][0]
    assert status["state"]["terminated"]["exitCode"] == 1, status
    logs = kubectl(f"logs {probe_pod}").stdout
    assert "Failed to import NCCL library: Cannot find libnccl.so.2 in the system." in logs, logs
    # the last line the process wrote (on stderr; serve/tests checks the order on the process itself): in the
    # pod's log it may come before the INFO/ERROR lines written on stdout just before it, as containerd reads
    # the two streams apart and records each line when it reads it (seen on the lab, 2026-12-02)
    assert "NameError: name 'ncclGetVersion' is not defined" in logs.strip().splitlines(), logs
