#!/usr/bin/python
"""Ansible module files_in_place: which of a role's managed paths differ from what the role writes, which of
the partial edits it makes of files (lineinfile, blockinfile, replace) are not there yet, and which of its
units are not enabled or running as it wants."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: files_in_place
short_description: Tell which of a role's managed paths and units are not as the role wants them
description:
  - In one module call, compares each path in O(files) with what the role's write tasks
    (M(ansible.builtin.template), M(ansible.builtin.copy), M(ansible.builtin.file)) would make of it (its
    content as a SHA-1 digest, owner, group, mode and kind, or that nothing is there), each partial edit in
    O(edits) with the file it edits (M(ansible.builtin.lineinfile), M(ansible.builtin.blockinfile),
    M(ansible.builtin.replace)), and each unit in O(units) with what systemd says of it.
  - Meant to run first in a role, registered, so that each write task runs only C(when) its path is in
    RV(differ). A write task costs two module calls even when it changes nothing; on a run where everything
    is in place the role then costs this one call instead.
  - "Caveat: the role must list every path its write tasks manage. A write task skipped because its path is
    not in RV(differ) never runs, so drift on a path left out of O(files) and O(edits) goes unseen and is
    never put right."
  - Never changes anything; C(changed) is always false, and it runs the same in check mode.
  - "O(files[].state=file) and O(files[].state=directory) follow symlinks (C(os.stat)): a link to a file in
    place is in place, and a dangling link counts as missing. M(ansible.builtin.copy) and
    M(ansible.builtin.template) with their default C(follow=false) would replace such a link with a file; here
    it is left as it is. O(files[].state=absent) does not follow them: anything at the path, a dangling link
    included, differs."
  - "A path the module cannot read or look into (permission denied) fails the task; run it with
    C(become: true), as the role's write tasks run."
version_added: "0.1.0"
author: "A100 LLM platform team"
options:
  files:
    description:
      - The paths the role's write tasks manage, each with what the role writes there.
      - A path may be listed once only, in O(files) and O(edits) together.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path on the target.
        type: str
        required: true
      state:
        description:
          - V(file) a regular file, V(directory) a directory, V(absent) nothing at all.
        type: str
        choices: [file, directory, absent]
        default: file
      checksum:
        description:
          - The SHA-1 digest (40 lowercase hex digits) of the content the role writes, for example
            V({{ lookup('ansible.builtin.template', 'x.j2'\) | hash('sha1'\) }}) for a template or
            V({{ content | hash('sha1'\) }}) for a copy's content.
          - Or V(sha256:) and its 64 lowercase hex digits, the form of ansible.builtin.get_url's pinned
            O(ansible.builtin.get_url#module:checksum), for a file the role downloads with that pin.
          - Only with O(files[].state=file). When left out, the content is not compared.
        type: str
      owner:
        description:
          - User name or numeric uid the path must belong to, compared by uid. A name that does not
            resolve on the target makes the path differ (it does not fail the task).
          - Not with O(files[].state=absent).
        type: str
      group:
        description:
          - Group name or numeric gid, compared by gid. A name that does not resolve on the target makes
            the path differ.
          - Not with O(files[].state=absent).
        type: str
      mode:
        description:
          - Permission bits as an octal string of 3 or 4 digits (V("0644"), V("644"), V("2755")), compared
            with the path's permission bits (C(stat.S_IMODE)).
          - Quote it. YAML reads an unquoted V(0644) as the number 420, and the module rejects a number.
          - Not with O(files[].state=absent).
        type: raw
  edits:
    description:
      - The partial edits the role makes of files with M(ansible.builtin.lineinfile),
        M(ansible.builtin.blockinfile) and M(ansible.builtin.replace), each in place when that task would
        change nothing. A differing edit is in RV(differ) under its path, beside the paths of O(files).
      - Each entry gives exactly one of O(edits[].line), O(edits[].block) and O(edits[].absent_regexp).
      - "Caveat: the entry must hold exactly the values the role's task passes (the same V(line), V(block),
        markers, V(regexp), owner, group and mode), or the verdict is about another edit than the task's."
      - The test is conservative. Where it cannot be sure that the task changes nothing, the edit differs
        and the role's task runs and decides; it never calls in place an edit the task would make.
      - A missing file differs (the task creates it, with C(create=true), or fails), and so does a path that
        is not a regular file. Symlinks are followed, as the three tasks follow them.
      - The file is read whole, as bytes decoded as UTF-8 (bytes that are not UTF-8 do not fail the task; they
        match only themselves).
      - A path may be listed once only, in O(files) and O(edits) together.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path on the target of the file the task edits.
        type: str
        required: true
      line:
        description:
          - The V(line) of the role's M(ansible.builtin.lineinfile) task with
            O(ansible.builtin.lineinfile#module:state=present) and neither V(regexp) nor V(search_string).
            Its V(insertbefore) and V(insertafter) do not count, as that task changes nothing once the line is
            there, wherever it is; but not with V(firstmatch=true) and a regular expression in either, as that
            task then stops looking for the line at the first line the expression matches.
          - 'In place when the file has the line: the last line of the file that reads O(edits[].line), its
            trailing C(\r) and C(\n) left out, must end with a single C(\n), or lineinfile rewrites it (a
            C(\r\n) line ending, or the last line of the file with no line break, differs).'
          - A C(\n) in it is refused (no line of a file can equal it, so lineinfile would add it every run).
        type: str
      block:
        description:
          - The V(block) of the role's M(ansible.builtin.blockinfile) task with
            O(ansible.builtin.blockinfile#module:state=present), and neither V(prepend_newline) nor
            V(append_newline) set. Empty is refused (the task then removes the block).
          - 'In place, conservatively, only when the begin marker line occurs exactly once in the file; the
            end marker line exactly once, after it; the lines between them are the block''s own lines, breaks
            included (a C(\n) added to a block that does not end with one, as the task adds it); the line
            before the begin marker, if any, ends with C(\n); and the file ends with a C(\n). Anything else
            differs, markers found twice included, though the task may then change nothing.'
        type: str
      marker:
        description:
          - The block's V(marker), holding V({mark}); only with O(edits[].block). Left out, blockinfile's
            default V(# {mark} ANSIBLE MANAGED BLOCK).
        type: str
      marker_begin:
        description:
          - What the task puts for V({mark}) in the begin marker; only with O(edits[].block). Left out,
            blockinfile's default V(BEGIN).
        type: str
      marker_end:
        description:
          - What the task puts for V({mark}) in the end marker; only with O(edits[].block). Left out,
            blockinfile's default V(END).
        type: str
      absent_regexp:
        description:
          - The V(regexp) of the role's M(ansible.builtin.replace) task, without V(after) or V(before),
            where the role's replacement makes text the regexp no longer matches.
          - In place when the regexp matches nowhere in the file, searched as that task does (Python's
            C(re), C(re.MULTILINE)). A match differs, even where the replacement would leave the text as it
            is.
          - An invalid regular expression is refused.
        type: str
      owner:
        description:
          - User name or numeric uid the file must belong to (the task's V(owner)), compared by uid. A name
            that does not resolve on the target makes the edit differ.
        type: str
      group:
        description:
          - Group name or numeric gid (the task's V(group)), compared by gid. A name that does not resolve
            on the target makes the edit differ.
        type: str
      mode:
        description:
          - Permission bits (the task's V(mode)) as a quoted octal string of 3 or 4 digits (V("0644")),
            compared with the file's permission bits.
        type: raw
  units:
    description:
      - The systemd units the role's M(ansible.builtin.systemd_service) tasks manage, each with whether the
        role wants it enabled at boot and running now. One C(systemctl show) call reads them all; a unit not
        as wanted is in RV(differ) under its name, beside the paths.
      - "Enabled is what M(ansible.builtin.systemd_service) takes for enabled: C(systemctl is-enabled) exits 0
        and prints neither V(enabled-runtime), V(indirect) nor V(alias) (asked of each unit whose enabling
        the role manages, as that module does: systemd's own C(UnitFileState) is cached until a
        daemon-reload). Running is C(ActiveState) V(active) or V(activating). A unit systemd has not loaded
        differs unless the role wants it neither enabled nor running."
      - A name is the unit's name as the role's task gives it (V(chrony) and V(chrony.service) are two
        entries); no globs.
      - "The read is taken when the task runs: gate a unit's task on it only where nothing the role did since
        (a package installed, a unit file written) can change the unit's state."
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The unit's name, V(chrony.service) or V(etcd-backup.timer).
        type: str
        required: true
      enabled:
        description: Whether the role wants the unit enabled at boot; left out, not compared.
        type: bool
      active:
        description:
          - Whether the role wants the unit running; left out, not compared.
          - Give O(units[].enabled), O(units[].active) or both.
        type: bool
  stat:
    description:
      - Paths whose stat the role's logic reads, answered in RV(stat) as M(ansible.builtin.stat) answers with
        its default C(follow=false) (a link at the path is not followed). Not compared with anything; they do
        not count in RV(checked).
      - One option of this call instead of a stat task per path.
    type: list
    elements: str
    default: []
  slurp:
    description:
      - Files whose content the role's logic reads, answered in RV(slurp) as M(ansible.builtin.slurp) answers.
        A missing path is answered with nothing (where slurp fails). Not compared with anything.
      - One option of this call instead of a slurp task per file.
    type: list
    elements: str
    default: []
  find:
    description:
      - Finds in directories whose result the role's logic reads, each answered in RV(found) under its
        O(find[].name) as M(ansible.builtin.find) answers with the same options. Not compared with anything;
        they do not count in RV(checked).
      - One option of this call instead of a find task per find.
      - "Only the options of M(ansible.builtin.find) below, with that module's defaults for the others (no
        O(ansible.builtin.find#module:follow), O(ansible.builtin.find#module:excludes),
        O(ansible.builtin.find#module:use_regex), O(ansible.builtin.find#module:age),
        O(ansible.builtin.find#module:size), O(ansible.builtin.find#module:mode) or
        O(ansible.builtin.find#module:limit)). The walk is that module's own: the same entries in the same
        order, hidden directories walked into (only their names are left out without O(find[].hidden)), links
        never followed."
      - "Where M(ansible.builtin.find) skips a path (one that is not a directory or is missing, a directory it
        may not list, an entry it may not look at, a file it cannot decode for O(find[].contains)), it is in
        that find's C(skipped_paths) with that module's message, and the task does not fail; that module's
        warning is not repeated, as a role's read meets directories its later tasks make."
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The key of this find's answer in RV(found); each name once.
        type: str
        required: true
      paths:
        description: Absolute paths of the directories to look in (O(ansible.builtin.find#module:paths)).
        type: list
        elements: str
        required: true
      patterns:
        description:
          - Shell globs, matched against the name of each entry (C(fnmatch)); an entry matching any of them is
            found. Empty, every name. As O(ansible.builtin.find#module:patterns) without
            O(ansible.builtin.find#module:use_regex).
        type: list
        elements: str
        default: []
      contains:
        description:
          - A Python regular expression a line of a regular file must match at its start (C(re.match), each
            line with its line break, read as text in the locale's encoding), as
            O(ansible.builtin.find#module:contains) without O(ansible.builtin.find#module:read_whole_file).
          - Only with O(find[].file_type=file), as in M(ansible.builtin.find); ignored with the others. An
            invalid expression is refused.
        type: str
      file_type:
        description: The kind of entry to find (O(ansible.builtin.find#module:file_type)).
        type: str
        choices: [file, directory, link, any]
        default: file
      hidden:
        description: Whether entries whose name starts with a dot are found.
        type: bool
        default: false
      recurse:
        description: Whether the directories under O(find[].paths) are walked into.
        type: bool
        default: false
      depth:
        description:
          - With O(find[].recurse), how many levels below O(find[].paths) are walked (1, their own entries).
            Left out, or V(0), no limit.
        type: int
      get_checksum:
        description: Whether each regular file found has its C(checksum) (SHA-1).
        type: bool
        default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - llm_platform
notes:
  - The checksum is compared with the file's content read in full, so a large file costs a read. Content
    written by M(ansible.builtin.template) is the rendered template; hash what the role renders, with the
    same variables.
seealso:
  - module: ansible.builtin.stat
  - module: ansible.builtin.find
  - module: ansible.builtin.template
  - module: ansible.builtin.lineinfile
  - module: ansible.builtin.blockinfile
  - module: ansible.builtin.replace
"""

