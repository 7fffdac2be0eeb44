"""The monitoring role's templates render into configurations the real tools accept: Prometheus
(`promtool check config`, with the rule file), Alertmanager (`amtool check-config`, Debian's
prometheus-alertmanager), the ConfigMaps against the Kubernetes 1.36 schemas (kubernetes-validate, strict);
the role refuses a missing receiver before anything changes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from monitoring_promql import ROLE, RULES
from monitoring_render import SITE, render

K8S_VERSION = "1.36.0"
WEBHOOK = "https://alerts.example.org/hook"


def test_prometheus_config_is_accepted_with_its_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: apt-get install prometheus")
    config = yaml.safe_load(render("prometheus.yml.j2", monitoring_alert_webhook_url=WEBHOOK))
    assert config["rule_files"] == ["/etc/prometheus/rules/alert-rules.yml"]
    config["rule_files"] = [str(RULES)]  # where the ConfigMap mounts it in the pod, here
    assert [job["job_name"] for job in config["scrape_configs"]] == ["vllm", "llm-gateway", "dcgm-exporter"]
    for job in config["scrape_configs"]:
        # Debian builds Prometheus without Kubernetes discovery (its client-go is not packaged): promtool here
        # refuses kubernetes_sd_configs. The pinned upstream image has it; everything else is checked as is.
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 12 rules found" in result.stdout


def test_alertmanager_config_is_accepted(tmp_path: Path) -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool missing: apt-get install prometheus-alertmanager")
    text = render("alertmanager.yml.j2", monitoring_alert_webhook_url=WEBHOOK)
    (tmp_path / "alertmanager.yml").write_text(text)
    result = subprocess.run(
        [amtool, "check-config", str(tmp_path / "alertmanager.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    receivers = yaml.safe_load(text)["receivers"]
    assert receivers == [{"name": "on-call", "webhook_configs": [{"url": WEBHOOK, "send_resolved": True}]}]


def test_configmaps_validate_and_carry_every_file() -> None:
    docs = list(yaml.safe_load_all(render("configmaps.yml.j2", monitoring_alert_webhook_url=WEBHOOK)))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert doc["metadata"]["namespace"] == "monitoring"
    data = {doc["metadata"]["name"]: doc["data"] for doc in docs}
    # the Alertmanager configuration holds the receiver URL: a Secret (test_monitoring_workloads.py)
    assert set(data) == {
        "prometheus-config",
        "grafana-provisioning",
        "grafana-dashboards",
        "dcgm-exporter-counters",
    }
    assert data["prometheus-config"]["alert-rules.yml"] == RULES.read_text().rstrip()
    assert set(data["grafana-dashboards"]) == {"overview.json", "vllm-instance.json", "gpu-health.json"}
    for board in data["grafana-dashboards"].values():
        json.loads(board)
    datasource = yaml.safe_load(data["grafana-provisioning"]["datasource.yml"])["datasources"][0]
    assert datasource["uid"] == "prometheus" and datasource["url"] == "http://prometheus.monitoring.svc:9090"
    assert "DCGM_FI_DEV_ROW_REMAP_PENDING" in data["dcgm-exporter-counters"]["counters.csv"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("monitoring_alert_webhook_url", ""),
        ("monitoring_alert_webhook_url", "alerts.example.org"),
        ("monitoring_namespace", "Monitoring"),
        ("monitoring_scrape_interval", "30"),
        ("monitoring_prometheus_image_digest", ""),
        ("monitoring_alertmanager_image_digest", "sha256:abc"),
        ("monitoring_grafana_image_digest", ""),
        ("monitoring_dcgm_exporter_image_digest", ""),
        ("monitoring_grafana_image", "docker.io/grafana/grafana@sha256:" + "ab" * 32),
        ("monitoring_prometheus_retention", "15"),
        ("monitoring_prometheus_storage_gib", 1),
        ("monitoring_prometheus_storage_class", "Fast SSD"),
        ("monitoring_prometheus_resources", {"requests": {"cpu": "1", "memory": "1Gi"}}),
        ("monitoring_grafana_datasource_uid", "a uid"),
        ("monitoring_grafana_admin_password", ""),
        ("monitoring_dcgm_exporter_manifest_sha256", "abc"),
        ("monitoring_serving_namespace", "Serving"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(variable: str, value: Any, tmp_path: Path) -> None:
    ansible = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "ansible-playbook"
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {**SITE, variable: value},
            "tasks": [{"ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "validate"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    root = ROLE.parents[1]
    result = subprocess.run(
        [str(ansible), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        env={"ANSIBLE_ROLES_PATH": str(root / "roles"), "PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"},
    )
    assert result.returncode != 0
    assert variable in result.stdout
    assert SITE["monitoring_grafana_admin_password"] not in result.stdout  # never printed


GOOD_RESOURCES = {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        (
            "monitoring_prometheus_resources",
            {**GOOD_RESOURCES, "requests": {"cpu": "500m", "memory": "2GB"}},
            "monitoring_prometheus_resources.requests.memory: '2GB' is not a quantity",
        ),
        (
            "monitoring_grafana_resources",
            {**GOOD_RESOURCES, "limits": {"cpu": "1 core", "memory": "4Gi"}},
            "monitoring_grafana_resources.limits.cpu: '1 core' is not a quantity",
        ),
        (
            "monitoring_alertmanager_resources",
            {**GOOD_RESOURCES, "limits": {"cpu": "100m", "memory": "4Gi"}},
            "monitoring_alertmanager_resources.requests.cpu: must be less than or equal to the cpu limit",
        ),
        ("monitoring_prometheus_storage_class", "a..b", "monitoring_prometheus_storage_class: 'a..b' is not"),
        ("monitoring_namespace", "Monitoring", "monitoring_namespace: 'Monitoring' is not a DNS-1123 label"),
    ],
    ids=["memory-2GB", "cpu-1-core", "requests-above-limits", "storage-class", "namespace"],
)
def test_values_the_api_server_refuses_are_refused_first(
    variable: str, value: Any, says: str, tmp_path: Path
) -> None:
    """As the API server checks them (plugins/filter/kubernetes_values.py), before anything changes."""
    ansible = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "ansible-playbook"
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {**SITE, variable: value},
            "tasks": [{"ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "validate"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    root = ROLE.parents[1]
    result = subprocess.run(
        [str(ansible), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        env={"ANSIBLE_ROLES_PATH": str(root / "roles"), "PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"},
    )
    assert result.returncode != 0
    assert says in " ".join(result.stdout.split()), result.stdout[-2000:]


def test_good_values_pass_validation(tmp_path: Path) -> None:
    ansible = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "ansible-playbook"
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": SITE,
            "tasks": [{"ansible.builtin.include_role": {"name": "monitoring", "tasks_from": "validate"}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    root = ROLE.parents[1]
    result = subprocess.run(
        [str(ansible), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        env={"ANSIBLE_ROLES_PATH": str(root / "roles"), "PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
