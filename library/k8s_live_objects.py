#!/usr/bin/python
"""Ansible module k8s_live_objects: read, in one call, the live objects of a role's rendered manifests."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k8s_live_objects
short_description: Read the live objects a role renders, all kinds in one call
description:
  - For the rendered objects in O(objects), reads what the cluster holds under the same API group, kind,
    namespace and name, and returns those live objects in RV(resources). Objects the cluster lacks are not
    in it.
  - One module call for every kind, where a M(kubernetes.core.k8s_info) loop is a call per kind, each of them
    a Python start and an import of the kubernetes client on the node (about 0.6 s). Meant to run before the
    role's M(kubernetes.core.k8s) applies, so that each applies only what the C(k8s_not_as_rendered) filter
    finds not held as rendered (plugins/filter/kubernetes_drift.py).
  - A kind with one rendered object in a namespace is read with a GET of that object, a kind with more with
    one list call. A kind the API server does not serve (a CustomResourceDefinition not created yet) has no
    live objects.
  - "C(metadata.managedFields) is left out of what comes back: nothing compares it, and it is most of the
    bytes."
  - Never changes anything; C(changed) is always false, and it runs the same in check mode.
  - "Secrets: RV(resources) holds their data. Give the task C(no_log: true) when O(objects) has a Secret."
version_added: "0.1.0"
author: "A100 LLM platform team"
options:
  objects:
    description:
      - The rendered objects. Only C(apiVersion), C(kind), C(metadata.name) and C(metadata.namespace) are
        read.
      - An object of a namespaced kind must name its C(metadata.namespace).
    type: list
    elements: dict
    required: true
  all_of:
    description:
      - Kinds read whole, each with one list call, every object of it in RV(resources) whatever its name
        (the Nodes, or the EndpointSlices of a namespace), where a role reads what the cluster has rather than
        what it renders. A kind both here and in O(objects), under the same namespace, is read once, whole.
      - Each gives C(apiVersion) and C(kind), and C(namespace) for a namespaced kind.
    type: list
    elements: dict
    default: []
  kubeconfig:
    description: The kubeconfig to reach the API server with.
    type: path
    required: true
requirements:
  - kubernetes (the Python client; role kubernetes_api_client installs it on the control plane)
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - llm_platform
seealso:
  - module: kubernetes.core.k8s_info
  - module: kubernetes.core.k8s
"""

EXAMPLES = r"""
- name: Read the gateway's objects the cluster holds
  k8s_live_objects:
    kubeconfig: /etc/kubernetes/admin.conf
    objects: "{{ __llm_gateway_objects }}"
  register: __llm_gateway_live
  vars:
    ansible_python_interpreter: "{{ kubernetes_api_client_python }}"

- name: Apply the gateway's objects the cluster does not hold as rendered
  kubernetes.core.k8s:
    kubeconfig: /etc/kubernetes/admin.conf
    definition: "{{ __llm_gateway_to_apply }}"
  vars:
    __llm_gateway_to_apply: "{{ __llm_gateway_objects | k8s_not_as_rendered(__llm_gateway_live.resources) }}"
  when: __llm_gateway_to_apply | length > 0
"""

RETURN = r"""
resources:
  description:
    - The live objects, each with its C(apiVersion) and C(kind) (a list call leaves them out of its items), in
      the order of the kinds first met in O(objects), then O(all_of).
    - Only objects whose name is rendered under that kind and namespace, and every object of a kind in
      O(all_of).
  returned: always
  type: list
  elements: dict
  sample:
    - apiVersion: v1
      kind: ConfigMap
      metadata: {name: llm-gateway, namespace: serving}
      data: {routes.json: "{}"}
server:
  description:
    - The API server's URL the module read from, as the kubeconfig gives it (its current context's cluster).
      Never a credential.
  returned: always
  type: str
  sample: https://10.0.0.11:6443
reads:
  description: How many GET or list calls the module made.
  returned: always
  type: int
  sample: 3
"""

from collections.abc import Mapping
from typing import Any

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

try:
    from kubernetes import config as k8s_config
    from kubernetes import dynamic
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError, ResourceNotFoundError
except ImportError as error:  # reported by main()
    KUBERNETES_IMPORT_ERROR: ImportError | None = error
else:
    KUBERNETES_IMPORT_ERROR = None

