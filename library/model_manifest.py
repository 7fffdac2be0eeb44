#!/usr/bin/python
"""Ansible module model_manifest: write or verify the sha256 manifest of a model directory."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_manifest
short_description: Write or verify the sha256 manifest of a model weights directory
description:
  - C(state=generate) hashes every file of O(path) and writes a manifest (JSON, format
    C(model-manifest/1)) that lists, for each file, its path relative to O(path), its size and its
    sha256. The manifest is written only when its content changes (no timestamp inside), atomically
    (temporary file and rename), mode 0644.
  - C(state=verify) compares O(path) with an existing manifest and returns the files that are missing,
    extra (present but not listed) and mismatched (size or sha256). The task fails when they differ,
    unless O(fail_on_mismatch=false). Files whose size already differs are not hashed.
  - Files are hashed in parallel threads (one file per thread, O(workers) at a time), read in large
    blocks (O(block_size)). A cache beside the manifest remembers each file's sha256 with its size,
    mtime (ns), inode and device; a file whose four values are unchanged is not read again, so an
    unchanged directory verifies with one C(stat) per file, well under a second for a 15 GB model.
    rsync writes a changed file to a new inode, so synced files are always hashed again. The key does not
    hold the directory's path, so the cache stays valid when the directory is renamed (staging to version
    directory) and gives nothing for another directory (other inodes).
  - Only plain files are allowed; a symlink or a special file anywhere under O(path) is an error naming it.
    The manifest and its cache are left out of the listing when they live inside O(path).
  - Standard library only; runs under the node's system Python.
version_added: "0.1.0"
author: "A100 LLM platform team"
extends_documentation_fragment:
  - llm_platform
options:
  path:
    description: The model directory, for example C(/models/qwen2-7b-instruct/2024-06-01).
    type: path
    required: true
  manifest:
    description:
      - The manifest file to write (C(generate)) or to read (C(verify)).
      - Its directory must exist. The cache is kept in the same directory (see O(cache)).
    type: path
    required: true
  state:
    description:
      - C(generate) writes the manifest of O(path); C(verify) checks O(path) against it.
    type: str
    choices: [generate, verify]
    default: verify
  cache:
    description:
      - Use and update the hash cache. Turn off to force every file to be read and hashed again.
    type: bool
    default: true
  cache_path:
    description:
      - Where the cache lives. Default C(<manifest directory>/.<manifest file name>.cache).
      - The cache holds no secret; it is written 0600 and only in a run that is not in check mode.
    type: path
  workers:
    description:
      - How many files are hashed at the same time. C(0) means one per CPU core available to the task.
      - A single file is always hashed by one core (SHA-256 is sequential), so a model of N shards uses
        at most N cores.
    type: int
    default: 0
  block_size:
    description: Bytes read per system call while hashing (default 8 MiB).
    type: int
    default: 8388608
  exclude:
    description:
      - Glob patterns (fnmatch, on the path relative to O(path), C(/)-separated) of files left out of the
        manifest and of the comparison, for example C(.rsync-partial/*).
    type: list
    elements: str
    default: []
  fail_on_mismatch:
    description:
      - With C(state=verify), fail the task when the directory does not match the manifest.
      - When false, the task succeeds and RV(matches) says whether it matched.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details: C(generate) computes the manifest and reports whether it would change without writing it;
      no run in check mode writes the cache.
  diff_mode:
    support: full
    details: C(generate) shows the manifest's lines (C(<sha256> <size> <path>)) before and after.
notes:
  - Errors name the file, for example an unreadable shard or a manifest entry without a sha256.
  - The benchmark of the hashing speed is in docs/benchmarks.md (scripts/bench-model-manifest).
seealso:
  - module: model_admission
"""

