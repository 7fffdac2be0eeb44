"""The vllm_serving role's manifests: every rendered object validates against the Kubernetes 1.36 schemas
(kubernetes-validate, strict), and the policies hold over the rendered objects: GPU requests equal limits,
non-root uid 1001 without privilege escalation, startup/readiness/liveness probes on /health with the
startup budget, /dev/shm in memory, weights read-only from <root>/<name>/<version> (never `current`), image
by digest. Bad input is refused by the role's validation before anything changes, naming the variable."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from manifests_render import vllm_serving_object
from manifests_render import vllm_serving_vars as role_vars

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "vllm_serving"
K8S_VERSION = "1.36.0"
DIGEST = "sha256:" + "ab" * 32
MODEL = {
    "name": "qwen2-7b",
    "version": "2024-06-06",
    "replicas": 2,
    "max_model_len": 8192,
    "served_model_name": "qwen2-7b-instruct",
}


def render(template: str, model: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    return vllm_serving_object(template, model, vllm_serving_image_digest=DIGEST, **overrides)


@pytest.fixture
def statefulset() -> dict[str, Any]:
    return render("statefulset.yml.j2", MODEL)


@pytest.mark.parametrize("template", ["statefulset.yml.j2", "service.yml.j2", "pdb.yml.j2"])
def test_objects_validate_against_the_1_36_schemas(template: str) -> None:
    kubernetes_validate.validate(render(template, MODEL), K8S_VERSION, strict=True)


def test_a_misspelt_field_is_caught_by_strict_validation(statefulset: dict[str, Any]) -> None:
    statefulset["spec"]["template"]["spec"]["containers"][0]["startupprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, K8S_VERSION, strict=True)


def test_gpu_requests_equal_limits_and_resources_are_set(statefulset: dict[str, Any]) -> None:
    resources = statefulset["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]
    assert resources["limits"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": 2}


def test_runs_as_uid_1001_without_privileges(statefulset: dict[str, Any]) -> None:
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 1001 and pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]["securityContext"]
    assert container["allowPrivilegeEscalation"] is False and container["privileged"] is False
    assert container["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False


def test_probes_on_health_with_the_startup_budget(statefulset: dict[str, Any]) -> None:
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    startup = container["startupProbe"]
    budget = role_vars()["vllm_serving_startup_budget_s"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= budget
    assert startup["failureThreshold"] == math.ceil(budget / startup["periodSeconds"])


def test_weights_read_only_from_the_version_and_shm_in_memory(statefulset: dict[str, Any]) -> None:
    pod = statefulset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert volumes["weights"]["hostPath"] == {"path": "/models/qwen2-7b/2024-06-06", "type": "Directory"}
    assert mounts["weights"] == {"name": "weights", "mountPath": "/model", "readOnly": True}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and mounts["dshm"]["mountPath"] == "/dev/shm"
    assert "--model=/model" in pod["containers"][0]["args"]


def test_image_by_digest_and_arguments(statefulset: dict[str, Any]) -> None:
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"docker.io/vllm/vllm-openai:v0.4.2@{DIGEST}"
    assert "--tensor-parallel-size=2" in container["args"]
    assert "--served-model-name=qwen2-7b-instruct" in container["args"]
    assert statefulset["spec"]["replicas"] == 2


NCCL_SO = "/usr/local/lib/python3.10/dist-packages/nvidia/nccl/lib/libnccl.so.2"


def test_vllm_0_4_2_as_uid_1001_finds_nccl_and_reports_nothing(statefulset: dict[str, Any]) -> None:
    """v0.4.2 looks for NCCL under the installing user's home (/root/.config/vllm/nccl, unreadable for uid
    1001: "Cannot find libnccl.so.2", vllm-project/vllm#4312) unless VLLM_NCCL_SO_PATH names one: the image's
    pip-installed NCCL, with cuMem off as vLLM itself does from 0.4.3 on (vllm-project/vllm#5091). No usage
    reports from nodes that reach nothing outside."""
    env = {e["name"]: e["value"] for e in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["VLLM_NCCL_SO_PATH"] == NCCL_SO
    assert env["NCCL_CUMEM_ENABLE"] == "0"
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env["HOME"] == "/tmp"


def test_dev_shm_holds_ray_s_object_store_for_tensor_parallelism(statefulset: dict[str, Any]) -> None:
    """TP 2 on v0.4.2 runs its workers on a Ray started in the pod; Ray's object store stays in /dev/shm only
    when /dev/shm is larger than it (min(30 % of the memory, max(10 GB, 95 % of /dev/shm))): 16Gi here."""
    pod = statefulset["spec"]["template"]["spec"]
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]


def test_a_tag_without_runtime_facts_gets_only_the_common_environment() -> None:
    newer = render("statefulset.yml.j2", MODEL, vllm_serving_image_tag="v0.5.0")
    env = {e["name"] for e in newer["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "VLLM_NCCL_SO_PATH" not in env and {"VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"} <= env


def test_replicas_spread_over_gpu_nodes_one_per_node_first(statefulset: dict[str, Any]) -> None:
    """Two replicas never share a node while another GPU node has fewer (a node lost costs the model one
    replica, not all); cordoned nodes do not count (nodeTaintsPolicy Honor); only GPU nodes are domains."""
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}  # nvidia_device_plugin_node_label
    assert pod["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "nodeAffinityPolicy": "Honor",
            "nodeTaintsPolicy": "Honor",
            "labelSelector": {
                "matchLabels": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": "qwen2-7b"}
            },
        }
    ]
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert pod["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_each_model_has_a_pod_disruption_budget_of_one(replicas: int) -> None:
    """maxUnavailable 1 at any replica count: a drain takes one replica of a model at a time, and a model with
    one replica can still be drained (it is down until its pod runs elsewhere: docs/runbook.md). Pods that
    are not ready may always be evicted (they serve nothing): a broken GPU's pod never blocks the drain."""
    model = {**MODEL, "replicas": replicas}
    pdb = render("pdb.yml.j2", model)
    pods = render("statefulset.yml.j2", model)["spec"]["template"]["metadata"]["labels"]
    assert pdb["metadata"] == {
        "name": "qwen2-7b",
        "namespace": "serving",
        "labels": {
            "app.kubernetes.io/name": "vllm",
            "app.kubernetes.io/instance": "qwen2-7b",
            "app.kubernetes.io/part-of": "llm-serving",
        },
    }
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {
            "matchLabels": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": "qwen2-7b"}
        },
    }
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pods.items()