EXAMPLES = r"""
- name: Find which of containerd's files differ from what the role writes
  files_in_place:
    files:
      - path: /etc/containerd/config.toml
        checksum: "{{ lookup('ansible.builtin.template', 'config.toml.j2') | hash('sha1') }}"
        owner: root
        group: root
        mode: "0644"
      - path: /etc/containerd/conf.d
        state: directory
        mode: "0755"
  register: containerd_files

- name: Write containerd's configuration
  ansible.builtin.template:
    src: config.toml.j2
    dest: /etc/containerd/config.toml
    owner: root
    group: root
    mode: "0644"
  when: "'/etc/containerd/config.toml' in containerd_files.differ"

- name: Make containerd's drop-in directory
  ansible.builtin.file:
    path: /etc/containerd/conf.d
    state: directory
    mode: "0755"
  when: "'/etc/containerd/conf.d' in containerd_files.differ"

- name: A file the role writes with ansible.builtin.copy, and one it removes
  files_in_place:
    files:
      - path: /etc/modules-load.d/containerd.conf
        checksum: "{{ containerd_modules_load | hash('sha1') }}"
        mode: "0644"
      - path: /etc/containerd/config.toml.dpkg-old
        state: absent
  become: true
  register: containerd_files

- name: Find which of the role's edits of files the system does not have yet
  files_in_place:
    edits:
      - path: /etc/sysctl.d/99-local.conf
        line: vm.max_map_count = 262144
        mode: "0644"
      - path: /etc/hosts
        block: |
          10.0.0.11 gpu-node-1
          10.0.0.12 gpu-node-2
        marker: "# {mark} LLM PLATFORM NODES"
      - path: /etc/fstab
        absent_regexp: '^([^#\n].*\sswap\s.*)$'
  become: true
  register: node_edits

- name: Set vm.max_map_count for the serving engine
  ansible.builtin.lineinfile:
    path: /etc/sysctl.d/99-local.conf
    line: vm.max_map_count = 262144
    create: true
    mode: "0644"
  become: true
  when: "'/etc/sysctl.d/99-local.conf' in node_edits.differ"

- name: List the nodes in /etc/hosts
  ansible.builtin.blockinfile:
    path: /etc/hosts
    block: |
      10.0.0.11 gpu-node-1
      10.0.0.12 gpu-node-2
    marker: "# {mark} LLM PLATFORM NODES"
  become: true
  when: "'/etc/hosts' in node_edits.differ"

- name: Find which files of containerd's differ, and the registry directories and files there are
  files_in_place:
    files:
      - path: /etc/containerd/certs.d
        state: directory
        mode: "0755"
    find:
      - name: registry
        paths: [/etc/containerd/certs.d]
        file_type: any
        hidden: true
        recurse: true
        depth: 2
        get_checksum: true
  become: true
  register: containerd_read

- name: Remove the registry directories no longer listed
  ansible.builtin.file:
    path: "{{ item }}"
    state: absent
  loop: >-
    {{ containerd_read.found.registry.files | selectattr('isdir') | map(attribute='path')
       | reject('in', ['/etc/containerd/certs.d/quay.io']) }}
  become: true

- name: Comment out the swap lines of /etc/fstab
  ansible.builtin.replace:
    path: /etc/fstab
    regexp: '^([^#\n].*\sswap\s.*)$'
    replace: '# \1'
  become: true
  when: "'/etc/fstab' in node_edits.differ"
"""

