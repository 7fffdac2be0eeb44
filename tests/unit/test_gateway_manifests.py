"""The llm_gateway and serving_network_policy roles' objects, rendered through the roles' own task files
(tasks/render.yml, templates/policies.yml.j2) by ansible-playbook: every object validates against the
Kubernetes 1.36 schemas (kubernetes-validate, strict); the policies hold (non-root, probes, resources
requests == limits, image by digest, NodePort 30001, PDB, a config change rolls the pods); the rendered
gateway configuration is one the gateway itself accepts (llm_gateway.config.parse_config) with the canary
weights of the rollout ConfigMap; the network policies allow exactly the paths the stage promises; bad input
is refused naming the variable, and the JWT secret never appears in the output."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from manifests_render import gateway_objects, playbook

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.36.0"
DIGEST = "sha256:" + "cd" * 32
SECRET = "unit-test-jwt-secret-0123456789abcdef"
MODELS = [
    {"name": "qwen2-7b", "served_model_name": "qwen2-7b", "replicas": 2},
    {"name": "qwen2-7b-v2", "served_model_name": "qwen2-7b", "replicas": 1},
    {"name": "embed", "replicas": 1},
]
CANARY = json.dumps({"qwen2-7b": {"canary": {"name": "qwen2-7b-v2", "weight": 10}}})
EXTRA_EGRESS = [
    {"name": "redis", "namespace": "cache", "pod_labels": {"app": "redis"}, "ports": [6379]},
    {"name": "minio", "cidr": "10.20.0.10/32", "ports": [9000]},
]


def good_vars(**overrides: Any) -> dict[str, Any]:
    return {
        "llm_gateway_image_digest": DIGEST,
        "llm_gateway_jwt_secret": SECRET,
        "llm_gateway_models": MODELS,
        "serving_network_policy_vllm_extra_egress": EXTRA_EGRESS,
        **overrides,
    }


def render(tmp_path: Path, rollout_state: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    return gateway_objects(tmp_path, good_vars(_llm_gateway_rollout_state=rollout_state))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    with_canary, run = render(tmp_path_factory.mktemp("canary"), CANARY)
    without, _ = render(tmp_path_factory.mktemp("plain"), "")
    return {"canary": with_canary, "plain": without, "run": run}


def objects(rendered: dict[str, Any]) -> dict[str, dict[str, Any]]:
    data = rendered["canary"]
    every = [*data["objects"], data["secret"], *data["policies"]]
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in every}


def deployment(data: dict[str, Any]) -> dict[str, Any]:
    return next(o for o in data["objects"] if o["kind"] == "Deployment")


def test_every_object_validates_against_the_1_36_schemas(rendered: dict[str, Any]) -> None:
    found = objects(rendered)
    assert set(found) >= {
        "ConfigMap/llm-gateway-config",
        "Service/llm-gateway",
        "PodDisruptionBudget/llm-gateway",
        "Deployment/llm-gateway",
        "Secret/llm-gateway-jwt",
        "NetworkPolicy/default-deny",
        "NetworkPolicy/vllm",
        "NetworkPolicy/llm-gateway",
        "NetworkPolicy/vllm-egress-redis",
        "NetworkPolicy/vllm-egress-minio",
    }
    for name, obj in found.items():
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"{name}: {exc}")


def test_strict_validation_catches_a_misspelt_field(rendered: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(deployment(rendered["canary"])))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_pod_runs_non_root_read_only_with_guaranteed_resources(rendered: dict[str, Any]) -> None:
    pod = deployment(rendered["canary"])["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert pod["automountServiceAccountToken"] is False
    container = pod["containers"][0]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert (
        container["resources"]["requests"]
        == container["resources"]["limits"]
        == {"cpu": "4", "memory": "4Gi"}
    )


def test_probes_image_and_ports(rendered: dict[str, Any]) -> None:
    container = deployment(rendered["canary"])["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["image"] == f"localhost/llm-gateway:0.1.0@{DIGEST}"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8000, "metrics": 9000}
    env = {e["name"]: e for e in container["env"]}
    assert env["GATEWAY_JWT_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": "llm-gateway-jwt",
        "key": "jwt-secret",
    }
    assert "value" not in env["GATEWAY_JWT_SECRET"]


def test_a_stopping_pod_keeps_serving_until_kube_proxy_dropped_it(rendered: dict[str, Any]) -> None:
    """A drain or rolling update: the pod sleeps before SIGTERM (preStop sleep action, GA in 1.34) while
    every node's kube-proxy takes it out of the NodePort's endpoints, within the grace period."""
    pod = deployment(rendered["canary"])["spec"]["template"]["spec"]
    sleep = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert 0 < sleep < pod["terminationGracePeriodSeconds"], pod


def test_nodeport_pdb_and_scrape_annotations(rendered: dict[str, Any]) -> None:
    found = objects(rendered)
    service = found["Service/llm-gateway"]["spec"]
    assert service["type"] == "NodePort" and service["ports"][0]["nodePort"] == 30001
    assert found["PodDisruptionBudget/llm-gateway"]["spec"]["minAvailable"] == 1
    template = deployment(rendered["canary"])["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "9000"
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "llm-gateway"


def test_the_config_checksum_rolls_the_pods_when_the_config_changes(rendered: dict[str, Any]) -> None:
    for variant in ("canary", "plain"):
        data = rendered[variant]
        configmap = next(o for o in data["objects"] if o["kind"] == "ConfigMap")
        annotation = deployment(data)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        assert annotation == hashlib.sha256(configmap["data"]["gateway.yaml"].encode()).hexdigest()
    first, second = (
        deployment(rendered[v])["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for v in ("canary", "plain")
    )
    assert first != second


def test_the_gateway_accepts_the_rendered_config_with_the_canary_weights(
    rendered: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_gateway.config import parse_config

    monkeypatch.setenv("GATEWAY_JWT_SECRET", SECRET)  # what the pod gets from the Secret

    config = parse_config(yaml.safe_load(rendered["canary"]["config"]))
    upstreams = {u.name: (u.weight, u.url, u.served_model) for u in config.models["qwen2-7b"].upstreams}
    assert upstreams == {
        "qwen2-7b": (90, "http://qwen2-7b.serving.svc:8000", "qwen2-7b"),
        "qwen2-7b-v2": (10, "http://qwen2-7b-v2.serving.svc:8000", "qwen2-7b"),
    }
    assert [(u.name, u.weight) for u in config.models["embed"].upstreams] == [("embed", 100)]
    assert config.auth.hs256_secret_env == "GATEWAY_JWT_SECRET" and config.internal.host == "0.0.0.0"
    plain = parse_config(yaml.safe_load(rendered["plain"]["config"]))
    # without a canary both entries serving qwen2-7b share the traffic
    assert sorted(u.weight for u in plain.models["qwen2-7b"].upstreams) == [50, 50]


def test_the_secret_is_in_the_secret_and_never_in_the_output(rendered: dict[str, Any]) -> None:
    secret = objects(rendered)["Secret/llm-gateway-jwt"]
    assert base64.b64decode(secret["data"]["jwt-secret"]).decode() == SECRET
    run = rendered["run"]
    assert SECRET not in run.stdout + run.stderr
    assert SECRET not in rendered["canary"]["config"]


def load_filter() -> Any:
    spec = importlib.util.spec_from_file_location(
        "gw_filter", ROOT / "roles/llm_gateway/filter_plugins/llm_gateway.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("state", "says"),
    [
        ("{not json", "not JSON"),
        (
            '{"qwen2-7b": {"canary": {"name": "qwen2-7b-v2", "weight": 101}}}',
            "weight must be an integer 0-100",
        ),
        ('{"qwen2-7b": {"canary": {"name": "Bad_Name", "weight": 5}}}', "canary.name"),
        ('{"other": {"canary": {"name": "qwen2-7b-v2", "weight": 5}}}', "a canary for other"),
    ],
)
def test_a_bad_rollout_state_names_the_key(state: str, says: str) -> None:
    module = load_filter()
    with pytest.raises(Exception, match=r"state\.json") as info:
        module.gateway_models(MODELS, "serving", state)
    assert says in str(info.value)


def test_promote_and_a_canary_outside_the_model_list() -> None:
    module = load_filter()
    full = module.gateway_models(
        MODELS[:1], "serving", '{"qwen2-7b": {"canary": {"name": "qwen2-7b-v3", "weight": 100}}}'
    )
    assert [(u["name"], u["weight"]) for u in full["qwen2-7b"]["upstreams"]] == [
        ("qwen2-7b", 0),
        ("qwen2-7b-v3", 100),
    ]
    assert full["qwen2-7b"]["upstreams"][1]["url"] == "http://qwen2-7b-v3.serving.svc:8000"


def policy(rendered: dict[str, Any], name: str) -> dict[str, Any]:
    return objects(rendered)[f"NetworkPolicy/{name}"]["spec"]


def test_default_deny_selects_every_pod_both_ways(rendered: dict[str, Any]) -> None:
    spec = policy(rendered, "default-deny")
    assert spec == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def test_vllm_accepts_only_the_gateway_and_prometheus_and_reaches_only_dns(rendered: dict[str, Any]) -> None:
    spec = policy(rendered, "vllm")
    assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "vllm"}}
    (ingress,) = spec["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": "http"}]
    assert ingress["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "llm-gateway"}}},
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        },
    ]
    (egress,) = spec["egress"]
    assert egress["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
    assert {p["port"] for p in egress["ports"]} == {53}


def test_the_extra_egress_targets(rendered: dict[str, Any]) -> None:
    redis = policy(rendered, "vllm-egress-redis")
    assert redis["policyTypes"] == ["Egress"] and "ingress" not in redis
    assert redis["egress"][0]["to"][0]["podSelector"] == {"matchLabels": {"app": "redis"}}
    assert redis["egress"][0]["ports"] == [{"protocol": "TCP", "port": 6379}]
    minio = policy(rendered, "vllm-egress-minio")
    assert minio["egress"][0]["to"] == [{"ipBlock": {"cidr": "10.20.0.10/32"}}]


def test_gateway_open_on_its_port_and_reaching_only_vllm_and_dns(rendered: dict[str, Any]) -> None:
    spec = policy(rendered, "llm-gateway")
    public, metrics = spec["ingress"]
    assert "from" not in public and public["ports"] == [{"protocol": "TCP", "port": "http"}]
    assert metrics["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    assert metrics["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    to_vllm, dns = spec["egress"]
    assert to_vllm == {
        "to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "vllm"}}}],
        "ports": [{"protocol": "TCP", "port": "http"}],
    }
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}


def validate(tmp_path: Path, **variables: Any) -> subprocess.CompletedProcess[str]:
    tasks = [
        {"ansible.builtin.include_role": {"name": "llm_gateway", "tasks_from": "validate"}},
        {"ansible.builtin.include_role": {"name": "serving_network_policy", "tasks_from": "validate"}},
    ]
    return playbook(tmp_path, good_vars(**variables), tasks)


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        ({"llm_gateway_image_digest": ""}, "llm_gateway_image_digest must be the digest"),
        ({"llm_gateway_image_digest": "sha256:abc"}, "llm_gateway_image_digest must be the digest"),
        ({"llm_gateway_jwt_secret": "short-secret"}, "llm_gateway_jwt_secret must be a string of at least"),
        ({"llm_gateway_node_port": 8080}, "llm_gateway_node_port: 8080 is not a NodePort"),
        ({"llm_gateway_pdb_min_available": 2}, "llm_gateway_pdb_min_available (2) below it"),
        ({"llm_gateway_settings": {"auth": {"mode": "none"}}}, "llm_gateway_settings may carry only"),
        ({"llm_gateway_memory": "4 GB"}, "llm_gateway_memory: '4 GB' is not a quantity"),
        ({"llm_gateway_memory": "4GB"}, "llm_gateway_memory: '4GB' is not a quantity"),
        ({"llm_gateway_cpu": "2 cores"}, "llm_gateway_cpu: '2 cores' is not a quantity"),
        ({"llm_gateway_namespace": "Serving"}, "llm_gateway_namespace: 'Serving' is not a DNS-1123 label"),
        ({"llm_gateway_image_tag": "0.1.0+local"}, "llm_gateway_image_tag (label app.kubernetes.io/version)"),
        ({"llm_gateway_models": [{"name": "7b"}]}, "llm_gateway_models[0] (7b).name: '7b' is not a DNS-1035"),
        (
            {"serving_network_policy_prometheus_labels": {"app.kubernetes.io/name": "prom etheus"}},
            "serving_network_policy_prometheus_labels: label value 'prom etheus'",
        ),
        (
            {"serving_network_policy_dns_labels": {"k8s app": "kube-dns"}},
            "serving_network_policy_dns_labels: label key 'k8s app'",
        ),
        (
            {"serving_network_policy_vllm_extra_egress": [{**EXTRA_EGRESS[0], "pod_labels": {"a": "x y"}}]},
            "serving_network_policy_vllm_extra_egress[0] (redis).pod_labels: label value 'x y'",
        ),
        (
            {"serving_network_policy_vllm_extra_egress": [{**EXTRA_EGRESS[1], "cidr": "10.20.0.10/33"}]},
            "serving_network_policy_vllm_extra_egress[0] (minio).cidr: '10.20.0.10/33' is not a CIDR",
        ),
        ({"llm_gateway_models": []}, "llm_gateway_models (the serving stage passes vllm_serving_models)"),
        (
            {"serving_network_policy_vllm_extra_egress": [{"name": "redis", "ports": [6379]}]},
            "serving_network_policy_vllm_extra_egress[0]",
        ),
        (
            {"serving_network_policy_vllm_extra_egress": [{"name": "x", "cidr": "10.0.0.1/8", "ports": [0]}]},
            "serving_network_policy_vllm_extra_egress[0]",
        ),
        (
            {"llm_gateway_prestop_sleep_s": 30},
            "llm_gateway_prestop_sleep_s must be 1 or more seconds and below the pods' termination grace"
            " period (30 s)",
        ),
    ],
    ids=["no-digest", "short-digest", "short-secret", "nodeport", "pdb", "settings", "memory", "memory-4GB",
         "cpu-2-cores", "namespace", "tag-label", "model-name", "prometheus-labels", "dns-labels",
         "egress-pod-labels", "egress-cidr", "no-models", "egress-no-target", "egress-port", "prestop-sleep"],
)  # fmt: skip
def test_bad_input_is_refused_naming_the_variable(
    tmp_path: Path, variables: dict[str, Any], says: str
) -> None:
    result = validate(tmp_path, **variables)
    assert result.returncode != 0
    out = " ".join(result.stdout.split())
    assert says in out, out[-2000:]
    assert "short-secret" not in result.stdout + result.stderr


def test_good_input_passes_validation(tmp_path: Path) -> None:
    result = validate(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]


# ---------------------------------------------------------- the role's one read of the API (read-rollout.yml)
GATEWAY_TASKS = ROOT / "roles" / "llm_gateway" / "tasks"


def identity(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    return (obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def test_one_read_brings_the_canary_state_and_every_object_the_role_applies(
    rendered: dict[str, Any], tmp_path: Path
) -> None:
    """read-rollout.yml's k8s_live_objects call, no_log, asks for the rollout ConfigMap, the JWT Secret and
    the four objects by identity, rendered before the canary state is known: the same identities render.yml
    makes with a canary or without (a state changes the configuration and its checksum, never a name), so a
    converged cluster holds them as rendered and apply.yml applies nothing. The canary state is the rollout
    ConfigMap's (by name, not another ConfigMap's key), '' without it."""
    tasks = yaml.safe_load((GATEWAY_TASKS / "read-rollout.yml").read_text())
    (read,) = [t for t in tasks if "k8s_live_objects" in t]
    (keep,) = [t for t in tasks if t["name"] == "Keep the canary state"]
    assert read["no_log"] is True and read["register"] == "__llm_gateway_live"
    assert tasks.index(read) < tasks.index(keep)
    apply_tasks = yaml.safe_load((GATEWAY_TASKS / "apply.yml").read_text())
    assert not [t for t in apply_tasks if "k8s_live_objects" in t or "kubernetes.core.k8s_info" in t]
    assert all("__llm_gateway_live.resources" in json.dumps(t) for t in apply_tasks[1:])
    main = [
        t.get("ansible.builtin.import_tasks")
        for t in yaml.safe_load((GATEWAY_TASKS / "main.yml").read_text())
    ]
    assert main.index("read-rollout.yml") < main.index("apply.yml")

    read_vars = {k: v for k, v in read["vars"].items() if k != "ansible_python_interpreter"}
    (tmp_path / "templates").symlink_to(ROOT / "roles" / "llm_gateway" / "templates")  # the role's lookups
    state = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "llm-rollout", "namespace": "serving"},
        "data": {"state.json": CANARY},
    }
    decoy = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "other", "namespace": "serving"},
        "data": {"state.json": "{}"},
    }
    play = [
        {"ansible.builtin.include_role": {"name": "llm_gateway", "tasks_from": "validate", "public": True}},
        {
            "name": "Write what the read asks for",
            "ansible.builtin.copy": {
                "dest": str(tmp_path / "ids.json"),
                "mode": "0600",
                "content": "{{ __asked | to_json }}",
            },
            "vars": {**read_vars, "__asked": read["k8s_live_objects"]["objects"]},
        },
        {**keep, "vars": {"__llm_gateway_live": {"resources": [decoy, state]}}},
        {
            "ansible.builtin.copy": {
                "dest": str(tmp_path / "canary.txt"),
                "mode": "0600",
                "content": "{{ _llm_gateway_rollout_state | to_json }}",
            }
        },
        {**keep, "vars": {"__llm_gateway_live": {"resources": [decoy]}}},
        {
            "ansible.builtin.copy": {
                "dest": str(tmp_path / "none.txt"),
                "mode": "0600",
                "content": "{{ _llm_gateway_rollout_state | to_json }}",
            }
        },
    ]
    result = playbook(tmp_path, good_vars(), play)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    asked = [identity(o) for o in json.loads((tmp_path / "ids.json").read_text())]
    for data in (rendered["canary"], rendered["plain"]):
        assert asked == [
            ("v1", "ConfigMap", "serving", "llm-rollout"),
            identity(data["secret"]),
            *map(identity, data["objects"]),
        ]
    assert json.loads((tmp_path / "canary.txt").read_text()) == CANARY
    assert json.loads((tmp_path / "none.txt").read_text()) == ""