def test_the_pdb_is_applied_with_the_model_and_removed_with_a_canary() -> None:
    apply = yaml.safe_load((ROLE / "tasks" / "apply.yml").read_text())
    # each model's objects are rendered once, read, and the ones that differ applied (compare before apply)
    rendered = next(t for t in apply if "StatefulSet" in t["name"] and "ansible.builtin.set_fact" in t)
    assert "pdb.yml.j2" in str(rendered["ansible.builtin.set_fact"]["__vllm_serving_model_objects"])
    read = next(t for t in apply if "k8s_live_objects" in t)
    applied = next(t for t in apply if "kubernetes.core.k8s" in t and "models' objects" in t["name"])
    assert "__vllm_serving_objects" in read["k8s_live_objects"]["objects"]
    assert applied["loop"].replace(" ", "").startswith("{{__vllm_serving_objects|k8s_not_as_rendered(")
    rollout = ROOT / "roles" / "model_rollout" / "tasks"
    for action in ("promote.yml", "rollback.yml"):
        text = (rollout / action).read_text()
        assert "{api_version: policy/v1, kind: PodDisruptionBudget}" in text, action


def test_the_runtime_class_is_the_device_plugin_roles() -> None:
    """One home: the RuntimeClass the nvidia_device_plugin role creates, never a literal in the template."""
    assert render("statefulset.yml.j2", MODEL)["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    renamed = render("statefulset.yml.j2", MODEL, nvidia_device_plugin_runtime_class="nvidia-cdi")
    assert renamed["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia-cdi"


def test_scraped_by_the_monitoring_job(statefulset: dict[str, Any]) -> None:
    """The labels and annotations the monitoring role's `vllm` scrape job keeps."""
    meta = statefulset["spec"]["template"]["metadata"]
    assert meta["labels"]["app.kubernetes.io/name"] == "vllm"
    assert meta["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }


GPU_NODE_VARS = {"nvidia_driver_branch": "535", "nvidia_driver_expected_gpu_count": 4}


def run_validate(
    tmp_path: Path, gpu_node_vars: dict[str, Any] = GPU_NODE_VARS, **variables: Any
) -> subprocess.CompletedProcess[str]:
    """validate.yml on localhost, which is in gpu_nodes with GPU_NODE_VARS (the gpu stage's group vars)."""
    inventory = {"all": {"children": {"gpu_nodes": {"hosts": {"localhost": None}, "vars": gpu_node_vars}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"vllm_serving_image_digest": DIGEST, "vllm_serving_models": [MODEL], **variables},
            "tasks": [{"ansible.builtin.include_role": {"name": "vllm_serving", "tasks_from": "validate"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    return subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "ansible-playbook"),
            "-i",
            str(tmp_path / "hosts.yml"),
            "-c",
            "local",
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={"ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"},
        timeout=120,
    )


def test_good_input_passes(tmp_path: Path) -> None:
    result = run_validate(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("variables", "ok"),
    [
        ({"vllm_serving_shm_size": "8Gi"}, False),  # Ray's store (10 GB) would not fit: it moves to /tmp
        ({"vllm_serving_shm_size": "12Gi"}, True),
        ({"vllm_serving_shm_size": "8Gi", "vllm_serving_models": [{**MODEL, "gpus_per_replica": 1}]}, True),
        ({"vllm_serving_memory": "1Gi", "vllm_serving_shm_size": "512Mi"}, True),  # 30 % of 1Gi fits: lab
        ({"vllm_serving_memory": "1Gi", "vllm_serving_shm_size": "256Mi"}, False),
        ({"vllm_serving_memory": "16Gi", "vllm_serving_shm_size": "16Gi"}, False),  # shm counts as memory
    ],
    ids=["tp2-8Gi", "tp2-12Gi", "tp1-8Gi", "lab-1Gi-512Mi", "lab-1Gi-256Mi", "shm-as-large-as-memory"],
)
def test_dev_shm_is_sized_for_the_ray_object_store_and_below_the_memory_limit(
    tmp_path: Path, variables: dict[str, Any], ok: bool
) -> None:
    result = run_validate(tmp_path, **variables)
    out = " ".join(result.stdout.split())
    assert (result.returncode == 0) == ok, out[-2000:]
    if not ok:
        assert "vllm_serving_models[0] (qwen2-7b)" in out and "vllm_serving_shm_size" in out, out[-2000:]


@pytest.mark.parametrize(
    ("variables", "named", "says"),
    [
        ({"vllm_serving_image_digest": ""}, "vllm_serving_image_digest", "sha256:<64 hex>"),
        (
            {"vllm_serving_image_tag": "v0.4.3"},
            "vllm_serving_image_tag v0.4.3 needs CUDA 12.4",
            "runs CUDA up to 12.2",
        ),
        ({"vllm_serving_image_tag": "latest"}, "vllm_serving_image_tag", "not in the role's table"),
        (
            {"vllm_serving_models": [{**MODEL, "gpus_per_replica": 8}]},
            "vllm_serving_models[0]",
            "gpus_per_replica",
        ),
        (
            {"vllm_serving_models": [{**MODEL, "resources": {"requests": {"nvidia.com/gpu": 1}}}]},
            "vllm_serving_models[0] (qwen2-7b).resources.requests.nvidia.com/gpu",
            "must equal its limit",
        ),
        (
            {"vllm_serving_models": [{**MODEL, "name": "Qwen2_7B"}]},
            "vllm_serving_models[0] (Qwen2_7B).name",
            "not a DNS-1035 label",
        ),
        ({"vllm_serving_models": [{**MODEL, "name": "7b"}]}, "vllm_serving_models[0] (7b).name", "DNS-1035"),
        ({"vllm_serving_memory": "64GB"}, "vllm_serving_memory: '64GB' is not a quantity", "64Gi"),
        ({"vllm_serving_shm_size": "1.5Gb"}, "vllm_serving_shm_size: '1.5Gb' is not a quantity", "Ki Mi Gi"),
        ({"vllm_serving_cpu": "2 cores"}, "vllm_serving_cpu: '2 cores' is not a quantity", "500m"),
        ({"vllm_serving_namespace": "Serving"}, "vllm_serving_namespace: 'Serving'", "DNS-1123 label"),
        ({"vllm_serving_uid": 0}, "vllm_serving_uid", "not root"),
        (
            {"vllm_serving_models": [{**MODEL, "resources": {"limits": {"memory": "64GB"}}}]},
            "vllm_serving_models[0] (qwen2-7b).resources.limits.memory: '64GB'",
            "is not a quantity",
        ),
        (
            {"vllm_serving_models": [{**MODEL, "replicas": 2**31}]},
            "vllm_serving_models[0] (qwen2-7b).replicas",
            "not a replica count",
        ),
        (
            {"vllm_serving_models": [{k: v for k, v in MODEL.items() if k != "version"}]},
            "vllm_serving_models[0] (qwen2-7b).version",
            "neither set on the entry nor listed",
        ),
        (
            {"vllm_serving_models": [{**MODEL, "version": "current"}]},
            "vllm_serving_models[0] (qwen2-7b).version",
            "not a version directory name",
        ),
        (
            {"vllm_serving_models": [{**MODEL, "gpu_count": 2}]},
            "vllm_serving_models[0]",
            "keys must be among",
        ),
        (
            {"vllm_serving_prestop_sleep_s": 60},
            "vllm_serving_prestop_sleep_s",
            "below the replicas' termination",
        ),
    ],
    ids=[
        "no-digest",
        "cuda-too-new",
        "unknown-tag",
        "gpus-over-node",
        "requests-not-limits",
        "bad-name",
        "name-starts-with-a-digit",
        "memory-64GB",
        "shm-1.5Gb",
        "cpu-2-cores",
        "namespace",
        "uid-root",
        "resources-64GB",
        "replicas-int32",
        "no-version",
        "version-current",
        "unknown-key",
        "prestop-sleep",
    ],
)
def test_bad_input_is_refused_naming_the_variable(
    tmp_path: Path, variables: dict[str, Any], named: str, says: str
) -> None:
    result = run_validate(tmp_path, **variables)
    assert result.returncode != 0
    out = " ".join(result.stdout.split())
    assert named in out and says in out, out[-2000:]


def test_a_stopping_replica_keeps_serving_until_kube_proxy_dropped_it(statefulset: dict[str, Any]) -> None:
    """A drain or rolling update: the replica sleeps before SIGTERM (preStop sleep action, GA in 1.34) while
    the gateways' kube-proxy takes it out of the model's Service, within the grace period."""
    pod = statefulset["spec"]["template"]["spec"]
    sleep = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert 0 < sleep < pod["terminationGracePeriodSeconds"], pod


def test_the_version_defaults_to_the_models_stage_list(tmp_path: Path) -> None:
    """Without `version` the entry mounts the version model_sync_models lists for it; a canary entry reads
    another model's directory through weights_name."""
    entry = {k: v for k, v in MODEL.items() if k != "version"}
    synced = [{"name": "qwen2-7b", "version": "v7"}]
    assert run_validate(tmp_path, vllm_serving_models=[entry], model_sync_models=synced).returncode == 0
    canary = {**MODEL, "name": "qwen2-7b-canary", "weights_name": "qwen2-7b", "version": "v8"}
    volumes = render("statefulset.yml.j2", canary)["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["hostPath"]["path"] == "/models/qwen2-7b/v8"


def test_the_nodes_driver_and_gpu_count_come_from_the_gpu_stage(tmp_path: Path) -> None:
    """One home: the gpu stage's nvidia_driver_branch and nvidia_driver_expected_gpu_count decide."""
    one_gpu = run_validate(tmp_path, {**GPU_NODE_VARS, "nvidia_driver_expected_gpu_count": 1})
    out = " ".join(one_gpu.stdout.split())
    assert one_gpu.returncode != 0  # the entry's default 2 GPUs per replica do not fit a 1-GPU node
    assert "gpus_per_replica an integer from 1 to vllm_serving_node_gpus (1), got 2" in out, out[-2000:]
    newer = run_validate(
        tmp_path, {**GPU_NODE_VARS, "nvidia_driver_branch": "550"}, vllm_serving_image_tag="v0.4.3"
    )
    assert newer.returncode == 0, newer.stdout[-2000:]
    unset = run_validate(tmp_path, {})
    out = " ".join(unset.stdout.split())
    assert unset.returncode != 0
    assert "nvidia_driver_branch and nvidia_driver_expected_gpu_count" in out, out[-2000:]


def test_a_newer_driver_admits_the_newer_image(tmp_path: Path) -> None:
    result = run_validate(tmp_path, vllm_serving_image_tag="v0.4.3", vllm_serving_driver_branch="550")
    assert result.returncode == 0, result.stdout + result.stderr
