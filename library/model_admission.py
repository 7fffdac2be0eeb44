#!/usr/bin/python
"""Ansible module model_admission: the gates a model directory passes before it may be synced."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_admission
short_description: Admit a model weights directory only if it passes the supply-chain gates
description:
  - Runs the gates a model must pass before it may be synced to the serving nodes, and returns each
    gate's verdict (C(passed), C(failed) or C(skipped)) with findings that name the file. The task fails
    when a gate fails, naming the gates and the files, unless O(fail_on_refusal=false).
  - C(publisher) - every file matches what the publisher lists (O(publisher_manifest)); a file the
    publisher lists is missing, differs in size or hash, or a file is present that the publisher does
    not list, fails. Accepted forms (O(publisher_format)) are the Hugging Face hub's file metadata JSON
    (the model info with C(siblings) from C(/api/models/REPO/revision/REV?blobs=true), or the file list of
    the tree / paths-info API), where files in LFS are checked by their C(sha256) and small files kept in
    git by their git blob id; a C(sha256sum) file (C(<sha256>  <path>) lines); or a manifest written by
    M(model_manifest) and shipped beside the weights.
  - C(safetensors) - weights are safetensors. For every C(*.safetensors) file the header length and
    JSON header parse, every tensor's dtype is known, its byte size matches its shape, the data offsets
    are contiguous from 0 and end exactly at the end of the file. Every C(*.safetensors.index.json)
    names exactly the shard files present beside it, and its tensors are the shards' tensors. A directory
    without safetensors fails.
  - C(pickle) - pickle-based files (C(.bin), C(.pt), C(.pth), C(.pkl), C(.pickle), C(.ckpt), C(.joblib),
    and any file that starts with a pickle protocol 2-5 header) are refused (O(pickle_policy=refuse)) or
    scanned with picklescan (O(pickle_policy=scan), the default); a pickle importing anything not known
    to be innocuous (C(os), C(posix), C(subprocess), C(builtins.eval)/C(exec), C(socket), ...) fails.
    picklescan is the scanner the Hugging Face hub runs on every upload. It has no dependencies, reads
    raw pickles and PyTorch zip checkpoints without executing them, and classes every imported global
    as innocuous, suspicious or dangerous. fickling (a pickle decompiler) changes its API between 0.1
    releases, and modelscan pulls in a large dependency tree for the same denylist idea.
  - C(python) - C(*.py) files (code that C(trust_remote_code) would run) are listed in RV(python_files)
    and scanned with bandit; a finding of C(exec) (B102), C(eval) (B307), C(os.system) or another shell
    (B605, B607), or C(subprocess) (B404, B602, B603, B604, B606) fails the gate, other bandit findings
    are reported as warnings. O(python_policy=refuse) refuses any C(*.py).
  - C(clamav) - C(clamscan) (Debian package C(clamav)) over the whole directory with the signature
    database in O(clamav_database). A missing or empty database directory fails the gate, it is never a
    pass. Files larger than ClamAV's 4000 MB limit cannot be scanned and are reported as warnings.
  - C(tokenizer) - C(config.json), C(tokenizer.json) and C(tokenizer_config.json) are present and parse
    as JSON objects; the tokenizer loads with the C(tokenizers) package and round-trips every sentence of
    O(tokenizer_samples) (Chinese and English by default) exactly.
  - C(permissions) - every file is readable, and every directory readable and searchable, by
    O(serving_uid) (the vLLM user, 1001 by default), through the owner, group or other bits as they
    apply to that uid; the directories above O(path) must be searchable. With O(fix_permissions=true)
    the missing read (and search) bit is added for the class that applies to the uid, and files are
    chowned to O(owner)/O(group) when those are set; otherwise the files are reported. Directories above
    O(path) are only reported.
  - The gates need C(tokenizers), C(picklescan) and C(bandit). When the running Python cannot import the
    ones the selected gates need, the module re-runs itself under C(/opt/model-tools/bin/python3), the
    virtualenv where the C(model_sync) role installs them at pinned versions.
  - The GPU-only gates (fp16 load, quantisation accuracy, long context, soak) are in
    C(playbooks/model-gpu-gates.yml), see docs/models.md.
version_added: "0.1.0"
author: "A100 LLM platform team"
extends_documentation_fragment:
  - llm_platform
options:
  path:
    description: The model directory to admit, for example C(/models/incoming/qwen2-7b-instruct).
    type: path
    required: true
  gates:
    description:
      - The gates to run; the others are reported as C(skipped).
    type: list
    elements: str
    choices: [publisher, safetensors, pickle, python, clamav, tokenizer, permissions]
    default: [publisher, safetensors, pickle, python, clamav, tokenizer, permissions]
  publisher_manifest:
    description:
      - The publisher's list of files and hashes, in one of the forms of O(publisher_format).
      - Required when the C(publisher) gate runs. For a model with no outside publisher (a fine-tune made
        in house), pass the manifest its producer wrote with M(model_manifest).
      - When it lives inside O(path) it is not counted as a file of the model.
    type: path
  publisher_format:
    description:
      - The form of O(publisher_manifest). C(auto) recognises a model_manifest by its C(format) field, other
        JSON as the hub's metadata, anything else as C(sha256sum) lines.
    type: str
    choices: [auto, hf_json, sha256sum, model_manifest]
    default: auto
  publisher_ignore:
    description:
      - Glob patterns (relative paths) of files the C(publisher) gate ignores, present or not, such as the
        repository's C(.gitattributes) and README that a download for serving may leave out.
    type: list
    elements: str
    default: [".gitattributes", "*.md", "LICENSE*", "NOTICE*"]
  pickle_policy:
    description:
      - C(scan) admits pickle-based files that picklescan finds innocuous; C(refuse) refuses any.
    type: str
    choices: [scan, refuse]
    default: scan
  python_policy:
    description:
      - C(scan) scans C(*.py) with bandit and refuses the findings named above; C(refuse) refuses any.
    type: str
    choices: [scan, refuse]
    default: scan
  clamav_database:
    description:
      - Directory of ClamAV signature databases passed to C(clamscan --database). Required when the
        C(clamav) gate runs. In production the site's mirror of the official databases; in the lab a
        database the lab builds (the EICAR test signature).
    type: path
  clamscan:
    description: The clamscan command (a name looked up in PATH, or an absolute path).
    type: str
    default: clamscan
  tokenizer_samples:
    description: Sentences the tokenizer must encode and decode back unchanged.
    type: list
    elements: str
    default: ["The quick brown fox jumps over the lazy dog.", "大语言模型的权重必须完整、可验证、可读取。"]
  serving_uid:
    description: The uid that serves the model (vLLM); every file must be readable by it.
    type: int
    default: 1001
  serving_gid:
    description:
      - The group ids of that uid. Default, the groups of the user with O(serving_uid) in the node's user
        database, or none when it has no such user (then only the owner and other bits count).
    type: list
    elements: int
  fix_permissions:
    description:
      - Add the missing read (files) or read and search (directories) bits, and apply O(owner)/O(group).
        Otherwise unreadable files are only reported and the gate fails.
    type: bool
    default: false
  owner:
    description: With O(fix_permissions=true), the uid every file and directory under O(path) should have.
    type: int
  group:
    description: With O(fix_permissions=true), the gid every file and directory under O(path) should have.
    type: int
  workers:
    description: Files hashed at the same time by the C(publisher) gate; C(0) is one per core.
    type: int
    default: 0
  cache_path:
    description:
      - A hash cache file for the C(publisher) gate (same format and rules as M(model_manifest)'s), so that
        a second admission of an unchanged directory does not read the weights again. Default none.
    type: path
  fail_on_refusal:
    description: Fail the task when a gate fails. When false, read RV(admitted).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details: Every gate runs; permission fixes are reported, not made, and the cache is not written.
  diff_mode:
    support: full
    details: The permission fixes, one line per file (C(mode uid:gid path)) before and after.
requirements:
  - clamscan (Debian package clamav) and a signature database, for the clamav gate
  - tokenizers, picklescan and bandit, in the target's Python or in /opt/model-tools
notes:
  - Nothing is loaded or executed from the model; pickles are read as opcodes, Python files as source.
  - Findings carry a C(level) - C(error) fails the gate, C(warning) is reported, C(fixed) was fixed.
seealso:
  - module: model_manifest
"""

