"""The gateway's `models` section from the vLLM model entries and the canary state (ConfigMap llm-rollout).

One home for the rule "a model with a canary has two upstreams, stable 100-w and canary w", used by the role's
template and by tests/unit/test_gateway_manifests.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported by the unit tests without Ansible's plugin loader

    class AnsibleFilterError(Exception):  # type: ignore[no-redef]
        """Stands in for Ansible's error outside Ansible."""


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def parse_rollout_state(
    text: str | None, where: str = "ConfigMap llm-rollout, key state.json"
) -> dict[str, Any]:
    """The canary per served model name; absent or empty = no canaries. Errors name the key."""
    if text is None or not str(text).strip():
        return {}
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise AnsibleFilterError(f"{where}: not JSON ({exc})") from None
    if not isinstance(state, dict):
        raise AnsibleFilterError(f"{where}: must be a JSON object {{model: {{canary: ...}}}}")
    canaries: dict[str, Any] = {}
    for model, entry in state.items():
        canary = entry.get("canary") if isinstance(entry, dict) else None
        if canary is None:
            continue
        if not isinstance(canary, dict):
            raise AnsibleFilterError(f"{where}: [{model!r}].canary must be an object {{name, weight}}")
        name, weight = canary.get("name"), canary.get("weight")
        if not isinstance(name, str) or not DNS_LABEL.match(name):
            raise AnsibleFilterError(
                f"{where}: [{model!r}].canary.name must be a vLLM Service name, got {name!r}"
            )
        if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= 100:
            raise AnsibleFilterError(
                f"{where}: [{model!r}].canary.weight must be an integer 0-100, got {weight!r}"
            )
        canaries[model] = {"name": name, "weight": weight}
    return canaries


def gateway_models(
    models: list[dict[str, Any]], namespace: str, rollout_state: str | None = None, port: int = 8000
) -> dict[str, Any]:
    """{served model name: {upstreams: [...]}}; a canary takes weight w, the stable upstreams share 100-w."""
    canaries = parse_rollout_state(rollout_state)
    by_name = {m["name"]: m for m in models}
    served: dict[str, list[dict[str, Any]]] = {}
    for model in models:
        served.setdefault(model.get("served_model_name") or model["name"], []).append(model)
    unknown = sorted(set(canaries) - set(served))
    if unknown:
        raise AnsibleFilterError(
            f"ConfigMap llm-rollout, key state.json: a canary for {', '.join(unknown)}, which no entry of "
            f"the model list (vllm_serving_models) serves; served: {', '.join(sorted(served))}"
        )

    def upstream(name: str, served_model: str, weight: int) -> dict[str, Any]:
        return {
            "name": name,
            "url": f"http://{name}.{namespace}.svc:{port}",
            "served_model": served_model,
            "weight": weight,
        }

    result: dict[str, Any] = {}
    for served_name, entries in served.items():
        canary = canaries.get(served_name)
        stable = [m for m in entries if canary is None or m["name"] != canary["name"]]
        canary_weight = 0 if canary is None else canary["weight"]
        if not stable and canary is not None:
            canary_weight = 100  # the canary is the model's only server
        share, rest = divmod(100 - canary_weight, len(stable)) if stable else (0, 0)
        upstreams = [
            upstream(m["name"], m.get("served_model_name") or m["name"], share + (rest if i == 0 else 0))
            for i, m in enumerate(stable)
        ]
        if canary is not None:
            entry = by_name.get(canary["name"], {})
            upstreams.append(
                upstream(canary["name"], entry.get("served_model_name") or served_name, canary_weight)
            )
        result[served_name] = {"upstreams": upstreams}
    return result


class FilterModule:
    """llm_gateway_upstreams, llm_gateway_rollout_state."""

    def filters(self) -> dict[str, Any]:
        return {"llm_gateway_upstreams": gateway_models, "llm_gateway_rollout_state": parse_rollout_state}
