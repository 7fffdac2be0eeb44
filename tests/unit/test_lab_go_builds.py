"""tests/lab/labctl.py: `labctl up` fills the Go cache with every component before the mirror, whose
packages (kept in the lab's state, rebuilt only when their inputs change) carry some of those binaries: a
cache emptied under a current mirror left containerd, runc, cri-tools and the CNI plugins unbuilt, and
test_real_kubernetes_on_lab.py failed on them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

import labctl


def test_up_builds_every_component_before_the_mirror(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(labctl, "go_build", lambda name: calls.append(name) or Path("/cache") / name)
    monkeypatch.setattr(labctl, "ensure_mirror_content", lambda: calls.append("mirror content"))
    monkeypatch.setattr(labctl, "ensure_registry_pki", lambda: None)
    monkeypatch.setattr(labctl, "ensure_container", lambda *_: calls.append("mirror container") or False)
    monkeypatch.setattr(labctl, "wait_for_registry", lambda: None)

    labctl.ensure_mirror()

    every = [component.name for component in labctl.images.gobuild.COMPONENTS]
    assert {"containerd", "runc", "cri-tools", "cni-plugins", "kubernetes"} <= set(every)
    assert calls[: len(every)] == every
    assert calls.index("mirror content") == len(every)