RETURN = r"""
differ:
  description:
    - The paths and units that are not as the role wants them, in the order of O(files), then O(edits), then
      O(units).
  returned: always
  type: list
  elements: str
  sample: ["/etc/containerd/config.toml"]
reasons:
  description: For each path or unit in RV(differ), why it differs, in short words.
  returned: always
  type: dict
  sample:
    /etc/containerd/config.toml: ["content differs", "mode 0600, want 0644"]
    /etc/containerd/conf.d: ["missing"]
    /etc/hosts: ["block content differs"]
in_place:
  description: True when every path, edit and unit is as the role wants it (RV(differ) is empty).
  returned: always
  type: bool
  sample: false
checked:
  description: The number of entries of O(files), O(edits) and O(units) checked.
  returned: always
  type: int
  sample: 2
stat:
  description:
    - For each path of O(stat), what M(ansible.builtin.stat) returns as C(stat) for it, in part, C(exists)
      always, and where the path exists C(path), C(isreg), C(isdir), C(islnk), C(lnk_target) (a link only),
      C(mode), C(uid), C(gid), C(pw_name), C(gr_name), C(size), C(mtime), C(readable) and C(executable) (for
      the module's user, through a link), and C(checksum) (the SHA-1 of a regular file the module may read).
    - C(exists) is false also for a path under a regular file (where M(ansible.builtin.stat) fails).
  returned: always
  type: dict
  sample:
    /etc/kubernetes/kubelet.conf: {exists: false}
slurp:
  description:
    - For each path of O(slurp), what M(ansible.builtin.slurp) returns (C(content) in base64, C(encoding),
      C(source)); an empty dict where nothing is at the path.
  returned: always
  type: dict
  sample:
    /etc/hostname: {content: "Z3B1LW5vZGUtMQo=", encoding: base64, source: /etc/hostname}
found:
  description:
    - For each find of O(find), by its O(find[].name), what M(ansible.builtin.find) returns for it, in part
      (empty without O(find)).
  returned: always
  type: dict
  contains:
    files:
      description:
        - The entries found, in the order M(ansible.builtin.find) lists them, each C(path) and what that
          module returns of it among C(isreg), C(isdir), C(islnk) (of the entry itself, not followed),
          C(mode) (4 octal digits), C(uid), C(gid), C(pw_name), C(gr_name) (empty where the id has no name),
          C(size), C(mtime), C(ctime), and with O(find[].get_checksum) the C(checksum) (SHA-1) of a regular
          file.
      type: list
      elements: dict
    matched:
      description: The number of entries found.
      type: int
    examined:
      description: The number of entries looked at, as M(ansible.builtin.find) counts them.
      type: int
    skipped_paths:
      description: Each path skipped, with M(ansible.builtin.find)'s message.
      type: dict
  sample:
    registry:
      files:
        - path: /etc/containerd/certs.d/quay.io
          isreg: false
          isdir: true
          islnk: false
          mode: "0755"
          uid: 0
          gid: 0
          pw_name: root
          gr_name: root
          size: 4096
          mtime: 1767225600.0
      matched: 1
      examined: 1
      skipped_paths: {}
units:
  description:
    - What systemd reports of each unit of O(units), by its name as given (empty without O(units)).
    - C(IsEnabled) is what C(systemctl is-enabled) printed and its exit status, for a loaded unit whose
      enabling is compared.
  returned: always
  type: dict
  sample:
    chrony.service:
      Id: chrony.service
      LoadState: loaded
      UnitFileState: enabled
      ActiveState: active
      NeedDaemonReload: "no"
      ConditionResult: "yes"
      ConditionTimestampMonotonic: "36140269430"
      IsEnabled: enabled 0
"""

