"""monitoring's Secrets (the Alertmanager configuration, Grafana's admin password) are compared before
they are applied: read with the role's other objects in its one k8s_live_objects read, applied only where the
cluster does not hold them as rendered. Read back from a real API server they hold as rendered, and each
drift is found. Node-side (it runs the k8s_live_objects module): the 3.10 pass runs it, so nothing here
needs a controller-only test package (test_monitoring_workloads.py validates with kubernetes_validate)."""

from __future__ import annotations

import base64
import importlib.util
import json
import uuid
from typing import Any

import k8s_live_objects
import real_kube
import yaml
from conftest import run_module
from monitoring_render import ROOT, render_objects

TASKS = ROOT / "roles" / "monitoring" / "tasks"


def drift_filter() -> Any:
    spec = importlib.util.spec_from_file_location(
        "kubernetes_drift", ROOT / "plugins/filter/kubernetes_drift.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_secrets_are_read_with_the_other_objects_and_applied_only_where_they_differ() -> None:
    """apply-config.yml's one read takes the Secrets too, rendered from one role variable (never a fact),
    no_log; the apply sends only what k8s_not_as_rendered finds not held, no_log, none on a converged
    cluster."""
    (read,) = [t for t in yaml.safe_load((TASKS / "apply-config.yml").read_text()) if "k8s_live_objects" in t]
    (apply,) = yaml.safe_load((TASKS / "apply-secrets.yml").read_text())
    assert "__monitoring_secret_objects" in read["k8s_live_objects"]["objects"]
    assert read["no_log"] is True and apply["no_log"] is True
    role_vars = yaml.safe_load((TASKS.parent / "vars/main.yml").read_text())
    assert "secrets.yml.j2" in role_vars["__monitoring_secret_objects"]
    assert (
        "__monitoring_secret_objects" not in read["vars"]
        and "__monitoring_secret_objects" not in apply["vars"]
    )
    assert apply["kubernetes.core.k8s"]["definition"] == "{{ __monitoring_to_apply }}"
    assert apply["vars"]["__monitoring_to_apply"] == (
        "{{ __monitoring_secret_objects | k8s_not_as_rendered(__monitoring_live.resources) }}"
    )
    assert apply["when"] == "__monitoring_to_apply | length > 0"
    main = [t.get("ansible.builtin.import_tasks") for t in yaml.safe_load((TASKS / "main.yml").read_text())]
    assert main.index("apply-config.yml") < main.index("apply-secrets.yml")


def test_the_secrets_as_the_api_server_holds_them_need_no_apply_and_each_drift_is_found(
    kube_control_plane: real_kube.ControlPlane,
) -> None:
    """The Secrets as rendered (`data`, base64: what the API server returns; `stringData` would never hold)
    created in a real API server and read back by the role's module hold as rendered: a converged run applies
    nothing. Rendered again they are the same (no per-run content). A password edited in the cluster, a
    Secret deleted, a new receiver URL rendered: each is found."""
    drift = drift_filter()
    namespace = f"mon-{uuid.uuid4().hex[:8]}"
    secrets = render_objects("secrets.yml.j2", monitoring_namespace=namespace)
    assert [s["metadata"]["name"] for s in secrets] == ["alertmanager-config", "grafana-admin"]
    assert all("stringData" not in s and s["data"] for s in secrets)
    assert render_objects("secrets.yml.j2", monitoring_namespace=namespace) == secrets

    def read() -> list[dict[str, Any]]:
        failed, result = run_module(
            k8s_live_objects, {"objects": secrets, "kubeconfig": str(kube_control_plane.admin_kubeconfig)}
        )
        assert not failed, result
        return list(result["resources"])

    assert kube_control_plane.kubectl("create", "namespace", namespace).returncode == 0
    try:
        created = kube_control_plane.kubectl(
            "create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": secrets})
        )
        assert created.returncode == 0, created.stderr
        assert drift.k8s_not_as_rendered(secrets, read()) == []
        other_url = render_objects(
            "secrets.yml.j2",
            monitoring_namespace=namespace,
            monitoring_alert_webhook_url="https://b.example.org/h",
        )
        assert [s["metadata"]["name"] for s in drift.k8s_not_as_rendered(other_url, read())] == [
            "alertmanager-config"
        ]

        patch = json.dumps({"data": {"admin-password": base64.b64encode(b"edited-in-the-cluster").decode()}})
        edited = kube_control_plane.kubectl("-n", namespace, "patch", "secret", "grafana-admin", "-p", patch)
        assert edited.returncode == 0, edited.stderr
        assert [s["metadata"]["name"] for s in drift.k8s_not_as_rendered(secrets, read())] == [
            "grafana-admin"
        ]
        deleted = kube_control_plane.kubectl("-n", namespace, "delete", "secret", "alertmanager-config")
        assert deleted.returncode == 0, deleted.stderr
        assert [s["metadata"]["name"] for s in drift.k8s_not_as_rendered(secrets, read())] == [
            "alertmanager-config",
            "grafana-admin",
        ]
    finally:
        kube_control_plane.kubectl("delete", "namespace", namespace, "--wait=false")