# (apiVersion, kind, namespace) -> the rendered names under it; None: every object of the kind (option all_of)
Kinds = dict[tuple[str, str, str], list[str] | None]


def kinds_of(objects: list[Mapping[str, Any]]) -> Kinds:
    """The rendered names by apiVersion, kind and namespace, in the order first met; ValueError names the
    object whose identity is incomplete."""
    kinds: Kinds = {}
    for index, obj in enumerate(objects):
        metadata = obj.get("metadata") or {}
        api_version, kind, name = obj.get("apiVersion"), obj.get("kind"), metadata.get("name")
        if not (isinstance(api_version, str) and isinstance(kind, str) and isinstance(name, str)):
            raise ValueError(
                f"objects[{index}] must set apiVersion, kind and metadata.name as strings; got "
                f"apiVersion {api_version!r}, kind {kind!r}, metadata.name {name!r}"
            )
        namespace = str(metadata.get("namespace") or "")
        names = kinds.setdefault((api_version, kind, namespace), [])
        if names is not None and name not in names:
            names.append(name)
    return kinds


def with_whole_kinds(kinds: Kinds, all_of: list[Mapping[str, Any]]) -> Kinds:
    """KINDS with each kind of ALL_OF read whole (None for its names); ValueError names the entry whose
    apiVersion or kind is missing."""
    for index, entry in enumerate(all_of):
        api_version, kind, namespace = entry.get("apiVersion"), entry.get("kind"), entry.get("namespace")
        if not (isinstance(api_version, str) and isinstance(kind, str)):
            raise ValueError(
                f"all_of[{index}] must set apiVersion and kind as strings; got apiVersion {api_version!r}, "
                f"kind {kind!r}"
            )
        kinds[(api_version, kind, str(namespace or ""))] = None
    return kinds


def without_managed_fields(obj: dict[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    """OBJ with its apiVersion and kind set, and no metadata.managedFields."""
    obj.setdefault("apiVersion", api_version)
    obj.setdefault("kind", kind)
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


def read_live(client: Any, kinds: Kinds) -> tuple[list[dict[str, Any]], int]:
    """The live objects of KINDS and the number of reads; ValueError for a namespaced kind without a
    namespace, RuntimeError for a read the API server refused."""
    resources: list[dict[str, Any]] = []
    reads = 0
    for (api_version, kind, namespace), names in kinds.items():
        try:
            resource = client.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            continue  # not served (a CRD not created yet): nothing of it is live
        if resource.namespaced and not namespace:
            if names is None:
                raise ValueError(f"all_of: {kind} ({api_version}) is namespaced: set its namespace")
            raise ValueError(f"{kind} {names[0]} ({api_version}) is namespaced: set its metadata.namespace")
        scope = {"namespace": namespace} if resource.namespaced else {}
        reads += 1
        try:
            if names is not None and len(names) == 1:
                found = [resource.get(name=names[0], **scope).to_dict()]
            else:
                found = resource.get(**scope).to_dict().get("items") or []
        except NotFoundError:
            found = []
        except DynamicApiError as error:
            where = f" in namespace {namespace}" if namespace else ""
            raise RuntimeError(
                f"reading {kind} ({api_version}){where} failed: {error.status} {error.reason}: {error.body}"
            ) from error
        resources += [
            without_managed_fields(obj, api_version, kind)
            for obj in found
            if names is None or (obj.get("metadata") or {}).get("name") in names
        ]
    return resources, reads


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "objects": {"type": "list", "elements": "dict", "required": True},
            "all_of": {"type": "list", "elements": "dict", "default": []},
            "kubeconfig": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    if KUBERNETES_IMPORT_ERROR is not None:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=str(KUBERNETES_IMPORT_ERROR))
    try:
        kinds = with_whole_kinds(kinds_of(module.params["objects"]), module.params["all_of"])
        api = k8s_config.new_client_from_config(config_file=module.params["kubeconfig"])
        resources, reads = read_live(dynamic.DynamicClient(api), kinds)
    except (ValueError, RuntimeError) as error:
        module.fail_json(msg=str(error))
    except ConfigException as error:
        module.fail_json(msg=f"kubeconfig {module.params['kubeconfig']}: {error}")
    module.exit_json(changed=False, resources=resources, reads=reads, server=api.configuration.host)


if __name__ == "__main__":
    main()
