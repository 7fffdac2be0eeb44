"""Render the monitoring role's templates as Ansible does, for the unit tests: the role's defaults and vars,
`lookup('ansible.builtin.file'|'ansible.builtin.template', ...)` from its files/ and templates/ (trailing
whitespace stripped, as the file lookup does), the values it loads from other roles (LOADED), and the filters
the templates use (to_json, hash, b64encode, urlsplit, regex_replace, regex_escape). The dcgm-exporter
objects go through the role's own filter plugin."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

import jinja2
import yaml
from lab.upstream_manifests import manifest as upstream_manifest

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "monitoring"
DIGEST = "sha256:" + "ab" * 32


def _defaults(role: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())


# values the role loads from their one home, other roles' defaults (tasks/main.yml, include_role public)
LOADED = {
    "nvidia_device_plugin_node_label": _defaults("nvidia_device_plugin")["nvidia_device_plugin_node_label"],
    "nvidia_device_plugin_runtime_class": _defaults("nvidia_device_plugin")[
        "nvidia_device_plugin_runtime_class"
    ],
    "gpu_health_agent_metrics_port": _defaults("gpu_health_agent")["gpu_health_agent_metrics_port"],
    "control_plane_metrics_port": _defaults("control_plane_metrics")["control_plane_metrics_port"],
}
# values a site sets (the defaults leave them empty, which the role refuses)
SITE = {
    "monitoring_alert_webhook_url": "https://alerts.example.org/hook?token=s3cr3t-t0ken",
    "monitoring_grafana_admin_password": "correct-horse-battery",
    "monitoring_prometheus_image_digest": DIGEST,
    "monitoring_alertmanager_image_digest": DIGEST,
    "monitoring_grafana_image_digest": DIGEST,
    "monitoring_dcgm_exporter_image_digest": DIGEST,
    # read from the cluster by the role (the kubernetes Service's EndpointSlice) before the policy is rendered
    "__monitoring_api_server_port": 6443,
    # read from the cluster by the role (the Nodes' InternalIP) before the policy is rendered
    "__monitoring_node_addresses": ["10.89.42.11", "10.89.42.12", "10.89.42.13"],
    # and the control-plane Nodes' InternalIP (the control plane's metrics exporter listens there)
    "__monitoring_control_plane_addresses": ["10.89.42.11"],
}


def _urlsplit(url: str) -> dict[str, Any]:
    parts = urllib.parse.urlsplit(url)
    return {
        "scheme": parts.scheme,
        "hostname": parts.hostname,
        "port": parts.port,
        "path": parts.path,
        "query": parts.query,
    }


def _hash(value: str, kind: str = "sha1") -> str:
    return hashlib.new(kind, value.encode()).hexdigest()


def role_vars(**overrides: Any) -> dict[str, Any]:
    variables = {
        **yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()),
        **yaml.safe_load((ROLE / "vars" / "main.yml").read_text()),
        **LOADED,
        **overrides,
    }
    variables["ansible_managed"] = "Ansible managed"
    return variables


def render(template: str, **overrides: Any) -> str:
    variables = role_vars(**overrides)
    # trim_blocks as Ansible's template lookup renders
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
    env.filters["to_json"] = json.dumps
    env.filters["hash"] = _hash
    env.filters["b64encode"] = lambda s: base64.b64encode(s.encode()).decode()
    env.filters["ansible.builtin.urlsplit"] = _urlsplit
    env.filters["regex_replace"] = lambda value, pattern, replacement: re.sub(pattern, replacement, value)
    env.filters["regex_escape"] = re.escape

    def lookup(kind: str, path: str) -> str:
        if kind == "ansible.builtin.file":
            return (ROLE / "files" / path).read_text().rstrip()
        assert kind == "ansible.builtin.template", kind
        return env.from_string((ROLE / "templates" / path).read_text()).render(**variables, lookup=lookup)

    return lookup("ansible.builtin.template", template)


def render_objects(template: str, **overrides: Any) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(render(template, **{**SITE, **overrides})) if doc]


def _filter_plugin() -> Any:
    spec = importlib.util.spec_from_file_location(
        "dcgm_exporter_manifest", ROLE / "filter_plugins" / "dcgm_exporter_manifest.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dcgm_exporter_objects(**overrides: Any) -> list[dict[str, Any]]:
    """The upstream manifest (lab/upstream_manifests.py: the bytes the role downloads) through the role's
    filter, with the GPU node label and RuntimeClass of nvidia_device_plugin's defaults (LOADED)."""
    variables = role_vars(**{**SITE, **overrides})
    manifest = upstream_manifest(
        f"dcgm-exporter/{variables['monitoring_dcgm_exporter_version']}/dcgm-exporter.yaml"
    )
    counters = (ROLE / "files" / "dcgm-exporter" / "counters.csv").read_text().rstrip()
    return _filter_plugin().dcgm_exporter_manifest(
        list(yaml.safe_load_all(manifest.read_text())),
        variables["monitoring_namespace"],
        variables["monitoring_dcgm_exporter_image_digest"],
        variables["nvidia_device_plugin_node_label"],
        variables["nvidia_device_plugin_runtime_class"],
        "dcgm-exporter-counters",
        _hash(counters, "sha256"),
    )


def all_objects(**overrides: Any) -> list[dict[str, Any]]:
    """Every object the role applies, in the order it applies them (less the Namespace)."""
    objects: list[dict[str, Any]] = []
    for template in (
        "configmaps.yml.j2",
        "secrets.yml.j2",
        "prometheus-workload.yml.j2",
        "alertmanager-workload.yml.j2",
        "grafana-workload.yml.j2",
        "network-policy.yml.j2",
    ):
        objects += render_objects(template, **overrides)
    return objects + dcgm_exporter_objects(**overrides)


PANELS_BEGIN = (
    "<!-- dashboard panels: generated by `.venv/bin/python tests/unit/monitoring_render.py panels` -->"
)
PANELS_END = "<!-- end of dashboard panels -->"


def panel_list_markdown() -> str:
    """The dashboards' panels as docs/serving.md lists them: per dashboard its title and file, per panel its
    title, what it tells (the panel's description) and its PromQL, in the files' order."""
    lines = [PANELS_BEGIN]
    for name in role_vars()["monitoring_grafana_dashboards"]:
        board = json.loads((ROLE / "files" / "grafana" / "dashboards" / f"{name}.json").read_text())
        lines += ["", f"**{board['title']}** (`{name}.json`): {board['description']}", ""]
        for panel in board["panels"]:
            lines.append(f"- *{panel['title']}*: {panel['description']}")
            lines += [f"  - `{target['expr']}`" for target in panel.get("targets", [])]
    return "\n".join([*lines, "", PANELS_END])


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["panels"]:
        raise SystemExit(
            "usage: monitoring_render.py panels  (prints docs/serving.md's list of dashboard panels)"
        )
    print(panel_list_markdown())