import grp
import os
import pwd
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.file_edits import Edit, edit_field, edit_of_entry
from ansible.module_utils.in_place_report import (
    EntryError,
    Found,
    entry_field,
    entry_name,
    reasons_by_key,
    run_report,
)
from ansible.module_utils.path_finds import FILE_TYPES, FindSpec, find_in
from ansible.module_utils.path_reads import PathReadError, digest_of, reads, sha1_of

SHA1_HEX = re.compile(r"[0-9a-f]{40}")
SHA256_PINNED = re.compile(r"sha256:([0-9a-f]{64})")
OCTAL_MODE = re.compile(r"[0-7]{3,4}")
BECOME_HINT = "run the task with become: true"

# What stat.S_IFMT says a path is, in the words of the reasons.
KINDS: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)

ENTRY_SPEC: dict[str, Any] = {
    "path": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["file", "directory", "absent"], "default": "file"},
    "checksum": {"type": "str"},
    "owner": {"type": "str"},
    "group": {"type": "str"},
    "mode": {"type": "raw"},
}

UNIT_SPEC: dict[str, Any] = {
    "name": {"type": "str", "required": True},
    "enabled": {"type": "bool"},
    "active": {"type": "bool"},
}

# No defaults for the markers here: given with another kind of edit they are refused (file_edits.py's
# BLOCK_DEFAULTS).
EDIT_SPEC: dict[str, Any] = {
    "path": {"type": "str", "required": True},
    "line": {"type": "str"},
    "block": {"type": "str"},
    "marker": {"type": "str"},
    "marker_begin": {"type": "str"},
    "marker_end": {"type": "str"},
    "absent_regexp": {"type": "str"},
    "owner": {"type": "str"},
    "group": {"type": "str"},
    "mode": {"type": "raw"},
}