EXAMPLES = r"""
- name: Write the manifest of a model version on the source node
  model_manifest:
    path: /models/qwen2-7b-instruct/2024-06-01
    manifest: /models/qwen2-7b-instruct/2024-06-01.manifest.json
    state: generate

- name: Verify a received copy before switching current (fails naming the files that differ)
  model_manifest:
    path: /models/qwen2-7b-instruct/2024-06-01
    manifest: /models/qwen2-7b-instruct/2024-06-01.manifest.json
    state: verify

- name: Check without failing, then decide
  model_manifest:
    path: /models/qwen2-7b-instruct/2024-06-01
    manifest: /models/qwen2-7b-instruct/2024-06-01.manifest.json
    fail_on_mismatch: false
  register: model_check

- name: Show what differs
  ansible.builtin.debug:
    msg: >-
      missing {{ model_check.missing }}, extra {{ model_check.extra }},
      mismatched {{ model_check.mismatched | map(attribute='path') | list }}
  when: not model_check.matches
"""

RETURN = r"""
manifest:
  description: Absolute path of the manifest written or read.
  returned: always
  type: str
  sample: /models/qwen2-7b-instruct/2024-06-01.manifest.json
file_count:
  description: Number of files in the directory (C(generate)) or listed by the manifest (C(verify)).
  returned: success
  type: int
  sample: 8
total_size:
  description: Sum of the sizes of those files, in bytes.
  returned: success
  type: int
  sample: 15231272960
matches:
  description: With C(state=verify), whether the directory matches the manifest exactly.
  returned: state=verify
  type: bool
  sample: true
missing:
  description: Files the manifest lists that are not in the directory (relative paths).
  returned: state=verify
  type: list
  elements: str
  sample: [model-00002-of-00004.safetensors]
extra:
  description: Files in the directory that the manifest does not list.
  returned: state=verify
  type: list
  elements: str
  sample: [pytorch_model.bin]
mismatched:
  description: Files present in both whose size or sha256 differ.
  returned: state=verify
  type: list
  elements: dict
  contains:
    path:
      description: Relative path.
      type: str
    reason:
      description: C(size) (not hashed) or C(sha256).
      type: str
    expected_size:
      description: Size in the manifest.
      type: int
    actual_size:
      description: Size on disk.
      type: int
    expected_sha256:
      description: sha256 in the manifest.
      type: str
    actual_sha256:
      description: sha256 on disk; null when the size already differed.
      type: str
  sample: [{path: model-00001-of-00004.safetensors, reason: sha256, expected_size: 3945, actual_size: 3945,
            expected_sha256: "9f86...", actual_sha256: "60303..."}]
stats:
  description: What the hashing cost.
  returned: success
  type: dict
  contains:
    files:
      description: Files considered for hashing.
      type: int
    hashed_files:
      description: Files read and hashed in this run.
      type: int
    hashed_bytes:
      description: Bytes read and hashed in this run.
      type: int
    cache_hits:
      description: Files whose sha256 came from the cache.
      type: int
    seconds:
      description: Wall time of listing and hashing.
      type: float
  sample: {files: 8, hashed_files: 0, hashed_bytes: 0, cache_hits: 8, seconds: 0.002}
msg:
  description: One line saying what happened, or what differs.
  returned: always
  type: str
  sample: "/models/qwen2-7b-instruct/2024-06-01 matches its manifest (8 files, 8 from the cache)"
"""

import json
import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.model_manifest_core import (
    ManifestError,
    atomic_write,
    build_manifest,
    default_cache_path,
    dump_manifest,
    hash_tree,
    read_manifest,
    scan_tree,
    verify_tree,
)


def _manifest_lines(manifest: dict[str, Any] | None) -> str:
    if not manifest:
        return ""
    return "".join(f"{f['sha256']} {f['size']} {f['path']}\n" for f in manifest.get("files", []))


def _read_existing(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"unreadable": True}
    return data if isinstance(data, dict) else {"unreadable": True}


