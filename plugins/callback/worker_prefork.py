"""Work Ansible's forked workers would each do again, done once in the controller or not at all.

Ansible forks one worker process per host and task, a skipped task too: a no-op site run of this project forks
about 1,500. Each worker inherits the controller's memory, and two costs came back in every one of them
(perf and py-spy over a no-op run, docs/benchmarks.md, "twenty-third session"):

- **Garbage collection of the inherited heap.** When a worker allocates enough to trigger Python's cyclic
  collector, it walks every object it inherited (the playbooks, the inventory, every host's facts and
  results) and writes into each one's GC header: CPU spent on objects it will never free, and a copy of each
  page it touches. `gc.freeze()` in the child right after the fork moves what it inherited into the
  permanent generation, which the collector skips; the worker still collects its own garbage.
- **Loading the same plugins.** The connection, become and shell plugins, the template lookup, and the Jinja
  filters and tests (all the builtin and legacy ones load together, with the roles' filter_plugins; a
  collection's load all of that collection's filter files) were imported and their option definitions
  parsed in each worker, because the controller never needed them itself. Loaded in the controller before a
  task's workers fork, they are inherited, loaded.

Neither changes what a task does or returns.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable

from ansible import constants as C
from ansible.plugins import loader
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: worker_prefork
type: aggregate
short_description: Spare each forked worker collecting the inherited heap and loading the common plugins
description:
  - Ansible forks a worker process per host and task. Each inherits the controller's heap.
  - In every child, right after C(os.fork), C(gc.freeze) moves the inherited objects into the permanent
    generation, so the worker's garbage collection walks (and copies) only what the worker made itself.
  - Before each task's workers fork, it loads in the controller the plugins every worker would otherwise load
    on its own, so they are inherited loaded. These are the default connection plugin (and C(local)), the
    default become method, the C(sh) shell and the C(template) lookup. Also the builtin and legacy Jinja
    filters and tests, which load together with the roles' filter_plugins, and the collection filters named
    in O(filters).
  - Nothing a task does or returns depends on it. A plugin it cannot load is left to the worker, with a
    warning naming it.
  - Enable it in C(callbacks_enabled) (this project's C(ansible.cfg) does).
options:
  filters:
    description:
      - Collection Jinja filters the playbooks use, by FQCN. Loading one loads every filter file of its
        collection, which a worker would otherwise do each time it first uses one.
    type: list
    elements: str
    default: []
    ini:
      - section: callback_worker_prefork
        key: filters
    env:
      - name: ANSIBLE_CALLBACK_WORKER_PREFORK_FILTERS
requirements:
  - Python's C(os.register_at_fork) (POSIX), which Ansible's controller always has.
"""

_registered = False


def freeze_inherited_heap_after_fork() -> bool:
    """Register gc.freeze to run in each child after a fork, once per process; False if it already was."""
    global _registered
    if _registered:
        return False
    os.register_at_fork(after_in_child=gc.freeze)
    _registered = True
    return True


def load_worker_plugins(filters: Iterable[str]) -> list[str]:
    """Load in this process the plugins each forked worker loads; the names of those that could not be."""
    # by short name, as the workers ask: a same-named plugin in a role's connection_plugins would then resolve
    # to the builtin imported here (none exists; tests/unit/test_worker_prefork.py fails where one appears)
    transport = "ssh" if C.DEFAULT_TRANSPORT == "smart" else C.DEFAULT_TRANSPORT
    wanted = [
        *((loader.connection_loader, name) for name in dict.fromkeys((transport, "local"))),
        (loader.become_loader, C.DEFAULT_BECOME_METHOD),
        (loader.shell_loader, "sh"),
        (loader.lookup_loader, "ansible.builtin.template"),
    ]
    missing = []
    for plugins, name in wanted:
        try:
            found = plugins.get(name, class_only=True)
        except Exception:  # the worker meets it again, and reports it where it matters
            found = None
        if found is None:
            missing.append(f"{plugins.type} {name}")
    # one name each loads every builtin and legacy filter and test (roles' filter_plugins included); a
    # collection filter loads its collection's filter files
    for plugins, name in ((loader.filter_loader, "ansible.builtin.bool"), (loader.test_loader, "success")):
        try:
            plugins.get(name)
        except Exception:
            missing.append(f"{plugins.type} {name}")
    for name in filters:
        try:
            found = loader.filter_loader.get(name)
        except Exception:
            found = None
        if found is None:
            missing.append(f"filter {name}")
    return missing


class CallbackModule(CallbackBase):
    """An aggregate callback that prints nothing but a warning for a plugin it could not load."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "worker_prefork"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None) -> None:
        super().__init__(display=display)
        freeze_inherited_heap_after_fork()
        self._warned: set[str] = set()

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        # at every task: an include_role adds its role's filter_plugins, and the loaders load them again
        for name in load_worker_plugins(self.get_option("filters")):
            if name not in self._warned:
                self._warned.add(name)
                self._display.warning(f"worker_prefork: could not load {name}; each worker loads it itself")

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self.v2_playbook_on_task_start(task, is_conditional=False)
