"""The Kubernetes objects the product applies, rendered offline as the roles render them, for the unit tests
(which hold them against the schemas and the policies) and for the lab test that hands them to the real API
server (tests/lab/test_real_kubernetes_on_lab.py, with the lab inventory's values):

    from manifests_render import calico_objects, vllm_serving_object

    calico_objects()                                           # the roles' defaults
    vllm_serving_object("statefulset.yml.j2", model, **values)  # VALUES over the roles' defaults

- The cluster roles' objects (test_kubernetes_manifests.py): the nvidia RuntimeClass (its template), and
  Calico's and the device plugin's upstream manifests (tests/lab/upstream_manifests.py: the bytes the roles
  download, checked against their sha256) through the roles' own filter plugins.
- vllm_serving's Service, PodDisruptionBudget and StatefulSet of one model entry (test_serving_manifests.py).
- llm_gateway's and serving_network_policy's objects through the roles' own task files (tasks/validate.yml,
  tasks/render.yml) run by ansible-playbook on localhost (test_gateway_manifests.py).

The monitoring role's objects are monitoring_render.py's; a role template alone, role_render.py's.
Imported as `manifests_render` by the unit tests and as `unit.manifests_render` by the lab tests: it imports
nothing of either directory by a bare name.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from lab.upstream_manifests import manifest

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
NODE = {"inventory_hostname": "gpu-node-1", "node_ip": "10.89.42.11"}


# ------------------------------------------------------------------------------------- the cluster roles
def role_vars(role: str) -> dict[str, Any]:
    """A role's defaults and vars, the strings trusted as templates (as Ansible trusts the role's files)."""
    values: dict[str, Any] = {}
    for name in ("defaults", "vars"):
        path = ROLES / role / name / "main.yml"
        if path.is_file():
            loaded = yaml.safe_load(path.read_text()) or {}
            values |= {k: trust_as_template(v) if isinstance(v, str) else v for k, v in loaded.items()}
    return values


def templar(extra: dict[str, Any] | None = None) -> Templar:
    variables = {**role_vars("kubernetes"), **role_vars("kubernetes_api_client")}
    for role in ("kubeadm_control_plane", "calico", "nvidia_device_plugin"):
        variables |= role_vars(role)
    variables |= {**NODE, "ansible_managed": "Ansible managed", **(extra or {})}
    return Templar(loader=DataLoader(), variables=variables)


def render(role: str, template: str, extra: dict[str, Any] | None = None) -> str:
    """templates/TEMPLATE of one of the cluster roles, with their defaults and EXTRA over them."""
    return str(
        templar(extra).template(trust_as_template((ROLES / role / "templates" / template).read_text()))
    )


def filter_module(role: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"{role}_{name}", ROLES / role / "filter_plugins" / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def _upstream_documents(path: str, sha256: str) -> tuple[Any, ...]:
    data = manifest(path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha256, path
    return tuple(yaml.safe_load_all(data))


def upstream(role: str, path: str, values: dict[str, Any] | None = None) -> list[Any]:
    """The upstream manifest the role pins, after checking the bytes against the role's sha256 (the filters
    copy what they change: the parsed documents are shared)."""
    sha256 = {**role_vars(role), **(values or {})}[f"{role}_manifest_sha256"]
    return list(_upstream_documents(path, str(sha256)))


def calico_objects(**values: Any) -> list[dict[str, Any]]:
    """Calico's manifest through the calico role's filter, the pool being the pod subnet."""
    variables = {**role_vars("calico"), **role_vars("kubeadm_control_plane"), **values}
    docs = upstream("calico", f"calico/{variables['calico_version']}/calico.yaml", variables)
    return filter_module("calico", "calico_manifest").calico_manifest(
        docs, str(variables["kubeadm_control_plane_pod_subnet"])
    )


def device_plugin_objects(**values: Any) -> list[dict[str, Any]]:
    """The device plugin's manifest through its role's filter (its RuntimeClass and GPU node label)."""
    variables = {**role_vars("nvidia_device_plugin"), **values}
    docs = upstream(
        "nvidia_device_plugin",
        f"k8s-device-plugin/{variables['nvidia_device_plugin_version']}/nvidia-device-plugin.yml",
        variables,
    )
    module = filter_module("nvidia_device_plugin", "device_plugin_manifest")
    return module.nvidia_device_plugin_manifest(
        docs,
        str(variables["nvidia_device_plugin_runtime_class"]),
        dict(variables["nvidia_device_plugin_node_label"]),
    )


def runtime_class(**values: Any) -> dict[str, Any]:
    return dict(yaml.safe_load(render("nvidia_device_plugin", "runtimeclass.yaml.j2", values)))


def api_objects(**values: Any) -> list[tuple[str, dict[str, Any]]]:
    """(source, object) of every object the Kubernetes stage's cluster roles apply, in their order."""
    objects = [("nvidia_device_plugin/runtimeclass", runtime_class(**values))]
    objects += [("calico/calico.yaml", doc) for doc in calico_objects(**values)]
    objects += [("nvidia_device_plugin/manifest", doc) for doc in device_plugin_objects(**values)]
    return objects