# ansible.builtin.find's options the roles use, with its defaults (module_utils/path_finds.py)
FIND_SPEC: dict[str, Any] = {
    "name": {"type": "str", "required": True},
    "paths": {"type": "list", "elements": "str", "required": True},
    "patterns": {"type": "list", "elements": "str", "default": []},
    "contains": {"type": "str"},
    "file_type": {"type": "str", "choices": list(FILE_TYPES), "default": "file"},
    "hidden": {"type": "bool", "default": False},
    "recurse": {"type": "bool", "default": False},
    "depth": {"type": "int"},
    "get_checksum": {"type": "bool", "default": False},
}

ARGUMENT_SPEC: dict[str, Any] = {
    "files": {"type": "list", "elements": "dict", "default": [], "options": ENTRY_SPEC},
    "edits": {"type": "list", "elements": "dict", "default": [], "options": EDIT_SPEC},
    "units": {"type": "list", "elements": "dict", "default": [], "options": UNIT_SPEC},
    "stat": {"type": "list", "elements": "str", "default": []},
    "slurp": {"type": "list", "elements": "str", "default": []},
    "find": {"type": "list", "elements": "dict", "default": [], "options": FIND_SPEC},
}

SYSTEMCTL_ENV = {"LC_ALL": "C", "SYSTEMD_PAGER": ""}
# What systemctl show reports of each unit, in one call for all of them.
UNIT_PROPERTIES = (
    "Id",
    "LoadState",
    "UnitFileState",
    "ActiveState",
    "NeedDaemonReload",
    "ConditionResult",
    "ConditionTimestampMonotonic",
)
# What systemctl is-enabled prints of a unit ansible.builtin.systemd_service takes for enabled: it exits 0,
# and the state is not enabled-runtime, indirect or alias, which that module enables again. Asked of
# is-enabled, as that module does, not read from systemctl show's UnitFileState: systemd caches that until
# its next daemon-reload, so a link removed by hand would still read enabled.
NOT_ENABLED_THOUGH_ZERO = frozenset({"enabled-runtime", "indirect", "alias"})
# Characters no unit name the roles give holds; a glob would make systemctl show several units.
UNIT_NAME = re.compile(r"[A-Za-z0-9:_.@\\-]+")
# ... and for running (state=started starts any other).
RUNNING_STATES = frozenset({"active", "activating"})


class CannotLook(Exception):
    """A path the module may not stat or read; the message names the path."""


class OwnedPath(Protocol):
    """What the owner, group and mode comparisons read of an entry (a Wanted or a WantedEdit)."""

    @property
    def path(self) -> str: ...

    @property
    def owner(self) -> str | None: ...

    @property
    def group(self) -> str | None: ...

    @property
    def mode(self) -> int | None: ...


@dataclass(frozen=True)
class Wanted:
    """One entry of ``files``: what the role writes at ``path``."""

    path: str
    state: str
    checksum: str | None
    owner: str | None
    group: str | None
    mode: int | None


def field_name(index: int, field: str) -> str:
    return entry_field("files", index, field)


def absolute_path(name: str, path: str) -> str:
    """PATH, refused unless absolute; NAME is the option as messages name it."""
    if not os.path.isabs(path):
        raise EntryError(f"{name}: {path!r} is not an absolute path")
    return path


def validated_path(index: int, path: str, list_name: str = "files") -> str:
    return absolute_path(entry_field(list_name, index, "path"), path)


def validated_read_paths(option: str, paths: list[str]) -> list[str]:
    """The paths of the option ``stat`` or ``slurp``, each absolute."""
    return [absolute_path(entry_name(option, index), path) for index, path in enumerate(paths)]


def validated_find(index: int, entry: dict[str, Any]) -> FindSpec:
    contains = entry["contains"]
    try:
        pattern = None if contains is None else re.compile(contains)
    except re.error as exc:
        raise EntryError(
            f"{entry_field('find', index, 'contains')}: {contains!r} is not a regular expression: {exc}"
        ) from exc
    return FindSpec(
        paths=[
            absolute_path(f"{entry_field('find', index, 'paths')}[{at}]", path)
            for at, path in enumerate(entry["paths"])
        ],
        patterns=entry["patterns"],
        contains=pattern,
        file_type=entry["file_type"],
        hidden=entry["hidden"],
        recurse=entry["recurse"],
        depth=entry["depth"],
        get_checksum=entry["get_checksum"],
    )


