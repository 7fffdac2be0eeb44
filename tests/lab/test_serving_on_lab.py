"""The serving stage (playbooks/serving.yml) on the running lab's cluster.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_serving_on_lab.py -v

Needs the Kubernetes stage converged (test_site_on_lab.py or `make lab`) and the gateway image's digest file
that `labctl.py up` writes. Converges the stage, then proves: the summary has one line per model with its
ready replicas and the gateway's address; the objects exist in the API as rendered (StatefulSet, Services,
Deployment, PodDisruptionBudget, ConfigMap, Secret, NetworkPolicies); a second run changes nothing (`--check
--diff`: site.yml's test); the JWT secret never appears in the output; a canary written into ConfigMap
llm-rollout is rendered into the gateway's configuration by a site run (and rolls its pods) instead of being
undone; each bad input is refused in the validation play, before any change, naming the variable.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from labrun import ROOT, Run, extra_vars, on_node, pinned_image, playbook, running_nodes

pytestmark = pytest.mark.lab

STAGE = "playbooks/serving.yml"
VALIDATION_PLAY = "PLAY [Serving - validate every role's values before any change]"
APPLY_PLAY = "PLAY [Serving - namespace, network policy, vLLM, gateway, monitoring]"
LAB_VARS = yaml.safe_load((ROOT / "inventories/lab/group_vars/k8s_cluster.yml").read_text())
SECRET = LAB_VARS["llm_gateway_jwt_secret"]
MODEL = LAB_VARS["vllm_serving_models"][0]
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf -n serving"


def stage(*extra: str) -> Run:
    run = playbook(STAGE, *extra, timeout=900)
    assert SECRET not in run.output, "the JWT secret appeared in the output"
    return run


def kubectl_json(args: str) -> dict[str, Any]:
    result = on_node("gpu-node-1", f"{KUBECTL} {args} -o json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def first_run() -> Run:
    if "gpu-node-1" not in running_nodes():
        pytest.skip("the lab is not running (make lab-up)")
    if on_node("gpu-node-1", "test -s /etc/kubernetes/admin.conf").returncode != 0:
        pytest.fail("no cluster on gpu-node-1: converge the Kubernetes stage first (make lab)")
    if not (ROOT / ".lab/llm-gateway-image.digest").is_file():
        pytest.fail(".lab/llm-gateway-image.digest is missing: make lab-up builds the gateway image")
    run = stage()
    assert run.rc == 0, f"serving.yml failed (rc {run.rc}):\n{run.tail()}"
    return run


def test_summary_names_each_model_and_the_gateway(first_run: Run) -> None:
    text = " ".join(first_run.output.split())
    replicas = MODEL["replicas"]
    served = MODEL["served_model_name"]
    line = f"model {MODEL['name']} (served as {served}): {replicas}/{replicas} replicas ready"
    assert line in text, first_run.tail()
    assert "gateway: http://10.89.42.11:30001 (2/2 pods ready)" in text, first_run.tail()


def test_no_loop_variable_collision(first_run: Run) -> None:
    # the validation loop that includes the roles names its own loop_var (issue 16 item 14)
    assert "The loop variable 'item' is already in use" not in first_run.output, first_run.tail()


def test_objects_exist_in_the_api_as_rendered(first_run: Run) -> None:
    assert first_run.rc == 0
    sts = kubectl_json(f"get statefulset {MODEL['name']}")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    # a quantity: the real API returns it as a string ("2"), whatever type it was given
    gpus = {container["resources"][k]["nvidia.com/gpu"] for k in ("requests", "limits")}
    assert gpus == {str(MODEL["gpus_per_replica"])}
    deployment = kubectl_json("get deployment llm-gateway")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    # pulled from the lab registry, by the digest it gave the image it holds (the lab inventory pins it)
    tag = yaml.safe_load((ROOT / "roles/llm_gateway/defaults/main.yml").read_text())["llm_gateway_image_tag"]
    ref = f"{LAB_VARS['llm_gateway_image_repository']}:{tag}"
    assert image == pinned_image(ref)
    service = kubectl_json("get service llm-gateway")
    assert service["spec"]["ports"][0]["nodePort"] == 30001
    assert kubectl_json("get pdb llm-gateway")["spec"]["minAvailable"] == 1
    policies = {p["metadata"]["name"] for p in kubectl_json("get networkpolicy")["items"]}
    assert {"default-deny", "vllm", "llm-gateway"} <= policies
    config = yaml.safe_load(kubectl_json("get configmap llm-gateway-config")["data"]["gateway.yaml"])
    (upstream,) = config["models"][MODEL["served_model_name"]]["upstreams"]
    assert upstream["url"] == f"http://{MODEL['name']}.serving.svc:8000"
    assert kubectl_json("get secret llm-gateway-jwt")["data"]["jwt-secret"]


def test_vllm_runs_as_uid_1001_spread_and_budgeted_on_the_api(first_run: Run) -> None:
    """What the stage applied, read back: the NCCL path and no usage reports (v0.4.2 as uid 1001 with TP 2),
    /dev/shm in memory, the device plugin's RuntimeClass and GPU node label, the replicas spread by host name,
    and the model's PodDisruptionBudget (maxUnavailable 1) with its status computed by the API (issue 16 items
    3, 10, 11)."""
    assert first_run.rc == 0
    pod = kubectl_json(f"get statefulset {MODEL['name']}")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["VLLM_NCCL_SO_PATH"] == "/usr/local/lib/python3.10/dist-packages/nvidia/nccl/lib/libnccl.so.2"
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert dshm["medium"] == "Memory" and dshm["sizeLimit"] == LAB_VARS["vllm_serving_shm_size"]
    assert pod["runtimeClassName"] == "nvidia" and pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    spread = pod["topologySpreadConstraints"][0]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "DoNotSchedule"
    pdb = kubectl_json(f"get poddisruptionbudget {MODEL['name']}")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == MODEL["name"]
    assert pdb["status"]["expectedPods"] == MODEL["replicas"]
    assert pdb["status"]["disruptionsAllowed"] == 1


def test_second_run_changes_nothing(first_run: Run) -> None:
    assert first_run.rc == 0
    # on the lab make lab converged, the module's first run is a second run already; `--check --diff` on the
    # converged lab is site.yml's (tests/lab/test_site_on_lab.py), which imports this stage
    again = first_run if first_run.changed_nothing() else stage()
    assert again.rc == 0 and set(again.changed().values()) == {0}, again.changed_tasks()


@pytest.fixture
def canary() -> Iterator[None]:
    state = {MODEL["served_model_name"]: {"canary": {"name": f"{MODEL['name']}-canary", "weight": 10}}}
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "llm-rollout", "namespace": "serving"},
        "data": {"state.json": json.dumps(state)},
    }
    created = on_node("gpu-node-1", f"echo '{json.dumps(manifest)}' | {KUBECTL} apply -f -")
    assert created.returncode == 0, created.stderr
    try:
        yield
    finally:
        on_node("gpu-node-1", f"{KUBECTL} delete configmap llm-rollout --ignore-not-found")
        restored = stage()
        assert restored.rc == 0, restored.tail()


def test_a_site_run_keeps_a_canary_in_progress(first_run: Run, canary: None) -> None:
    before = kubectl_json("get deployment llm-gateway")["spec"]["template"]["metadata"]["annotations"]
    run = stage()
    assert run.rc == 0, run.tail()
    config = yaml.safe_load(kubectl_json("get configmap llm-gateway-config")["data"]["gateway.yaml"])
    weights = {u["name"]: u["weight"] for u in config["models"][MODEL["served_model_name"]]["upstreams"]}
    assert weights == {MODEL["name"]: 90, f"{MODEL['name']}-canary": 10}
    after = kubectl_json("get deployment llm-gateway")["spec"]["template"]["metadata"]["annotations"]
    assert after["checksum/config"] != before["checksum/config"], "a config change must roll the pods"


BAD = {
    "gpus-over-node": (
        {"vllm_serving_models": [{**MODEL, "gpus_per_replica": 8}]},
        "gpus_per_replica an integer from 1 to vllm_serving_node_gpus (4), got 8",
    ),
    "requests-not-limits": (
        {"vllm_serving_models": [{**MODEL, "resources": {"requests": {"nvidia.com/gpu": 1}}}]},
        f"vllm_serving_models[0] ({MODEL['name']}).resources.requests.nvidia.com/gpu: must equal its limit",
    ),
    # what a real API server answers with a 422, refused here first (issue 16 item 11)
    "memory-64GB": ({"vllm_serving_memory": "64GB"}, "vllm_serving_memory: '64GB' is not a quantity"),
    "shm-1.5Gb": ({"vllm_serving_shm_size": "1.5Gb"}, "vllm_serving_shm_size: '1.5Gb' is not a quantity"),
    "gateway-cpu-2-cores": ({"llm_gateway_cpu": "2 cores"}, "llm_gateway_cpu: '2 cores' is not a quantity"),
    "vllm-no-digest": ({"vllm_serving_image_digest": ""}, "vllm_serving_image_digest must be"),
    "gateway-no-digest": ({"llm_gateway_image_digest": "v0.1.0"}, "llm_gateway_image_digest must be"),
    "cuda-too-new": ({"vllm_serving_image_tag": "v0.4.3"}, "vllm_serving_image_tag v0.4.3 needs CUDA 12.4"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_before_any_change(first_run: Run, case: str) -> None:
    assert first_run.rc == 0
    values, says = BAD[case]
    run = stage(*extra_vars(values))
    assert run.rc != 0
    assert says in " ".join(run.output.split()), run.tail()
    assert VALIDATION_PLAY in run.output and APPLY_PLAY not in run.output
    assert set(run.changed().values()) == {0}
