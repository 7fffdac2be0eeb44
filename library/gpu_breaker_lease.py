#!/usr/bin/python
"""Ansible module gpu_breaker_lease: take or give back the GPU health agents' circuit breaker Lease."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_breaker_lease
short_description: Take or give back the GPU circuit breaker's Lease (shared with the GPU health agents)
description:
  - The GPU health agents (role gpu_health_agent) and C(playbooks/remediate/ecc-cordon.yml) decide whether one
    more GPU node may be cordoned while holding one coordination.k8s.io Lease, so two deciders never both see
    room for one more. The rules (who holds it, when a hold expires, the held-back annotation) are
    C(module_utils/gpu_breaker.py), the code the agents run.
  - "O(state=held): waits (up to O(wait_timeout) seconds) while another holder's hold is live, then takes it
    with the resourceVersion read (a concurrent taker makes the write fail with 409 and it tries again).
    A holder that died loses it after the Lease's leaseDurationSeconds."
  - "O(state=released): gives it back if O(holder) holds it, and records O(held_back) in the Lease's held-back
    annotation (a node with a reason is named; a node with an empty reason is dropped)."
  - Needs the C(kubernetes) Python package (run it with the interpreter of role kubernetes_api_client).
  - In check mode it reads the Lease and reports its holder; it writes nothing.
version_added: "0.1.0"
author: "A100 LLM platform team"
options:
  state:
    description: Hold the Lease or give it back.
    type: str
    choices: [held, released]
    required: true
  kubeconfig:
    description: Kubeconfig to reach the API with.
    type: path
    required: true
  namespace:
    description: Namespace of the Lease (C(gpu_health_agent_namespace)).
    type: str
    required: true
  name:
    description: Name of the Lease.
    type: str
    required: true
  holder:
    description: Holder identity written into the Lease.
    type: str
    required: true
  duration:
    description: Seconds the hold lasts if the holder dies without giving it back (leaseDurationSeconds).
    type: int
    default: 120
  wait_timeout:
    description: Seconds to wait for another holder to give it back (O(state=held)).
    type: int
    default: 60
  held_back:
    description:
      - Node name -> why the breaker holds it back now; an empty string drops the node from the annotation
        (O(state=released)).
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - llm_platform
seealso:
  - module: gpu_cordon_plan
"""

EXAMPLES = r"""
- name: Take the breaker Lease
  gpu_breaker_lease:
    state: held
    kubeconfig: /etc/kubernetes/admin.conf
    namespace: gpu-health
    name: gpu-health-breaker
    holder: ecc-cordon.yml

- name: Give it back, naming the node the breaker left alone
  gpu_breaker_lease:
    state: released
    kubeconfig: /etc/kubernetes/admin.conf
    namespace: gpu-health
    name: gpu-health-breaker
    holder: ecc-cordon.yml
    held_back:
      gpu-node-3: "circuit breaker: 1 of 3 GPU nodes cordoned already"
"""

RETURN = r"""
holder:
  description: The Lease's holder after the call (null when free).
  returned: always
  type: str
waited:
  description: Seconds spent waiting for another holder (O(state=held)).
  returned: always
  type: float
msg:
  description: One-line summary.
  returned: always
  type: str
"""

import datetime as dt
import json
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.gpu_breaker import lease_live_holder, lease_released, lease_taken

try:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.client.exceptions import ApiException

    HAS_KUBERNETES = True
except ImportError:
    HAS_KUBERNETES = False


class Lease:
    def __init__(self, kubeconfig: str, namespace: str, name: str) -> None:
        self.api = k8s_client.CoordinationV1Api(k8s_config.new_client_from_config(config_file=kubeconfig))
        self.namespace = namespace
        self.name = name

    def read(self) -> dict[str, Any]:
        response = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
        return json.loads(response.data)

    def write(self, body: dict[str, Any]) -> None:
        self.api.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False)


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["held", "released"], "required": True},
            "kubeconfig": {"type": "path", "required": True},
            "namespace": {"type": "str", "required": True},
            "name": {"type": "str", "required": True},
            "holder": {"type": "str", "required": True},
            "duration": {"type": "int", "default": 120},
            "wait_timeout": {"type": "int", "default": 60},
            "held_back": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    if not HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"))
    p = module.params
    if p["duration"] < 1 or p["wait_timeout"] < 0:
        module.fail_json(msg="duration must be >= 1 and wait_timeout >= 0 seconds")
    where = f"Lease {p['namespace']}/{p['name']}"
    try:
        lease = Lease(p["kubeconfig"], p["namespace"], p["name"])
        current = lease.read()
    except ApiException as exc:
        module.fail_json(msg=f"{where}: cannot read it: HTTP {exc.status} {exc.reason}")
    except Exception as exc:  # kubeconfig unreadable, API unreachable
        module.fail_json(msg=f"{where}: cannot reach it with kubeconfig {p['kubeconfig']}: {exc}")
    holder = (current.get("spec") or {}).get("holderIdentity")
    if p["state"] == "released":
        if holder != p["holder"]:
            msg = f"{where}: not held by {p['holder']}"
            module.exit_json(changed=False, holder=holder, waited=0.0, msg=msg)
        if module.check_mode:
            module.exit_json(changed=True, holder=holder, waited=0.0, msg=f"{where}: would give it back")
        held = {node: (why or None) for node, why in p["held_back"].items()}
        try:
            lease.write(lease_released(current, held, p["holder"], now()))
        except ApiException as exc:  # it expires after leaseDurationSeconds anyway
            module.fail_json(msg=f"{where}: cannot give it back (expires by itself): HTTP {exc.status}")
        module.exit_json(changed=True, holder=None, waited=0.0, msg=f"{where}: given back")
    started = time.monotonic()
    while True:
        other = lease_live_holder(current, p["holder"], now())
        waited = round(time.monotonic() - started, 2)
        if other is None:
            if module.check_mode:
                msg = f"{where}: free (check mode)"
                module.exit_json(changed=False, holder=holder, waited=waited, msg=msg)
            try:
                lease.write(lease_taken(current, p["holder"], p["duration"], now()))
                module.exit_json(changed=True, holder=p["holder"], waited=waited, msg=f"{where}: held")
            except ApiException as exc:
                if exc.status != 409:  # 409: another decider took it between the read and the write
                    module.fail_json(msg=f"{where}: cannot take it: HTTP {exc.status} {exc.reason}")
        elif waited >= p["wait_timeout"]:
            module.fail_json(
                msg=f"{where}: held by {other} for more than {p['wait_timeout']} s; try again, or wait for "
                "its hold to expire (leaseDurationSeconds)",
                holder=other,
                waited=waited,
            )
        time.sleep(0.5)
        current = lease.read()
        holder = (current.get("spec") or {}).get("holderIdentity")


if __name__ == "__main__":
    main()