def validated_finds(entries: list[dict[str, Any]]) -> dict[str, FindSpec]:
    """The finds of the option ``find``, by name, each name once."""
    finds: dict[str, FindSpec] = {}
    first: dict[str, int] = {}
    for index, entry in enumerate(entries):
        name = entry["name"]
        if name in first:
            raise EntryError(
                f"{entry_field('find', first[name], 'name')} and {entry_field('find', index, 'name')}"
                f" both name {name}"
            )
        first[name] = index
        finds[name] = validated_find(index, entry)
    return finds


def validated_checksum(index: int, state: str, checksum: str | None) -> str | None:
    if checksum is None:
        return None
    if state != "file":
        raise EntryError(f"{field_name(index, 'checksum')}: only for state=file, not state={state}")
    if not (SHA1_HEX.fullmatch(checksum) or SHA256_PINNED.fullmatch(checksum)):
        raise EntryError(
            f"{field_name(index, 'checksum')}: {checksum!r} is not a SHA-1 digest (40 lowercase hex digits,"
            " as the hash('sha1') filter gives) nor sha256: and 64 lowercase hex digits (get_url's checksum)"
        )
    return checksum


def content_digest(path: str, checksum: str) -> str:
    """The file's digest in the form of the entry's CHECKSUM (SHA-1 hex, or get_url's sha256:HEX)."""
    try:
        if checksum.startswith("sha256:"):
            return "sha256:" + digest_of(path, "sha256")
        return sha1_of(path)
    except OSError as exc:
        raise cannot_read(path, exc) from exc


def parsed_mode(index: int, mode: Any, list_name: str = "files") -> int | None:
    if mode is None:
        return None
    name = entry_field(list_name, index, "mode")
    if not isinstance(mode, str):
        raise EntryError(
            f'{name}: {mode!r} is not a string; quote the mode (mode: "0644"),'
            " as YAML reads an unquoted 0644 as the number 420"
        )
    if not OCTAL_MODE.fullmatch(mode):
        raise EntryError(f'{name}: {mode!r} is not 3 or 4 octal digits, like "0644"')
    return int(mode, 8)


def reject_attributes_of_absent(index: int, entry: dict[str, Any]) -> None:
    given = [field for field in ("owner", "group", "mode") if entry[field] is not None]
    if entry["state"] == "absent" and given:
        raise EntryError(f"{entry_name('files', index)}: {', '.join(given)} not with state=absent")


def validated_entry(index: int, entry: dict[str, Any]) -> Wanted:
    state = entry["state"]
    reject_attributes_of_absent(index, entry)
    return Wanted(
        path=validated_path(index, entry["path"]),
        state=state,
        checksum=validated_checksum(index, state, entry["checksum"]),
        owner=entry["owner"],
        group=entry["group"],
        mode=parsed_mode(index, entry["mode"]),
    )


def reject_duplicate_paths(named_paths: list[tuple[str, str]]) -> None:
    """NAMED_PATHS: each entry's path field as messages name it (``edits[2].path``) with the path."""
    first_name: dict[str, str] = {}
    for name, path in named_paths:
        key = os.path.normpath(path)
        if key in first_name:
            raise EntryError(f"{first_name[key]} and {name} both name {key}")
        first_name[key] = name


def validated_entries(entries: list[dict[str, Any]]) -> list[Wanted]:
    return [validated_entry(index, entry) for index, entry in enumerate(entries)]


def kind_of(st_mode: int) -> str:
    for is_kind, words in KINDS:
        if is_kind(st_mode):
            return words
    return "an unknown kind of file"


def stat_following_links(path: str) -> os.stat_result | None:
    """The path's stat through symlinks; None when missing (a dangling link included)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError as exc:
        raise CannotLook(f"cannot look at {path}: {exc.strerror}; {BECOME_HINT}") from exc
    except OSError as exc:
        raise CannotLook(f"cannot look at {path}: {exc.strerror}") from exc


def missing_reason(path: str) -> str:
    return "missing (a dangling symlink)" if os.path.islink(path) else "missing"


def cannot_read(path: str, exc: OSError) -> CannotLook:
    hint = f"; {BECOME_HINT}" if isinstance(exc, PermissionError) else ""
    return CannotLook(f"cannot read {path}: {exc.strerror}{hint}")


def text_of_file(path: str) -> str:
    """The file's content as text: UTF-8, any other byte kept as a lone surrogate (surrogateescape, as the
    builtins' to_text(errors='surrogate_or_strict') does), so text compares as the bytes would."""
    try:
        with open(path, "rb") as content:
            return content.read().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise cannot_read(path, exc) from exc


def uid_of(owner: str) -> int | None:
    """The uid an owner names (a numeric uid, or a user name); None when no such user."""
    if owner.isdigit():
        return int(owner)
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        return None


def gid_of(group: str) -> int | None:
    """The gid a group names (a numeric gid, or a group name); None when no such group."""
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def owner_reasons(wanted: OwnedPath, st: os.stat_result) -> list[str]:
    if wanted.owner is None:
        return []
    uid = uid_of(wanted.owner)
    if uid is None:
        return [f"user {wanted.owner!r} does not exist"]
    if uid != st.st_uid:
        return [f"owner {user_name(st.st_uid)}, want {wanted.owner}"]
    return []


