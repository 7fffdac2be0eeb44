"""scripts/profile-tasks.py: a profile_tasks log grouped by play, role and kind (docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "profile-tasks.py"


@pytest.fixture(scope="module")
def profile():
    spec = importlib.util.spec_from_file_location("profile_tasks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["profile_tasks"] = module
    spec.loader.exec_module(module)
    return module


# a task of roles/calico/tasks/apply-manifest.yml: the kind comes from the task file that names it
CALICO_APPLY = "calico : Apply the objects of calico.yaml the cluster does not hold as rendered"

# profile_tasks' own layout: the clock line under each header carries the previous task's duration.
LOG = """
PLAY [Baseline for every server of the cluster] ********************************

TASK [Gathering Facts] *********************************************************
Tuesday 01 December 2026  18:35:10 +0000 (0:00:00.026)       0:00:00.026 ******
ok: [gpu-node-1]
ok: [gpu-node-2]

TASK [common : Validating arguments against arg spec 'main' - Baseline for the cluster's servers] ***
Tuesday 01 December 2026  18:35:13 +0000 (0:00:03.289)       0:00:03.315 ******
ok: [gpu-node-1]
ok: [gpu-node-2]

TASK [Load the RuntimeClass name (nvidia_device_plugin)] ***********************
Tuesday 01 December 2026  18:35:13 +0000 (0:00:00.092)       0:00:03.408 ******
included: nvidia_device_plugin for gpu-node-1, gpu-node-2

TASK [unattended_upgrades_exclusion : Read the unattended-upgrades exclusion of nvidia-driver] ***
Tuesday 01 December 2026  18:35:14 +0000 (0:00:00.109)       0:00:03.606 ******
ok: [gpu-node-1]
ok: [gpu-node-2]

TASK [common : Read who Ansible logs in as, before sudo] ***********************
Tuesday 01 December 2026  18:35:14 +0000 (0:00:00.207)       0:00:03.813 ******
ok: [gpu-node-1] => (item=-un)
ok: [gpu-node-2] => (item=-un)
ok: [gpu-node-1] => (item=-Gn)
ok: [gpu-node-2] => (item=-Gn)

TASK [common : Install the base packages] **************************************
Tuesday 01 December 2026  18:35:15 +0000 (0:00:01.000)       0:00:04.813 ******
ok: [gpu-node-1]
ok: [gpu-node-2]

PLAY [Kubernetes pod network - Calico] *****************************************

TASK [calico : Apply the objects of calico.yaml the cluster does not hold as rendered] ***
Tuesday 01 December 2026  18:35:18 +0000 (0:00:02.850)       0:00:07.663 ******
ok: [gpu-node-1]

TASK [calico : Wait until calico-node runs Ready on every node] ****************
Tuesday 01 December 2026  18:35:47 +0000 (0:00:29.430)       0:00:37.093 ******
ok: [gpu-node-2 -> gpu-node-1(127.0.0.1)]

PLAY RECAP *********************************************************************
gpu-node-1                 : ok=7  changed=0    unreachable=0    failed=0    skipped=0    rescued=0

TASKS RECAP ********************************************************************
Tuesday 01 December 2026  18:35:48 +0000 (0:00:01.000)       0:00:38.093 ******
"""

# a name with Jinja in its task file
EXCLUSION_READ = "unattended_upgrades_exclusion : Read the unattended-upgrades exclusion of nvidia-driver"


def test_each_task_gets_the_duration_printed_under_the_next_header(profile):
    tasks = profile.parse(LOG.splitlines())
    assert [t.title for t in tasks][:2] == [
        "Gathering Facts",
        "common : Validating arguments against arg spec 'main' - Baseline for the cluster's servers",
    ]
    assert [t.seconds for t in tasks] == [3.289, 0.092, 0.109, 0.207, 1.0, 2.85, 29.43, 1.0]
    # the first clock line's figure is the start-up before the first task: nobody's
    assert sum(t.seconds for t in tasks) == pytest.approx(37.977)


def test_roles_plays_hosts_and_items(profile):
    tasks = {t.title: t for t in profile.parse(LOG.splitlines())}
    # one module call for every file of the role: no items
    types = tasks[EXCLUSION_READ]
    assert (types.role, types.play, types.items) == (
        "unattended_upgrades_exclusion",
        "Baseline for every server of the cluster",
        0,
    )
    assert types.hosts == {"gpu-node-1", "gpu-node-2"}
    # a loop's results count as items, each host's
    login = tasks["common : Read who Ansible logs in as, before sudo"]
    assert (login.role, login.items, login.hosts) == ("common", 4, {"gpu-node-1", "gpu-node-2"})
    # an include names its hosts on one line; a delegated result counts for the host it ran for
    assert tasks["Load the RuntimeClass name (nvidia_device_plugin)"].hosts == {"gpu-node-1", "gpu-node-2"}
    assert tasks["calico : Wait until calico-node runs Ready on every node"].hosts == {"gpu-node-2"}
    assert tasks[CALICO_APPLY].play == "Kubernetes pod network - Calico"


def test_an_include_in_a_loop_names_its_hosts_without_the_item(profile):
    log = LOG.replace(
        "included: nvidia_device_plugin for gpu-node-1, gpu-node-2",
        "included: nvidia_device_plugin for gpu-node-1, gpu-node-2 => (item=common)",
    )
    tasks = {t.title: t for t in profile.parse(log.splitlines())}
    assert tasks["Load the RuntimeClass name (nvidia_device_plugin)"].hosts == {"gpu-node-1", "gpu-node-2"}


def test_the_kind_comes_from_the_repository_task_files(profile):
    tasks = {t.title: t for t in profile.parse(LOG.splitlines())}
    kinds = {title: (t.kind, t.module) for title, t in tasks.items()}
    assert kinds["Gathering Facts"] == ("facts", "gather_facts")
    spec = "common : Validating arguments against arg spec 'main' - Baseline for the cluster's servers"
    assert kinds[spec][0] == "arg specs"
    # include_role prints no role: found among every role's tasks
    assert kinds["Load the RuntimeClass name (nvidia_device_plugin)"] == ("include", "include_role")
    # a name with Jinja in the task file ("... of {{ unattended_upgrades_exclusion_name }}")
    assert kinds[
        "unattended_upgrades_exclusion : Read the unattended-upgrades exclusion of nvidia-driver"
    ] == ("file", "files_in_place")
    assert kinds["common : Install the base packages"] == ("package", "apt")
    assert kinds["common : Read who Ansible logs in as, before sudo"] == ("command", "command")
    # until/retries makes a task a wait, whatever its module
    assert kinds["calico : Wait until calico-node runs Ready on every node"] == ("wait", "k8s_info")


def test_a_name_the_repository_no_longer_has_is_unknown(profile):
    log = LOG.replace("Install the base packages", "A task renamed since")
    tasks = {t.title: t for t in profile.parse(log.splitlines())}
    assert tasks["common : A task renamed since"].kind == "unknown"


def test_the_report_sums_by_role_and_kind_and_lists_repeats(profile):
    # the baseline play twice: its last task's duration is printed under the second copy's first header
    log = LOG + LOG.split("PLAY RECAP")[0].split("PLAY [Kubernetes")[0]
    text = profile.report(profile.parse(log.splitlines()), top=3, repeated=5)
    assert "### By role" in text and "### By kind" in text and "### By play" in text
    role_rows = {
        line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")
    }
    assert role_rows["calico"].split(" | ")[1:3] == ["2", "29.5"]
    # every task of the second copy ran twice: listed with its count
    assert "| common : Install the base packages | 2 |" in text


def test_the_command_line_prints_the_tables(profile, tmp_path, capsys):
    log = tmp_path / "run.log"
    log.write_text(LOG)
    assert profile.main([str(log), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "### Slowest tasks" in out
    assert f"{CALICO_APPLY} | api | k8s | 1 |" in out


def test_a_log_without_profile_tasks_is_refused(profile, tmp_path, capsys):
    log = tmp_path / "run.log"
    log.write_text("PLAY RECAP ****\n")
    assert profile.main([str(log)]) == 1
    assert "no profile_tasks task headers" in capsys.readouterr().err


def test_validation_counts_the_checks_and_the_record_of_what_a_stage_validated(profile):
    tasks = {t.title: t for t in profile.parse(LOG.splitlines())}
    validation = {title for title, t in tasks.items() if profile._is_validation(t)}
    assert validation == {
        "common : Validating arguments against arg spec 'main' - Baseline for the cluster's servers",
        "Load the RuntimeClass name (nvidia_device_plugin)",
        "common : Read who Ansible logs in as, before sudo",
    }
    record = "Record the roles validated here, which the stage's plays do not validate again"
    log = LOG.replace("Read who Ansible logs in as, before sudo", record).replace(
        "TASK [common : " + record, f"TASK [{record}"
    )
    tasks = {t.title: t for t in profile.parse(log.splitlines())}
    assert (tasks[record].kind, tasks[record].module) == ("controller", "set_fact")
    assert profile._is_validation(tasks[record])


def test_module_runs_count_each_host_and_item_that_ran_a_module(profile):
    """What a no-op run's floor is made of (docs/benchmarks.md, fourteenth session): a module call per host
    and loop item, none for the controller's own tasks or for a host or item that was skipped."""
    log = LOG.replace(
        "TASK [common : Install the base packages] **************************************\n"
        "Tuesday 01 December 2026  18:35:15 +0000 (0:00:01.000)       0:00:04.813 ******\n",
        "TASK [common : Install the base packages] **************************************\n"
        "Tuesday 01 December 2026  18:35:15 +0000 (0:00:01.000)       0:00:04.813 ******\n"
        "skipping: [gpu-node-3]\n",
    )
    tasks = {t.title: t for t in profile.parse(log.splitlines())}
    assert tasks["common : Install the base packages"].runs == 2
    assert tasks["common : Read who Ansible logs in as, before sudo"].runs == 4
    # a delegated result is a module run too, where it was delegated
    assert tasks["calico : Wait until calico-node runs Ready on every node"].runs == 1
    assert tasks[EXCLUSION_READ].runs == 2
    for controller_only in (
        "Load the RuntimeClass name (nvidia_device_plugin)",
        "common : Validating arguments against arg spec 'main' - Baseline for the cluster's servers",
    ):
        assert tasks[controller_only].runs == 0, controller_only
    text = profile.report(list(tasks.values()))
    # facts 2, the file read 2, the command loop 4, the packages 2, Calico's apply 1 and its wait 1
    assert "module runs on the hosts: 12 " in text.splitlines()[0]
    kind_rows = {line.split(" | ")[0].strip("| "): line for line in text.split("### By kind")[1].splitlines()}
    assert kind_rows["command"].endswith("| 4 |")
    assert kind_rows["file"].endswith("| 2 |")
    assert kind_rows["include"].endswith("| 0 |")