def generate(module: AnsibleModule, root: str, manifest_path: str, cache_path: str | None) -> dict[str, Any]:
    p = module.params
    files = scan_tree(root, p["exclude"], skip=[manifest_path, *([cache_path] if cache_path else [])])
    digests, stats = hash_tree(
        root,
        files,
        workers=p["workers"],
        block_size=p["block_size"],
        cache_path=cache_path,
        write_cache=not module.check_mode,
    )
    manifest = build_manifest(files, digests)
    existing = _read_existing(manifest_path)
    changed = existing != manifest
    if changed and not module.check_mode:
        atomic_write(manifest_path, dump_manifest(manifest), 0o644)
    result: dict[str, Any] = {
        "changed": changed,
        "file_count": manifest["file_count"],
        "total_size": manifest["total_size"],
        "stats": stats.as_dict(),
        "msg": (
            f"{'wrote' if changed else 'unchanged:'} the manifest of {root} ({manifest['file_count']} files, "
            f"{stats.hashed_files} hashed, {stats.cache_hits} from the cache)"
        ),
    }
    if module._diff:
        result["diff"] = {
            "before_header": manifest_path,
            "after_header": manifest_path,
            "before": _manifest_lines(existing),
            "after": _manifest_lines(manifest),
        }
    return result


def verify(module: AnsibleModule, root: str, manifest_path: str, cache_path: str | None) -> dict[str, Any]:
    p = module.params
    expected = read_manifest(manifest_path)
    outcome, stats = verify_tree(
        root,
        expected,
        exclude=p["exclude"],
        skip=[manifest_path, *([cache_path] if cache_path else [])],
        workers=p["workers"],
        block_size=p["block_size"],
        cache_path=cache_path,
        write_cache=not module.check_mode,
    )
    if outcome.ok:
        msg = (
            f"{root} matches its manifest ({len(expected)} files, {stats.hashed_files} hashed, "
            f"{stats.cache_hits} from the cache)"
        )
    else:
        msg = f"{root} does not match its manifest {manifest_path}: {outcome.summary()}"
    return {
        "changed": False,
        "matches": outcome.ok,
        "missing": outcome.missing,
        "extra": outcome.extra,
        "mismatched": outcome.mismatched,
        "file_count": len(expected),
        "total_size": sum(e.size for e in expected.values()),
        "stats": stats.as_dict(),
        "msg": msg,
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "manifest": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["generate", "verify"], "default": "verify"},
            "cache": {"type": "bool", "default": True},
            "cache_path": {"type": "path"},
            "workers": {"type": "int", "default": 0},
            "block_size": {"type": "int", "default": 8 * 1024 * 1024},
            "exclude": {"type": "list", "elements": "str", "default": []},
            "fail_on_mismatch": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    root = os.path.abspath(p["path"])
    manifest_path = os.path.abspath(p["manifest"])
    if p["workers"] < 0:
        module.fail_json(msg=f"workers must be 0 (one per core) or more, got {p['workers']}")
    if p["block_size"] < 4096:
        module.fail_json(msg=f"block_size must be at least 4096 bytes, got {p['block_size']}")
    if not os.path.isdir(root):
        module.fail_json(msg=f"path: {root} is not a directory", manifest=manifest_path)
    if not os.path.isdir(os.path.dirname(manifest_path)):
        module.fail_json(
            msg=f"manifest: the directory of {manifest_path} does not exist", manifest=manifest_path
        )
    cache_path = None
    if p["cache"]:
        cache_path = (
            os.path.abspath(p["cache_path"]) if p["cache_path"] else default_cache_path(manifest_path)
        )
    try:
        if p["state"] == "generate":
            result = generate(module, root, manifest_path, cache_path)
        else:
            result = verify(module, root, manifest_path, cache_path)
    except ManifestError as exc:
        module.fail_json(msg=str(exc), manifest=manifest_path)
    result["manifest"] = manifest_path
    if p["state"] == "verify" and not result["matches"] and p["fail_on_mismatch"]:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
