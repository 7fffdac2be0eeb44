"""The alert rules: `promtool check rules`, `promtool test rules` with a firing and a silent case for every
alert (tests/unit/monitoring/alert-rules.test.yml), and the proof that those cases matter: an alert whose
expression can never fire makes its test fail. Every dashboard expression parses as PromQL (as a recording
rule that promtool checks). promtool is Debian's `prometheus` package (scripts/ensure-host-deps.sh)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from monitoring_promql import RULES, as_promql, dashboard_exprs, rule_exprs

PROMTOOL = shutil.which("promtool")
RULE_TESTS = Path(__file__).parent / "monitoring" / "alert-rules.test.yml"
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: apt-get install prometheus")


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, check=False, timeout=60)


def test_rules_are_valid() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(list(rule_exprs()))} rules found" in result.stdout


def test_every_alert_fires_on_bad_series_and_stays_silent_on_good_ones() -> None:
    result = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_case_where_it_fires() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {
        check["alertname"]
        for case in cases
        for check in case.get("alert_rule_test", [])
        if check["exp_alerts"]
    }
    assert firing == {name for name, _ in rule_exprs()}


@pytest.mark.parametrize("alert", [name for name, _ in rule_exprs()])
def test_an_alert_that_cannot_fire_fails_its_test(alert: str, tmp_path: Path) -> None:
    """Mutation: the alert's expression replaced by one that is never true; promtool test must fail."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = "vector(1) == 0"
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "alert-rules.yml").write_text(yaml.safe_dump(rules))
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tests["rule_files"] = ["rules/alert-rules.yml"]
    (tmp_path / "t.yml").write_text(yaml.safe_dump(tests))
    result = promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert f"alertname: {alert}," in result.stdout + result.stderr


def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    exprs = list(dashboard_exprs())
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [
                    {"record": f"dashboard:expr_{i}", "expr": as_promql(e)} for i, (_, e) in enumerate(exprs)
                ],
            }
        ]
    }
    (tmp_path / "dashboards.yml").write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", str(tmp_path / "dashboards.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_a_broken_expression_is_refused(tmp_path: Path) -> None:
    broken = {"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (le (rate(x[5m]))"}]}]}
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(broken))
    assert promtool("check", "rules", str(tmp_path / "broken.yml")).returncode != 0