def group_reasons(wanted: OwnedPath, st: os.stat_result) -> list[str]:
    if wanted.group is None:
        return []
    gid = gid_of(wanted.group)
    if gid is None:
        return [f"group {wanted.group!r} does not exist"]
    if gid != st.st_gid:
        return [f"group {group_name(st.st_gid)}, want {wanted.group}"]
    return []


def mode_reasons(wanted: OwnedPath, st: os.stat_result) -> list[str]:
    if wanted.mode is None or wanted.mode == stat.S_IMODE(st.st_mode):
        return []
    return [f"mode {stat.S_IMODE(st.st_mode):04o}, want {wanted.mode:04o}"]


def attribute_reasons(wanted: OwnedPath, st: os.stat_result) -> list[str]:
    return owner_reasons(wanted, st) + group_reasons(wanted, st) + mode_reasons(wanted, st)


def file_reasons(wanted: Wanted) -> list[str]:
    st = stat_following_links(wanted.path)
    if st is None:
        return [missing_reason(wanted.path)]
    if not stat.S_ISREG(st.st_mode):
        return [f"not a regular file ({kind_of(st.st_mode)})"]
    content: list[str] = []
    if wanted.checksum is not None and content_digest(wanted.path, wanted.checksum) != wanted.checksum:
        content = ["content differs"]
    return content + attribute_reasons(wanted, st)


def directory_reasons(wanted: Wanted) -> list[str]:
    st = stat_following_links(wanted.path)
    if st is None:
        return [missing_reason(wanted.path)]
    if not stat.S_ISDIR(st.st_mode):
        return [f"not a directory ({kind_of(st.st_mode)})"]
    return attribute_reasons(wanted, st)


