#!/usr/bin/env python3
"""Where a playbook run's time goes: a profile_tasks log grouped by stage, role and kind of task.

    ansible-playbook -i inventories/lab/hosts.yml playbooks/site.yml > run.log   # ansible.cfg enables it
    .venv/bin/python scripts/profile-tasks.py run.log                  # the tables (Markdown)
    .venv/bin/python scripts/profile-tasks.py run.log --top 30 --repeated 20

profile_tasks prints, under each TASK (or RUNNING HANDLER) header, a line whose parenthesised duration is the
*previous* task's (its wall time, all hosts together: the linear strategy runs a task on every host before the
next); the TASKS RECAP line carries the last one's. A task's kind comes from the repository's own task files
(roles/*/tasks, roles/*/handlers, playbooks/): its module, and whether it waits (until/retries, wait_for,
kubernetes.core.k8s wait). Kinds:

  facts       fact gathering
  arg specs   Ansible's own argument-spec check of a role it enters ("Validating arguments against arg spec")
  controller  assert, fail, set_fact, debug, group_by, meta, include_vars: no SSH round trip
  include     include_role, include_tasks (controller, but each one loads and templates a file per host)
  file        stat, find, file, copy, template, lineinfile, slurp, get_url, ...: one module call per file
  package     apt, dpkg_selections, apt_repository, package_facts, pip, ...
  service     systemd_service, service, service_facts
  command     command, shell, script
  kernel      modprobe, sysctl
  api         kubernetes.core.k8s / k8s_info, uri: requests to the Kubernetes API (or another HTTP API)
  gpu module  the project's own modules (library/): NVML, model manifests, the breaker
  wait        any task that polls (until/retries, wait_for, a k8s wait)
  other       anything else

A task whose name the repository does not have (a name changed since the log was taken) is "unknown".

Module runs: the results of tasks that run a module on a host (every kind but controller, include and arg
specs), one per host and loop item that was not skipped. On the lab each costs about 0.4 s of a core on the
node (docs/benchmarks.md, "The no-op site run's floor"), so with the task headers they set a run's floor.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

HEADER = re.compile(r"^(TASK|RUNNING HANDLER) \[(?P<name>.*)\] \**\s*$")
PLAY = re.compile(r"^PLAY \[(?P<name>.*)\] \**\s*$")
RECAP = re.compile(r"^(PLAY RECAP|TASKS RECAP) \**\s*$")
# "Tuesday 01 December 2026  18:35:13 +0000 (0:00:00.092)       0:00:03.408 ******"
CLOCK = re.compile(r"\((?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d(?:\.\d+)?)\)\s+\d+:\d\d:\d\d(?:\.\d+)?\s+\**\s*$")
RESULT = re.compile(r"^(?P<status>ok|changed|skipping|included|fatal|failed): \[(?P<host>[^\]]+)\]")
INCLUDED = re.compile(r"^included: .* for (?P<hosts>.*?)(?: => \(item=.*\))?$")
ARG_SPEC = re.compile(r"^Validating arguments against arg spec ")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Task keywords: everything else at a task's top level is its module.
KEYWORDS = _words(
    """name action args async become become_exe become_flags become_method become_user changed_when
    check_mode collections connection debugger delay delegate_facts delegate_to diff environment failed_when
    ignore_errors ignore_unreachable local_action loop loop_control module_defaults no_log notify poll port
    register remote_user retries run_once tags throttle timeout until vars when with_items with_dict with_list
    with_fileglob with_subelements with_nested with_together with_sequence with_first_found with_indexed_items
    listen block rescue always any_errors_fatal"""
)

KINDS = {
    "controller": _words("assert fail set_fact debug group_by meta include_vars add_host pause value_checks"),
    "include": _words("include_role include_tasks import_role import_tasks"),
    "file": _words(
        """stat find file copy template lineinfile blockinfile slurp get_url unarchive replace ini_file
        assemble tempfile fetch synchronize authorized_key known_hosts hostname mount user group
        files_in_place"""
    ),
    "package": _words(
        "apt apt_key apt_repository deb822_repository dpkg_selections package_facts pip package debconf"
        " packages_in_place"
    ),
    "service": _words("systemd_service systemd service service_facts"),
    "command": _words("command shell script raw"),
    "kernel": _words("modprobe sysctl kernel_blacklist"),
    "api": _words("k8s k8s_info k8s_exec k8s_drain uri k8s_live_objects"),
    "wait": _words("wait_for wait_for_connection"),
    "facts": _words("setup gather_facts"),
}
KIND_ORDER = [
    "facts", "arg specs", "controller", "include", "file", "package", "service", "command", "kernel", "api",
    "gpu module", "wait", "other", "unknown",
]  # fmt: skip
# kinds whose tasks run no module on a host: everything else runs one per host and loop item it does not skip
CONTROLLER_KINDS = frozenset({"arg specs", "controller", "include"})
# the results of a module run (a skipped host or item ran nothing)
RAN = frozenset({"ok", "changed", "failed", "fatal"})


@dataclasses.dataclass
class SourceTask:
    module: str
    waits: bool
    path: str


@dataclasses.dataclass
class Task:
    play: str
    name: str
    role: str
    title: str
    seconds: float = 0.0
    hosts: set[str] = dataclasses.field(default_factory=set)
    items: int = 0
    # results of a module run: one per host, or per host and loop item (a copy or template makes two calls)
    runs: int = 0
    kind: str = "unknown"
    module: str = ""
    path: str = ""


def _short(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def _template_regex(name: str) -> re.Pattern[str]:
    """A task name as written (with Jinja) as a regex over the name Ansible prints."""
    parts = re.split(r"\{\{.*?\}\}", name)
    return re.compile("^" + ".*?".join(re.escape(part) for part in parts) + "$", re.S)


def _walk(tasks, path: str):
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for section in ("block", "rescue", "always"):
            if section in task:
                yield from _walk(task[section], path)
        if "block" in task or "name" not in task:
            continue
        modules = [key for key in task if key not in KEYWORDS]
        module = modules[0] if modules else str(task.get("action", "")).split()[0:1] or ["?"]
        module = module if isinstance(module, str) else module[0]
        waits = "until" in task or (
            isinstance(task.get(module), dict) and task[module].get("wait") not in (None, False)
        )
        yield task["name"], SourceTask(module=module, waits=waits, path=path)


def source_index(root: Path = ROOT) -> dict[str, list[tuple[re.Pattern[str], SourceTask]]]:
    """Every named task of the repository, by role ('' for playbooks' own tasks)."""
    index: dict[str, list[tuple[re.Pattern[str], SourceTask]]] = collections.defaultdict(list)
    roles = sorted(root.glob("roles/*/tasks/**/*.yml")) + sorted(root.glob("roles/*/handlers/*.yml"))
    files = [(p.relative_to(root / "roles").parts[0], p) for p in roles]
    files += [("", p) for p in sorted(root.glob("playbooks/**/*.yml"))]
    for role, path in files:
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue
        if not isinstance(data, list):
            continue
        rel = str(path.relative_to(root))
        if role:
            entries = _walk(data, rel)
        else:  # a playbook: its plays' tasks
            entries = (
                entry
                for play in data
                if isinstance(play, dict)
                for section in ("pre_tasks", "tasks", "post_tasks", "handlers")
                for entry in _walk(play.get(section), rel)
            )
            # a task file under playbooks/ (playbooks/tasks, remediate/tasks): a list of tasks, not plays
            tasks = [
                t for t in data if isinstance(t, dict) and "hosts" not in t and "import_playbook" not in t
            ]
            entries = [*entries, *_walk(tasks, rel)]
        for name, source in entries:
            if _short(source.module) in ("import_tasks", "import_role", "import_playbook"):
                continue  # static: Ansible prints the imported tasks, never the import
            index[role].append((_template_regex(str(name)), source))
    return index


def classify(title: str, role: str, name: str, index) -> tuple[str, str, str]:
    """(kind, module, source path) of a task as the log names it."""
    if title == "Gathering Facts":
        return "facts", "gather_facts", ""
    if ARG_SPEC.match(name):
        return "arg specs", "validate_argument_spec", f"roles/{role}/meta/argument_specs.yml"
    # include_role's own task prints without its role: look in the playbooks, then in every role
    candidates = index.get(role, []) if role else [e for r in ("", *sorted(index)) for e in index.get(r, [])]
    for pattern, source in candidates:
        if pattern.match(name):
            module = _short(source.module)
            if source.waits or module in KINDS["wait"]:
                return "wait", module, source.path
            for kind, modules in KINDS.items():
                if module in modules:
                    return kind, module, source.path
            if (ROOT / "library" / f"{module}.py").exists():  # the project's other modules read the GPUs
                return "gpu module", module, source.path
            return "other", module, source.path
    return "unknown", "", ""


def parse(lines, index=None) -> list[Task]:
    """The tasks of a profile_tasks log, each with its duration, hosts, items and kind."""
    index = source_index() if index is None else index
    tasks: list[Task] = []
    play = ""
    current: Task | None = None
    # the task whose duration the next clock line carries (the one before the header just read)
    clock_target: Task | None = None
    awaiting_clock = False
    for line in lines:
        line = line.rstrip("\n")
        if match := PLAY.match(line):
            play = match["name"]
            continue
        header = HEADER.match(line)
        if header or RECAP.match(line):
            if not awaiting_clock:
                clock_target = tasks[-1] if tasks else None
            awaiting_clock = True
            current = None
            if header:
                title = header["name"]
                role, _, name = title.partition(" : ") if " : " in title else ("", "", title)
                current = Task(play=play, name=name, role=role, title=title)
                current.kind, current.module, current.path = classify(title, role, name, index)
                tasks.append(current)
            continue
        if awaiting_clock and (clock := CLOCK.search(line)):
            awaiting_clock = False
            if clock_target is not None:
                clock_target.seconds = int(clock["h"]) * 3600 + int(clock["m"]) * 60 + float(clock["s"])
            continue
        if current is None:
            continue
        if hosts := INCLUDED.match(line):
            current.hosts.update(h.strip() for h in hosts["hosts"].split(","))
        elif match := RESULT.match(line):
            # "gpu-node-2 -> gpu-node-1(127.0.0.1)": delegated, counted for the host it ran for
            current.hosts.add(match["host"].split(" -> ")[0])
            if "(item=" in line:
                current.items += 1
            if match["status"] in RAN and current.kind not in CONTROLLER_KINDS:
                current.runs += 1
    return tasks


def _table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(out)


def _share(seconds: float, total: float) -> str:
    return f"{100 * seconds / total:.1f} %" if total else "-"


def report(tasks: list[Task], top: int = 20, repeated: int = 15) -> str:
    total = sum(t.seconds for t in tasks)
    host_runs = collections.Counter(h for t in tasks for h in t.hosts)
    out = [
        f"{len(tasks)} task headers, {total:.1f} s of task time; task executions per host: "
        + ", ".join(f"{host} {n}" for host, n in sorted(host_runs.items()))
        + f"; module runs on the hosts: {sum(t.runs for t in tasks)} (one per host and loop item; a copy or "
        "template of a file in place is two module calls)",
        "",
    ]

    def grouped(key):
        groups: dict[str, list[Task]] = collections.defaultdict(list)
        for task in tasks:
            groups[key(task)].append(task)
        return sorted(groups.items(), key=lambda kv: -sum(t.seconds for t in kv[1]))

    def kind_mix(group: list[Task]) -> str:
        by_kind = collections.Counter()
        for task in group:
            by_kind[task.kind] += task.seconds
        return ", ".join(f"{kind} {sec:.0f}" for kind, sec in by_kind.most_common(3) if sec >= 0.5)

    rows = []
    for play, group in grouped(lambda t: t.play):
        seconds = sum(t.seconds for t in group)
        rows.append([play, len(group), f"{seconds:.1f}", _share(seconds, total)])
    out += ["### By play", "", _table(["play", "tasks", "seconds", "share"], rows), ""]

    rows = []
    for role, group in grouped(lambda t: t.role or "(play's own tasks)"):
        seconds = sum(t.seconds for t in group)
        checks = sum(t.seconds for t in group if _is_validation(t))
        rows.append(
            [role, len(group), f"{seconds:.1f}", _share(seconds, total), f"{checks:.1f}", kind_mix(group)]
        )
    headers = ["role", "tasks", "seconds", "share", "of it validation (s)", "largest kinds (s)"]
    out += ["### By role", "", _table(headers, rows), ""]

    rows = []
    groups = dict(grouped(lambda t: t.kind))
    for kind in [k for k in KIND_ORDER if k in groups]:
        group = groups[kind]
        seconds = sum(t.seconds for t in group)
        per = seconds / len(group)
        runs = sum(t.runs for t in group)
        rows.append([kind, len(group), f"{seconds:.1f}", _share(seconds, total), f"{per:.2f}", runs])
    out += [
        "### By kind",
        "",
        _table(["kind", "tasks", "seconds", "share", "s per task", "module runs"], rows),
        "",
    ]

    validation = [t for t in tasks if _is_validation(t)]
    seconds = sum(t.seconds for t in validation)
    out += [
        f"Validation (arg specs, tasks/validate.yml, the plays that include them): "
        f"{len(validation)} tasks, {seconds:.1f} s ({_share(seconds, total)}).",
        "",
    ]

    rows = []
    counts: dict[str, list[Task]] = collections.defaultdict(list)
    for task in tasks:
        counts[task.title].append(task)
    repeats = sorted(
        ((title, group) for title, group in counts.items() if len(group) > 1),
        key=lambda kv: -sum(t.seconds for t in kv[1]),
    )
    for title, group in repeats[:repeated]:
        seconds = sum(t.seconds for t in group)
        rows.append([_cell(title), len(group), f"{seconds:.1f}", group[0].kind])
    out += ["### Run more than once (same name)", "", _table(["task", "times", "seconds", "kind"], rows), ""]

    rows = [
        [_cell(t.title), t.kind, t.module, len(t.hosts), t.items or "", f"{t.seconds:.2f}"]
        for t in sorted(tasks, key=lambda t: -t.seconds)[:top]
    ]
    out += ["### Slowest tasks", "", _table(["task", "kind", "module", "hosts", "items", "seconds"], rows)]
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _is_validation(task: Task) -> bool:
    return (
        task.kind == "arg specs"
        or task.role == "check_argument_types"  # logs of runs before value_checks took the type checks
        or task.path.endswith("/validate.yml")
        or "Check the types of the" in task.name
        or task.name.startswith("Validate ")
        or task.name.startswith("Record the roles validated")
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="the output of ansible-playbook with profile_tasks")
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest tasks to list")
    parser.add_argument("--repeated", type=int, default=15, help="how many repeated tasks to list")
    args = parser.parse_args(argv)
    tasks = parse(args.log.read_text(errors="replace").splitlines())
    if not tasks:
        print(f"{args.log}: no profile_tasks task headers found", file=sys.stderr)
        return 1
    sys.stdout.write(report(tasks, top=args.top, repeated=args.repeated))
    return 0


if __name__ == "__main__":
    sys.exit(main())
