"""Lab tests: in `make test` (LAB_TESTS_REQUIRED=1) a lab test that skips is a failure,
so a broken lab can never pass CI by skipping."""

from __future__ import annotations

import os

import pytest

_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "lab" in report.keywords:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("LAB_TESTS_REQUIRED") == "1" and _skipped:
        print(f"\nLAB_TESTS_REQUIRED=1 and {len(_skipped)} lab test(s) skipped: " + ", ".join(_skipped))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