def absent_reasons(wanted: Wanted) -> list[str]:
    try:
        os.lstat(wanted.path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except PermissionError as exc:
        raise CannotLook(f"cannot look at {wanted.path}: {exc.strerror}; {BECOME_HINT}") from exc
    except OSError as exc:
        raise CannotLook(f"cannot look at {wanted.path}: {exc.strerror}") from exc
    return ["exists, want absent"]


REASONS_BY_STATE: dict[str, Callable[[Wanted], list[str]]] = {
    "file": file_reasons,
    "directory": directory_reasons,
    "absent": absent_reasons,
}


def entry_reasons(wanted: Wanted) -> list[str]:
    return REASONS_BY_STATE[wanted.state](wanted)


def reasons_by_path(wanted: list[Wanted]) -> dict[str, list[str]]:
    """Each differing path with its reasons, in the order of ``wanted``."""
    return reasons_by_key(wanted, attrgetter("path"), entry_reasons)


# ------------------------------------------------------------------ edits: lineinfile, blockinfile, replace
# What each kind of edit is, and when it is in place in a file's text: module_utils/file_edits.py.


@dataclass(frozen=True)
class WantedEdit:
    """One entry of ``edits``: a partial edit of the file at ``path``, and its owner, group and mode."""

    path: str
    edit: Edit
    owner: str | None
    group: str | None
    mode: int | None


def validated_edit(index: int, entry: dict[str, Any]) -> WantedEdit:
    path = validated_path(index, entry["path"], "edits")
    return WantedEdit(
        path=path,
        edit=edit_of_entry(index, entry),
        owner=entry["owner"],
        group=entry["group"],
        mode=parsed_mode(index, entry["mode"], "edits"),
    )


def validated_edits(entries: list[dict[str, Any]]) -> list[WantedEdit]:
    return [validated_edit(index, entry) for index, entry in enumerate(entries)]


def edit_reasons(wanted: WantedEdit) -> list[str]:
    st = stat_following_links(wanted.path)
    if st is None:
        return [missing_reason(wanted.path)]
    if not stat.S_ISREG(st.st_mode):
        return [f"not a regular file ({kind_of(st.st_mode)})"]
    return wanted.edit.reasons(text_of_file(wanted.path)) + attribute_reasons(wanted, st)


def reasons_by_edited_path(wanted: list[WantedEdit]) -> dict[str, list[str]]:
    """Each edit not in place under its path, with its reasons, in the order of ``wanted``."""
    return reasons_by_key(wanted, attrgetter("path"), edit_reasons)


# ------------------------------------------------------------------ units


@dataclass(frozen=True)
class WantedUnit:
    """One entry of ``units``: whether the role wants the unit enabled and running (None: not managed)."""

    name: str
    enabled: bool | None
    active: bool | None


def validated_units(entries: list[dict[str, Any]]) -> list[WantedUnit]:
    wanted: list[WantedUnit] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        name = entry["name"]
        if name.startswith("-") or not UNIT_NAME.fullmatch(name):
            raise EntryError(f"{entry_field('units', index, 'name')}: {name!r} is not a unit name")
        if entry["enabled"] is None and entry["active"] is None:
            raise EntryError(f"{entry_name('units', index)}: give enabled, active or both")
        if name in seen:
            raise EntryError(
                f"{entry_field('units', seen[name], 'name')} and {entry_field('units', index, 'name')}"
                f" both name {name}"
            )
        seen[name] = index
        wanted.append(WantedUnit(name=name, enabled=entry["enabled"], active=entry["active"]))
    return wanted


def parsed_show(output: str, count: int) -> list[dict[str, str]]:
    """systemctl show's blocks of KEY=value lines, one per unit, in the order the units were named."""
    blocks = [block for block in output.strip("\n").split("\n\n") if block.strip()]
    if len(blocks) != count:
        raise CannotLook(f"systemctl show described {len(blocks)} units for the {count} named")
    return [dict(line.split("=", 1) for line in block.splitlines() if "=" in line) for block in blocks]


def unit_reasons(wanted: WantedUnit, shown: dict[str, str]) -> list[str]:
    """Why the unit is not as wanted: SHOWN is what systemctl show says of it, with ``IsEnabled``, what
    systemctl is-enabled printed and its exit status (``state rc``), where enabled is wanted or unwanted."""
    load = shown.get("LoadState", "")
    if load != "loaded":
        # a unit the role wants neither enabled nor running may as well not be there
        wants_it = wanted.enabled is True or wanted.active is True
        return [f"not loaded (LoadState={load or 'unknown'})"] if wants_it else []
    reasons: list[str] = []
    file_state, _, rc = shown.get("IsEnabled", " 1").rpartition(" ")
    enabled = rc == "0" and file_state not in NOT_ENABLED_THOUGH_ZERO
    if wanted.enabled is True and not enabled:
        reasons.append(f"not enabled (is-enabled: {file_state or 'nothing'})")
    if wanted.enabled is False and enabled:
        reasons.append(f"enabled, want disabled (is-enabled: {file_state})")
    active = shown.get("ActiveState", "")
    if wanted.active is True and active not in RUNNING_STATES:
        reasons.append(f"not running (ActiveState={active or 'unknown'})")
    if wanted.active is False and (active in RUNNING_STATES or active == "deactivating"):
        reasons.append(f"running, want stopped (ActiveState={active})")
    return reasons


def shown_units(module: AnsibleModule, wanted: list[WantedUnit]) -> list[dict[str, str]]:
    """What systemd reports of each wanted unit, in one systemctl call."""
    if not wanted:
        return []
    systemctl = module.get_bin_path("systemctl")
    if systemctl is None:
        raise CannotLook("systemctl is not on this host: the units cannot be read")
    rc, out, err = module.run_command(
        [systemctl, "show", f"--property={','.join(UNIT_PROPERTIES)}", "--", *[unit.name for unit in wanted]],
        environ_update=SYSTEMCTL_ENV,
    )
    if rc != 0:
        raise CannotLook(f"systemctl show failed (rc {rc}): {err.strip() or out.strip()}")
    shown = parsed_show(out, len(wanted))
    for unit, properties in zip(wanted, shown, strict=True):
        if unit.enabled is not None and properties.get("LoadState") == "loaded":
            # one unit a call: is-enabled prints nothing on stdout for a unit it cannot read, so the lines of
            # several would not line up
            rc, out, _ = module.run_command(
                [systemctl, "is-enabled", "--", unit.name], environ_update=SYSTEMCTL_ENV
            )
            properties["IsEnabled"] = f"{out.strip().splitlines()[0] if out.strip() else ''} {rc}"
    return shown


def reject_paths_named_twice(files: list[Wanted], edits: list[WantedEdit]) -> None:
    reject_duplicate_paths(
        [(field_name(index, "path"), wanted.path) for index, wanted in enumerate(files)]
        + [(edit_field(index, "path"), wanted.path) for index, wanted in enumerate(edits)]
    )


@dataclass(frozen=True)
class Wants:
    """The three lists of wants, validated, and the paths to read for the role."""

    files: list[Wanted]
    edits: list[WantedEdit]
    units: list[WantedUnit]
    stat_paths: list[str]
    slurp_paths: list[str]
    finds: dict[str, FindSpec]

    @property
    def count(self) -> int:
        return len(self.files) + len(self.edits) + len(self.units)


def validated_wants(params: dict[str, Any]) -> Wants:
    files = validated_entries(params["files"])
    edits = validated_edits(params["edits"])
    reject_paths_named_twice(files, edits)
    return Wants(
        files=files,
        edits=edits,
        units=validated_units(params["units"]),
        stat_paths=validated_read_paths("stat", params["stat"]),
        slurp_paths=validated_read_paths("slurp", params["slurp"]),
        finds=validated_finds(params["find"]),
    )


def read(module: AnsibleModule, wanted: Wants) -> Found:
    """The paths', the edits' and the units' reasons, in that order, what systemd said of each unit, and the
    stat, slurp and find reads."""
    reasons = reasons_by_path(wanted.files)
    reasons.update(reasons_by_edited_path(wanted.edits))
    shown = shown_units(module, wanted.units)
    for unit, properties in zip(wanted.units, shown, strict=True):
        found = unit_reasons(unit, properties)
        if found:
            reasons[unit.name] = found
    units = {unit.name: properties for unit, properties in zip(wanted.units, shown, strict=True)}
    try:
        read_paths = reads(wanted.stat_paths, wanted.slurp_paths)
    except PathReadError as exc:
        raise CannotLook(f"{exc}; {BECOME_HINT}") from exc
    finds = {name: find_in(spec) for name, spec in wanted.finds.items()}
    return reasons, wanted.count, {"units": units, **read_paths, "found": finds}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_report(module, validated_wants, lambda wanted: read(module, wanted), CannotLook)


if __name__ == "__main__":
    main()
