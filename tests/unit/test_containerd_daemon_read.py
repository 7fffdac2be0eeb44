"""Role containerd reads what the daemon parses, the plugins it loaded and when it started with one
command (__containerd_daemon_read_argv, issue 19: one module run instead of three on a converged node).
It is run here as the node runs it, with stand-in containerd, ctr and systemctl on PATH, and its output
goes through verify-containerd.yml's own checks (the task's vars and loop, templated by Ansible): a
converged daemon passes every check, and each drift the three reads found before (a CRI plugin not
loaded, a configuration file newer than the daemon, a setting containerd does not parse) still fails its
check. A failing read fails the command.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.plugins.loader import filter_loader
from role_render import ROOT, RoleVars, _load_plugins

TASKS = ROOT / "roles/containerd/tasks"

DUMP = """\
version = 4
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{sandbox}'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '/etc/containerd/certs.d'
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
      runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = {systemd_cgroup}
  [plugins.'io.containerd.server.v1.grpc']
    address = '/run/containerd/containerd.sock'
"""
PLUGINS = """\
TYPE                                      ID                       PLATFORMS      STATUS
io.containerd.content.v1                  content                  -              ok
io.containerd.cri.v1                      images                   -              ok
io.containerd.cri.v1                      runtime                  linux/amd64    {runtime}
io.containerd.grpc.v1                     cri                      -              ok
"""


def containerd(**overrides: Any) -> RoleVars:
    _load_plugins()
    # from_toml, as the role has it
    filter_loader.add_directory(str(ROOT / "roles/containerd/filter_plugins"))
    kubernetes = yaml.safe_load((ROOT / "roles/kubernetes/defaults/main.yml").read_text())
    kubernetes |= yaml.safe_load((ROOT / "roles/kubernetes/vars/main.yml").read_text())
    return RoleVars("containerd", **kubernetes, **overrides)


def task(path: str, name: str) -> dict[str, Any]:
    (found,) = [t for t in yaml.safe_load((TASKS / path).read_text()) if t["name"].startswith(name)]
    return found


def stand_in(bin_dir: Path, name: str, output: str, rc: int = 0) -> None:
    (bin_dir / f"{name}.out").write_text(output)
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\ncat '{bin_dir / name}.out'\nexit {rc}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def read(tmp_path: Path, *, systemd_cgroup: str = "true", runtime: str = "ok", started: int = 2000,
         ctr_rc: int = 0) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """__containerd_daemon_read_argv run as the command module runs it, with stand-ins on PATH."""
    sandbox = containerd()["containerd_sandbox_image"]
    stand_in(tmp_path, "containerd", DUMP.format(sandbox=sandbox, systemd_cgroup=systemd_cgroup))
    stand_in(tmp_path, "ctr", PLUGINS.format(runtime=runtime), ctr_rc)
    stand_in(tmp_path, "systemctl", f"ExecMainStartTimestamp=@{started}\n")
    argv = containerd()["__containerd_daemon_read_argv"]
    env = os.environ | {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    # the command module strips the output's trailing newline
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.rstrip("\n"), done.stderr)


def checks(stdout: str, *, from_nvidia_read: bool = False, newest_config: float = 1000.0) -> dict[str, bool]:
    """verify-containerd.yml's check loop over a read: setting -> ok, with the task's own vars."""
    check = task("verify-containerd.yml", "Check that containerd runs with the role's settings")
    result = {"stdout": stdout, "changed": False}
    registered = (
        {"__containerd_daemon": {"skipped": True}, "__containerd_daemon_current": result}
        if from_nvidia_read
        else {"__containerd_daemon": result}
    )
    role = containerd(
        **registered,
        __containerd_config_toml_read={"skipped": True},
        __containerd_files_state={"found": {"config": {"files": [{"mtime": newest_config}]}}},
        **check["vars"],
    )
    return {str(item["setting"]).strip(): bool(item["ok"]) for item in role.template(check["loop"])}


def test_a_converged_daemon_passes_every_check_read_by_verify_or_by_the_nvidia_runtime_task(
    tmp_path: Path,
) -> None:
    done = read(tmp_path)
    assert done.returncode == 0, done.stderr
    for from_nvidia_read in (False, True):
        verdicts = checks(done.stdout, from_nvidia_read=from_nvidia_read)
        assert len(verdicts) == 9 and all(verdicts.values()), verdicts


@pytest.mark.parametrize(
    ("drift", "failing"),
    [
        ({"runtime": "skip"}, "the CRI plugins loaded by the running daemon (ctr plugins ls)"),
        ({"started": 500}, "the current configuration files (daemon started after their last change)"),
        ({"systemd_cgroup": "false"}, "SystemdCgroup = true in"),
    ],
)
def test_each_drift_the_three_reads_found_fails_its_check(
    tmp_path: Path, drift: dict[str, Any], failing: str
) -> None:
    done = read(tmp_path, **drift)
    assert done.returncode == 0, done.stderr
    verdicts = checks(done.stdout)
    assert [s for s, ok in verdicts.items() if not ok] == [s for s in verdicts if s.startswith(failing)]


def test_a_failing_read_fails_the_command(tmp_path: Path) -> None:
    """sh -e: a daemon that does not answer ctr fails the task, as `ctr plugins ls` alone did."""
    assert read(tmp_path, ctr_rc=1).returncode != 0


def test_the_nvidia_runtime_task_reads_the_runtimes_from_the_dump(tmp_path: Path) -> None:
    ctk = task("add-nvidia-runtime.yml", "Configure the nvidia runtime with nvidia-ctk")
    done = read(tmp_path)
    without = done.stdout.replace("containerd.runtimes.nvidia]", "containerd.runtimes.other]")
    for stdout, runs in ((done.stdout, False), (without, True)):
        role = containerd(
            __containerd_pending=False,
            ansible_check_mode=False,
            __containerd_nvidia_repo={"changed": False},
            __containerd_daemon_before_nvidia={"stdout": stdout},
            **ctk["vars"],
        )
        assert role.when(ctk["when"]) is runs


def test_verify_reads_again_wherever_nvidia_ctk_ran_or_the_toolkit_is_off() -> None:
    """tasks/main.yml passes the nvidia runtime task's read only where nothing restarted containerd since."""
    main = task("main.yml", "Verify what containerd runs with")
    read_task = task("verify-containerd.yml", "Read the configuration containerd parses")
    before = {"stdout": "x", "changed": False}
    for toolkit, ctk, reads_again in (
        (True, {"skipped": True}, False),
        (True, {"changed": True}, True),
        (False, {"skipped": True}, True),
    ):
        role = containerd(
            containerd_nvidia_toolkit=toolkit,
            __containerd_daemon_before_nvidia=before,
            __containerd_nvidia_ctk=ctk,
            __containerd_pending=False,
        )
        scope = containerd(
            containerd_nvidia_toolkit=toolkit,
            __containerd_pending=False,
            __containerd_daemon_current=role.template(main["vars"]["__containerd_daemon_current"]),
        )
        assert scope.when(read_task["when"]) is reads_again
