"""docs/serving.md lists every dashboard panel (title, what it tells, PromQL) as the dashboard files have
them, and has a section for every alert of the rule file."""

from __future__ import annotations

import re

import yaml
from monitoring_promql import RULES
from monitoring_render import PANELS_BEGIN, PANELS_END, ROOT, panel_list_markdown

DOC = ROOT / "docs" / "serving.md"


def test_the_docs_panel_list_matches_the_dashboard_files() -> None:
    text = DOC.read_text()
    assert PANELS_BEGIN in text and PANELS_END in text, "docs/serving.md lost its generated panel list"
    listed = text[text.index(PANELS_BEGIN) : text.index(PANELS_END) + len(PANELS_END)]
    assert listed == panel_list_markdown(), (
        "docs/serving.md's panel list differs from the dashboard files; regenerate it with "
        "`.venv/bin/python tests/unit/monitoring_render.py panels` and paste it between the markers"
    )


def test_every_alert_has_its_section_in_the_docs() -> None:
    alerts = [
        rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]
    sections = re.findall(r"^#### (\S+)$", DOC.read_text(), flags=re.MULTILINE)
    assert (
        alerts and sorted(alerts) == sorted(set(sections) & set(alerts)) and len(set(alerts)) == len(alerts)
    )
    missing = [a for a in alerts if a not in sections]
    assert missing == [], f"alerts without a section in docs/serving.md: {missing}"


def test_every_alert_links_to_its_own_runbook_section() -> None:
    """The `runbook` annotation on-call follows from the alert: docs/runbook.md#<alert>, a heading there."""
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    headings = re.findall(r"^### (\S+)$", (ROOT / "docs" / "runbook.md").read_text(), flags=re.MULTILINE)
    anchors = {heading.lower() for heading in headings}
    for rule in rules:
        link = rule["annotations"]["runbook"]
        assert link == f"docs/runbook.md#{rule['alert'].lower()}", (rule["alert"], link)
        assert rule["alert"].lower() in anchors, f"docs/runbook.md has no section {rule['alert']}"