EXAMPLES = r"""
- name: Admit a model carried in from a machine with internet access
  model_admission:
    path: /models/incoming/qwen2-7b-instruct
    publisher_manifest: /models/incoming/qwen2-7b-instruct.hub.json   # saved from the hub's API
    clamav_database: /var/lib/clamav
    fix_permissions: true
  become: true

- name: An in-house fine-tune, no outside publisher; never any pickle
  model_admission:
    path: /models/incoming/qwen2-7b-support
    publisher_manifest: /models/incoming/qwen2-7b-support.manifest.json
    pickle_policy: refuse
    clamav_database: /var/lib/clamav

- name: Run the gates, decide later
  model_admission:
    path: /models/incoming/qwen2-7b-instruct
    gates: [safetensors, pickle, python, tokenizer]
    fail_on_refusal: false
  register: admission

- name: Show the verdicts
  ansible.builtin.debug:
    msg: "{{ admission.gates | dict2items | map(attribute='value.verdict') }}"
"""

RETURN = r"""
admitted:
  description: Whether every gate that ran passed.
  returned: always
  type: bool
  sample: false
refused_by:
  description: The gates that failed.
  returned: always
  type: list
  elements: str
  sample: [safetensors]
gates:
  description: One entry per gate (all seven, skipped ones included).
  returned: always
  type: dict
  contains:
    verdict:
      description: C(passed), C(failed) or C(skipped).
      type: str
    summary:
      description: One line about the gate's outcome.
      type: str
    findings:
      description: What the gate found; C(file) is relative to O(path), or absolute outside it, or null.
      type: list
      elements: dict
      contains:
        file:
          description: The file concerned.
          type: str
        level:
          description: C(error) (fails the gate), C(warning) or C(fixed).
          type: str
        message:
          description: What is wrong with it.
          type: str
  sample:
    safetensors:
      verdict: failed
      summary: "1 error in 2 safetensors files"
      findings:
        - file: model-00002-of-00002.safetensors
          level: error
          message: "tensor 'lm_head.weight': data_offsets end 1048576 runs past the end of the file"
    clamav: {verdict: passed, summary: "clamscan found nothing in 7 files", findings: []}
python_files:
  description: The C(*.py) files of the model (code C(trust_remote_code) would run), relative paths.
  returned: always
  type: list
  elements: str
  sample: [modeling_qwen.py]
pickle_files:
  description: The pickle-based files of the model, relative paths.
  returned: always
  type: list
  elements: str
  sample: []
msg:
  description: One line; when refused, every failed gate with its files.
  returned: always
  type: str
  sample: "refused /models/incoming/bad: safetensors (model-00002-of-00002.safetensors: ...)"
"""

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.model_admission_gates import GATES, Admission, AdmissionError, tools_for
from ansible.module_utils.model_tools import import_tools

