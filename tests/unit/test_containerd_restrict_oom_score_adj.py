"""containerd_restrict_oom_score_adj (role containerd): containerd's CRI option that keeps every container's
oom_score_adj at or above containerd's own, for a containerd without CAP_SYS_RESOURCE (issue 17).

containerd 2.x: RuntimeConfig.RestrictOOMScoreAdj, toml key `restrict_oom_score_adj`, in the CRI runtime
plugin's table (internal/cri/config/config.go), i.e. plugins.'io.containerd.cri.v1.runtime' of a version-3
config.toml. Off by default: real servers run containerd as root with every capability.
"""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
import yaml
from role_render import ROOT, RoleVars


def containerd(**overrides: Any) -> RoleVars:
    kubernetes = yaml.safe_load((ROOT / "roles/kubernetes/defaults/main.yml").read_text())
    kubernetes |= yaml.safe_load((ROOT / "roles/kubernetes/vars/main.yml").read_text())
    return RoleVars("containerd", **kubernetes, **overrides)


@pytest.mark.parametrize("restrict", [False, True])
def test_it_is_the_cri_runtime_plugins_option(restrict: bool) -> None:
    config = containerd(containerd_restrict_oom_score_adj=restrict).render_template("config.toml.j2")
    runtime = tomllib.loads(config)["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is restrict
    # beside the runtime settings the role already makes, not instead of them
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True


def test_it_defaults_to_off() -> None:
    assert containerd()["containerd_restrict_oom_score_adj"] is False