# ------------------------------------------------------------------------------------------- vllm_serving
VLLM_SERVING = ROLES / "vllm_serving"


def vllm_serving_vars(**overrides: Any) -> dict[str, Any]:
    defaults = yaml.safe_load((VLLM_SERVING / "defaults" / "main.yml").read_text())
    # the RuntimeClass and GPU node label have one home, the device plugin role (validate.yml loads it)
    device_plugin = yaml.safe_load((ROLES / "nvidia_device_plugin" / "defaults" / "main.yml").read_text())
    return {
        **device_plugin,
        **defaults,
        **yaml.safe_load((VLLM_SERVING / "vars" / "main.yml").read_text()),
        **overrides,
    }


def vllm_serving_object(template: str, model: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """One of vllm_serving's templates for one model entry, as Ansible renders it (its filters used here:
    to_json, combine, round, int)."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["to_json"] = json.dumps
    env.filters["combine"] = lambda a, b: {**a, **b}
    text = env.from_string((VLLM_SERVING / "templates" / template).read_text())
    return dict(yaml.safe_load(text.render(**vllm_serving_vars(**overrides), model=model)))


VLLM_SERVING_TEMPLATES = ("service.yml.j2", "pdb.yml.j2", "statefulset.yml.j2")  # tasks/apply.yml's order


# ------------------------------------------------------------------------ llm_gateway, serving_network_policy
def playbook(tmp_path: Path, variables: dict[str, Any], tasks: list[dict[str, Any]], *args: str) -> Any:
    """TASKS in a play on localhost with VARIABLES as play vars, run by the checkout's ansible-playbook."""
    play = [{"hosts": "localhost", "gather_facts": False, "vars": variables, "tasks": tasks}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    return subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={ROOT / '.venv' / 'bin' / 'python'}",
            *args,
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={"ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"},
        timeout=180,
    )


def gateway_objects(
    tmp_path: Path, variables: dict[str, Any]
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """What llm_gateway and serving_network_policy apply, through their own task files with VARIABLES (the
    validation first): {'config': the gateway.yaml text, 'objects': ConfigMap, Service, PodDisruptionBudget,
    Deployment, 'secret': the JWT Secret, 'policies': the NetworkPolicies}, and the run (its output)."""
    out = tmp_path / "out.json"
    tasks = [
        {"ansible.builtin.include_role": {"name": "llm_gateway", "tasks_from": "validate", "public": True}},
        {
            "ansible.builtin.include_role": {
                "name": "serving_network_policy",
                "tasks_from": "validate",
                "public": True,
            }
        },
        {"ansible.builtin.include_role": {"name": "llm_gateway", "tasks_from": "render", "public": True}},
        {
            "name": "Write what was rendered",
            "ansible.builtin.copy": {
                "dest": str(out),
                "mode": "0600",
                "content": "{{ {'config': _llm_gateway_config_text, 'objects': _llm_gateway_objects,"
                " 'secret': lookup('ansible.builtin.template',"
                f" '{ROOT}/roles/llm_gateway/templates/secret.yml.j2') | from_yaml,"
                " 'policies': lookup('ansible.builtin.template',"
                f" '{ROOT}/roles/serving_network_policy/templates/policies.yml.j2') | from_yaml_all | list"
                " } | to_json }}",
            },
        },
    ]
    result = playbook(tmp_path, variables, tasks, "-v")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return json.loads(out.read_text()), result