DEFAULT_SAMPLES = [
    "The quick brown fox jumps over the lazy dog.",
    "大语言模型的权重必须完整、可验证、可读取。",
]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "gates": {"type": "list", "elements": "str", "choices": list(GATES), "default": list(GATES)},
            "publisher_manifest": {"type": "path"},
            "publisher_format": {
                "type": "str",
                "choices": ["auto", "hf_json", "sha256sum", "model_manifest"],
                "default": "auto",
            },
            "publisher_ignore": {
                "type": "list",
                "elements": "str",
                "default": [".gitattributes", "*.md", "LICENSE*", "NOTICE*"],
            },
            "pickle_policy": {"type": "str", "choices": ["scan", "refuse"], "default": "scan"},
            "python_policy": {"type": "str", "choices": ["scan", "refuse"], "default": "scan"},
            "clamav_database": {"type": "path"},
            "clamscan": {"type": "str", "default": "clamscan"},
            # sentences, not a secret ("token" in the name trips the no_log heuristic)
            "tokenizer_samples": {
                "type": "list",
                "elements": "str",
                "default": DEFAULT_SAMPLES,
                "no_log": False,
            },
            "serving_uid": {"type": "int", "default": 1001},
            "serving_gid": {"type": "list", "elements": "int"},
            "fix_permissions": {"type": "bool", "default": False},
            "owner": {"type": "int"},
            "group": {"type": "int"},
            "workers": {"type": "int", "default": 0},
            "cache_path": {"type": "path"},
            "fail_on_refusal": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    gates = list(dict.fromkeys(p["gates"]))
    if "publisher" in gates and not p["publisher_manifest"]:
        module.fail_json(
            msg="publisher_manifest is required when the publisher gate runs "
            "(or leave 'publisher' out of gates)"
        )
    if "clamav" in gates and not p["clamav_database"]:
        module.fail_json(
            msg="clamav_database is required when the clamav gate runs: a scan without a signature "
            "database is not a pass (or leave 'clamav' out of gates)"
        )
    if (p["owner"] is not None or p["group"] is not None) and not p["fix_permissions"]:
        module.fail_json(msg="owner and group apply only with fix_permissions: true")
    if p["workers"] < 0:
        module.fail_json(msg=f"workers must be 0 (one per core) or more, got {p['workers']}")
    root = os.path.abspath(p["path"])
    if not os.path.isdir(root):
        module.fail_json(msg=f"path: {root} is not a directory")
    tools = import_tools(module, tools_for(gates, p["pickle_policy"], p["python_policy"]))

    def run(argv: list[str]) -> tuple[int, str, str]:
        rc, out, err = module.run_command(argv)
        return rc, out, err

    clamscan = p["clamscan"]
    if "clamav" in gates and not os.path.isabs(clamscan):
        clamscan = module.get_bin_path(clamscan) or clamscan

    try:
        admission = Admission(
            root=root,
            gates=gates,
            tools=tools,
            run=run,
            check_mode=module.check_mode,
            publisher_manifest=p["publisher_manifest"],
            publisher_format=p["publisher_format"],
            publisher_ignore=p["publisher_ignore"],
            pickle_policy=p["pickle_policy"],
            python_policy=p["python_policy"],
            clamav_database=p["clamav_database"],
            clamscan=clamscan,
            tokenizer_samples=p["tokenizer_samples"],
            serving_uid=p["serving_uid"],
            serving_gids=p["serving_gid"],
            fix_permissions=p["fix_permissions"],
            owner=p["owner"],
            group=p["group"],
            workers=p["workers"],
            cache_path=p["cache_path"],
        )
        outcome = admission.run_gates()
    except AdmissionError as exc:
        module.fail_json(msg=str(exc), admitted=False)
    result: dict[str, Any] = {
        "changed": outcome.changed,
        "admitted": outcome.admitted,
        "refused_by": outcome.refused_by,
        "gates": outcome.gates_dict(),
        "python_files": outcome.python_files,
        "pickle_files": outcome.pickle_files,
        "msg": outcome.message(root),
    }
    if module._diff and outcome.diff_before != outcome.diff_after:
        result["diff"] = {"before": outcome.diff_before, "after": outcome.diff_after}
    if not outcome.admitted and p["fail_on_refusal"]:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
