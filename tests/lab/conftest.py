"""Lab tests: in `make test` (LAB_TESTS_REQUIRED=1) a lab test that skips is a failure,
so a broken lab can never pass CI by skipping."""

from __future__ import annotations

import os

import labrun
import pytest

_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # an expected failure (xfail, a known defect named in its reason) is reported as skipped: not a skip
    if report.skipped and "lab" in report.keywords and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)


_ran_lab_tests: list[str] = []


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _ran_lab_tests.append(nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("LAB_TESTS_REQUIRED") == "1" and _skipped:
        print(f"\nLAB_TESTS_REQUIRED=1 and {len(_skipped)} lab test(s) skipped: " + ", ".join(_skipped))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if os.environ.get("LAB_TESTS_REQUIRED") == "1" and _ran_lab_tests:
        # the next user of the lab starts from a cluster whose every node takes work: a test that made
        # the GPU health agent (or anything else) cordon a node must have taken the cordon back
        cordoned = labrun.cordoned_nodes()
        if cordoned:
            print(f"\nlab: after the tests these nodes are still cordoned: {cordoned}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        else:
            print("\nlab: after the tests every node is schedulable")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """test_site_on_lab.py first: it repairs and converges the nodes every other lab test uses."""
    items.sort(key=lambda item: 0 if item.path.name == "test_site_on_lab.py" else 1)
