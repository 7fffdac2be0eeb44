"""The admission gates of a model directory (module model_admission; docs/models.md).

Each gate returns a ``GateResult``: a verdict (passed, failed, skipped) and findings that name the file.
Nothing in the model is executed or loaded as Python objects: safetensors headers are parsed from the
format by hand, pickles are read as opcodes by picklescan, Python files are read as source by bandit.
The third-party tools come in through ``tools`` (imported by the module, respawning into the tools venv
when needed) and subprocesses through ``run``, so tests drive every gate directly.
"""

from __future__ import annotations

import fnmatch
import json
import os
import pickletools
import pwd
import re
import stat
import struct
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ansible.module_utils.model_manifest_core import (
    ManifestError,
    git_blob_sha1,
    hash_tree,
    parse_publisher_list,
    scan_tree,
)

GATES = ("publisher", "safetensors", "pickle", "python", "clamav", "tokenizer", "permissions")

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
ERROR, WARNING, FIXED = "error", "warning", "fixed"

Runner = Callable[[list[str]], tuple[int, str, str]]

# safetensors dtypes and their width in bits (the format's Dtype enum).
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
# The reference implementation refuses headers above 100 MB; a real one is a few hundred KB.
SAFETENSORS_MAX_HEADER = 100 * 1000 * 1000

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib")
# bandit tests that refuse a model: exec, eval, shells (os.system & co.), subprocess.
BANDIT_REFUSED_TESTS = frozenset({"B102", "B307", "B404", "B602", "B603", "B604", "B605", "B606", "B607"})
CLAMAV_DB_SUFFIXES = (
    ".cvd",
    ".cld",
    ".cud",
    ".hdb",
    ".hsb",
    ".hdu",
    ".hsu",
    ".mdb",
    ".msb",
    ".mdu",
    ".msu",
    ".ndb",
    ".ndu",
    ".ldb",
    ".ldu",
    ".idb",
    ".cdb",
    ".crb",
    ".cbc",
    ".pdb",
    ".gdb",
    ".wdb",
    ".yar",
    ".yara",
    ".ign2",
    ".fp",
    ".sfp",
)
CLAMAV_LIMIT_MB = 4000  # clamscan cannot scan a file past 4 GB
TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


class AdmissionError(Exception):
    """The admission cannot run at all (bad directory, unreadable tool output); names what."""


@dataclass
class Finding:
    file: str | None
    message: str
    level: str = ERROR

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "level": self.level, "message": self.message}


@dataclass
class GateResult:
    name: str
    verdict: str = PASSED
    summary: str = ""
    findings: list[Finding] = field(default_factory=list)

    def error(self, file: str | None, message: str) -> None:
        self.findings.append(Finding(file, message, ERROR))

    def warn(self, file: str | None, message: str) -> None:
        self.findings.append(Finding(file, message, WARNING))

    def close(self, summary_ok: str) -> GateResult:
        errors = [f for f in self.findings if f.level == ERROR]
        if self.verdict != SKIPPED:
            self.verdict = FAILED if errors else PASSED
        if not self.summary:
            if errors:
                files = sorted({f.file or "-" for f in errors})
                self.summary = f"{len(errors)} error(s): {', '.join(files)}"
            else:
                self.summary = summary_ok
        return self

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.summary,
            "findings": [f.as_dict() for f in self.findings],
        }


def tools_for(gates: Iterable[str], pickle_policy: str, python_policy: str) -> list[str]:
    """The Python tools the selected gates need (imported, or respawned into the tools venv)."""
    gates = set(gates)
    names = []
    if "tokenizer" in gates:
        names.append("tokenizers")
    if "pickle" in gates and pickle_policy == "scan":
        names.append("picklescan.scanner")
    if "python" in gates and python_policy == "scan":
        names.append("bandit")
    return names


# Gate 1: publisher -------------------------------------------------------------------------------------


def gate_publisher(
    root: str,
    files: dict[str, os.stat_result],
    publisher_manifest: str,
    publisher_format: str = "auto",
    ignore: Iterable[str] = (),
    workers: int = 0,
    cache_path: str | None = None,
    write_cache: bool = True,
) -> GateResult:
    gate = GateResult("publisher")
    patterns = list(ignore)
    try:
        with open(publisher_manifest, encoding="utf-8") as f:
            text = f.read()
        form, listed = parse_publisher_list(text, publisher_manifest, publisher_format)
    except OSError as exc:
        gate.error(publisher_manifest, f"cannot read the publisher's list: {exc.strerror}")
        return gate.close("")
    except ManifestError as exc:
        gate.error(publisher_manifest, str(exc))
        return gate.close("")

    def ignored(relpath: str) -> bool:
        return any(fnmatch.fnmatchcase(relpath, p) for p in patterns)

    for relpath in sorted(set(listed) - set(files)):
        if not ignored(relpath):
            gate.error(relpath, "listed by the publisher, missing here")
    for relpath in sorted(set(files) - set(listed)):
        if not ignored(relpath):
            gate.error(relpath, "present here, not listed by the publisher")
    common = sorted(set(listed) & set(files))
    by_sha256 = set()
    for relpath in common:
        entry = listed[relpath]
        if entry.size is not None and entry.size != files[relpath].st_size:
            gate.error(relpath, f"size {files[relpath].st_size} bytes, the publisher lists {entry.size}")
        elif entry.sha256:
            by_sha256.add(relpath)
        elif entry.git_sha1 and git_blob_sha1(os.path.join(root, relpath)) != entry.git_sha1:
            gate.error(relpath, "git blob id differs from the publisher's (content changed)")
    digests, stats = hash_tree(
        root,
        files,
        workers=workers,
        cache_path=cache_path,
        write_cache=write_cache,
        only=by_sha256.__contains__,
    )
    for relpath in sorted(by_sha256):
        if digests[relpath] != listed[relpath].sha256:
            gate.error(
                relpath, f"sha256 {digests[relpath]} differs from the publisher's {listed[relpath].sha256}"
            )
    return gate.close(
        f"{len(common)} files match the publisher's list ({form}); {stats.hashed_files} hashed, "
        f"{stats.cache_hits} from the cache"
    )


# Gate 2: safetensors ------------------------------------------------------------------------------------


def read_safetensors_header(path: str, size: int) -> tuple[dict[str, Any], int]:
    """(header, data start) of a safetensors file; ValueError with a message on any structural problem."""
    if size < 8:
        raise ValueError(f"{size} bytes: too short for the 8-byte header length")
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > SAFETENSORS_MAX_HEADER:
            raise ValueError(f"header length {length} bytes is beyond the format's 100 MB limit")
        if 8 + length > size:
            raise ValueError(f"header length {length} runs past the end of the file ({size} bytes)")
        raw = f.read(length)
    if not raw.startswith(b"{"):
        raise ValueError("header does not start with '{'")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header, 8 + length


def check_safetensors(path: str, size: int) -> tuple[list[str], list[str]]:
    """(problems, tensor names) of one safetensors file: dtypes, shapes, offsets contiguous, in the file."""
    try:
        header, data_start = read_safetensors_header(path, size)
    except (OSError, ValueError) as exc:
        return [str(exc)], []
    problems: list[str] = []
    metadata = header.pop("__metadata__", None)
    if metadata is not None and (
        not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values())
    ):
        problems.append("__metadata__ must map strings to strings")
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if not isinstance(info, dict):
            problems.append(f"tensor {name!r}: entry is not an object")
            continue
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in SAFETENSORS_DTYPE_BITS:
            problems.append(f"tensor {name!r}: unknown dtype {dtype!r}")
            continue
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            problems.append(f"tensor {name!r}: shape must be a list of non-negative integers")
            continue
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            problems.append(f"tensor {name!r}: data_offsets must be [begin, end] with 0 <= begin <= end")
            continue
        count = 1
        for dim in shape:
            count *= dim
        bits = count * SAFETENSORS_DTYPE_BITS[dtype]
        if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
            problems.append(
                f"tensor {name!r}: {offsets[1] - offsets[0]} bytes of data for shape {shape} of {dtype}"
            )
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    data_size = size - data_start
    position = 0
    for begin, end, name in spans:
        if begin != position:
            problems.append(
                f"tensor {name!r}: data_offsets begin {begin}, expected {position} (not contiguous)"
            )
        position = max(position, end)
    if position > data_size:
        last = spans[-1][2] if spans else "?"
        problems.append(
            f"tensor {last!r}: data_offsets end {position} runs past the end of the file "
            f"({data_size} bytes of data; the file is truncated or the header lies)"
        )
    elif position < data_size:
        problems.append(f"{data_size - position} bytes after the last tensor's data")
    return problems, [name for _, _, name in spans]


def gate_safetensors(root: str, files: dict[str, os.stat_result]) -> GateResult:
    gate = GateResult("safetensors")
    shards = sorted(p for p in files if p.endswith(".safetensors"))
    indexes = sorted(p for p in files if p.endswith(".safetensors.index.json"))
    if not shards:
        gate.error(
            None, "no *.safetensors weights: vLLM is to load safetensors only (convert pickled weights)"
        )
        if not indexes:
            return gate.close("")
    tensors_of: dict[str, set[str]] = {}
    for shard in shards:
        problems, names = check_safetensors(os.path.join(root, shard), files[shard].st_size)
        for problem in problems:
            gate.error(shard, problem)
        tensors_of[shard] = set(names)
    indexed: set[str] = set()
    for index in indexes:
        directory = os.path.dirname(index)
        prefix = directory + "/" if directory else ""
        try:
            with open(os.path.join(root, index), encoding="utf-8") as f:
                data = json.load(f)
        except OSError as exc:
            gate.error(index, f"cannot read: {exc.strerror}")
            continue
        except ValueError as exc:
            gate.error(index, f"not valid JSON: {exc}")
            continue
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            gate.error(index, "field 'weight_map' must map tensor names to shard file names")
            continue
        named = {prefix + v for v in weight_map.values()}
        present = {s for s in shards if os.path.dirname(s) == directory}
        for shard in sorted(named - present):
            gate.error(shard, f"named by {index} but not present")
        for shard in sorted(present - named):
            gate.error(shard, f"present but not named by {index}")
        indexed |= present
        for tensor, shard_name in sorted(weight_map.items()):
            shard = prefix + shard_name
            if shard in tensors_of and tensors_of[shard] and tensor not in tensors_of[shard]:
                gate.error(shard, f"{index} places tensor {tensor!r} in this shard, which lacks it")
        for shard in sorted(named & present):
            unlisted = tensors_of.get(shard, set()) - set(weight_map)
            if unlisted:
                gate.error(shard, f"tensors not in {index}: {', '.join(sorted(unlisted)[:5])}")
    loose = [s for s in shards if s not in indexed]
    by_directory: dict[str, list[str]] = {}
    for shard in loose:
        by_directory.setdefault(os.path.dirname(shard), []).append(shard)
    for directory, group in by_directory.items():
        if len(group) > 1 and not any(os.path.dirname(i) == directory for i in indexes):
            gate.error(
                group[0], f"{len(group)} safetensors files and no *.safetensors.index.json naming them"
            )
    return gate.close(f"{len(shards)} safetensors files parse; offsets contiguous; index matches the shards")


# Gate 3: pickle -----------------------------------------------------------------------------------------


def is_pickle(root: str, relpath: str) -> bool:
    """By suffix, or by a pickle protocol 2-5 header whatever the name (a pickle named .json is still one)."""
    if relpath.lower().endswith(PICKLE_SUFFIXES):
        return True
    if relpath.endswith(".safetensors"):
        return False
    try:
        with open(os.path.join(root, relpath), "rb") as f:
            head = f.read(2)
    except OSError:
        return False
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def _first_pickle_parses(path: str) -> bool:
    """picklescan reports an unparseable stream without globals as clean; we refuse what we cannot parse.

    Zip checkpoints (PyTorch >= 1.6) are parsed by picklescan member by member; this checks raw pickles."""
    try:
        with open(path, "rb") as f:
            if f.read(1) != b"\x80":
                return True
            f.seek(0)
            for _ in pickletools.genops(f):
                pass
    except (OSError, ValueError, EOFError):
        return False
    return True


def gate_pickle(root: str, pickle_files: list[str], policy: str, scanner: ModuleType | None) -> GateResult:
    gate = GateResult("pickle")
    if not pickle_files:
        return gate.close("no pickle-based files")
    if policy == "refuse":
        for relpath in pickle_files:
            gate.error(relpath, "pickle-based file refused (pickle_policy: refuse); ship safetensors instead")
        return gate.close("")
    assert scanner is not None
    for relpath in pickle_files:
        try:
            result = scanner.scan_file_path(os.path.join(root, relpath))
        except Exception as exc:  # a scanner crash must refuse, not pass
            gate.error(relpath, f"picklescan could not scan it: {exc}")
            continue
        if getattr(result, "scan_err", False) or not _first_pickle_parses(os.path.join(root, relpath)):
            gate.error(relpath, "not a well-formed pickle (cannot be parsed, so cannot be vouched for)")
            continue
        for g in result.globals:
            level = getattr(g.safety, "value", str(g.safety))
            if level == "innocuous":
                continue
            what = f"{g.module}.{g.name}"
            if level == "dangerous":
                gate.error(relpath, f"imports {what}: dangerous (code execution when loaded)")
            else:
                gate.error(relpath, f"imports {what}: not known to be innocuous")
    return gate.close(f"{len(pickle_files)} pickle-based files import only innocuous globals")


# Gate 4: python -----------------------------------------------------------------------------------------


def gate_python(root: str, python_files: list[str], policy: str, run: Runner) -> GateResult:
    gate = GateResult("python")
    if not python_files:
        return gate.close("no *.py files")
    if policy == "refuse":
        for relpath in python_files:
            gate.error(relpath, "Python file refused (python_policy: refuse): trust_remote_code would run it")
        return gate.close("")
    paths = [os.path.join(root, p) for p in python_files]
    rc, out, err = run([sys.executable, "-m", "bandit", "--format", "json", "--quiet", *paths])
    try:
        report = json.loads(out)
        results = report["results"]
    except (ValueError, KeyError, TypeError):
        gate.error(None, f"bandit failed (rc {rc}): {(err or out).strip()[-500:]}")
        return gate.close("")
    for item in report.get("errors", []):
        gate.error(_rel(root, item.get("filename", "")), f"bandit could not parse it: {item.get('reason')}")
    for item in results:
        relpath = _rel(root, item.get("filename", ""))
        test_id = item.get("test_id", "")
        message = (
            f"line {item.get('line_number')}: {test_id} {item.get('test_name')}: {item.get('issue_text')} "
            f"(severity {item.get('issue_severity')})"
        )
        if test_id in BANDIT_REFUSED_TESTS:
            gate.error(relpath, message)
        else:
            gate.warn(relpath, message)
    for relpath in python_files:
        gate.warn(relpath, "Python code: runs only with trust_remote_code; review it before enabling that")
    return gate.close(f"{len(python_files)} *.py files, no exec/eval/shell/subprocess found by bandit")


def _rel(root: str, path: str) -> str:
    return os.path.relpath(path, root) if path.startswith(root + os.sep) else path


# Gate 5: clamav -----------------------------------------------------------------------------------------


def gate_clamav(
    root: str, files: dict[str, os.stat_result], database: str, clamscan: str, run: Runner
) -> GateResult:
    gate = GateResult("clamav")
    try:
        databases = [n for n in os.listdir(database) if n.endswith(CLAMAV_DB_SUFFIXES)]
    except OSError as exc:
        gate.error(database, f"ClamAV database directory unusable ({exc.strerror}): no scan is not a pass")
        return gate.close("")
    if not databases:
        gate.error(database, "no ClamAV signature database in this directory: no scan is not a pass")
        return gate.close("")
    if not os.path.isabs(clamscan) or not os.access(clamscan, os.X_OK):
        gate.error(None, f"clamscan not found ({clamscan}): install the Debian package clamav")
        return gate.close("")
    limit = CLAMAV_LIMIT_MB * 1024 * 1024
    for relpath, st in files.items():
        if st.st_size >= limit:
            gate.warn(relpath, f"larger than ClamAV's {CLAMAV_LIMIT_MB} MB limit: not scanned by clamscan")
    argv = [
        clamscan,
        f"--database={database}",
        "--recursive",
        "--infected",
        "--no-summary",
        "--stdout",
        f"--max-filesize={CLAMAV_LIMIT_MB}M",
        f"--max-scansize={CLAMAV_LIMIT_MB}M",
        root,
    ]
    rc, out, err = run(argv)
    found = re.findall(r"^(.*): (\S+) FOUND$", out, flags=re.M)
    for path, signature in found:
        gate.error(_rel(root, path), f"ClamAV signature {signature}")
    if rc not in (0, 1) or (rc == 1 and not found):
        gate.error(None, f"clamscan failed (rc {rc}): {(err or out).strip()[-500:]}")
    return gate.close(f"clamscan found nothing in {len(files)} files ({len(databases)} database files)")


# Gate 6: tokenizer --------------------------------------------------------------------------------------


def gate_tokenizer(
    root: str, files: dict[str, os.stat_result], samples: list[str], tokenizers: ModuleType
) -> GateResult:
    gate = GateResult("tokenizer")
    for name in TOKENIZER_FILES:
        if name not in files:
            gate.error(name, "missing")
            continue
        try:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                data = json.load(f)
        except OSError as exc:
            gate.error(name, f"cannot read: {exc.strerror}")
            continue
        except ValueError as exc:
            gate.error(name, f"not valid JSON: {exc}")
            continue
        if not isinstance(data, dict):
            gate.error(name, "not a JSON object")
        elif name == "config.json" and "model_type" not in data:
            gate.warn(name, "no model_type: vLLM may not pick the architecture")
    if any(f.file == "tokenizer.json" for f in gate.findings):
        return gate.close("")
    try:
        tokenizer = tokenizers.Tokenizer.from_file(os.path.join(root, "tokenizer.json"))
    except Exception as exc:  # the Rust loader raises plain Exception
        gate.error("tokenizer.json", f"the tokenizers package cannot load it: {exc}")
        return gate.close("")
    for sample in samples:
        try:
            ids = tokenizer.encode(sample, add_special_tokens=False).ids
            back = tokenizer.decode(ids, skip_special_tokens=False)
        except Exception as exc:
            gate.error("tokenizer.json", f"encoding {sample!r} failed: {exc}")
            continue
        if back != sample:
            gate.error("tokenizer.json", f"round trip of {sample!r} gave {back!r}")
    return gate.close(f"config and tokenizer parse; {len(samples)} sentences round-trip")


# Gate 7: permissions ------------------------------------------------------------------------------------


def serving_groups(uid: int) -> set[int]:
    """The groups of ``uid`` in the user database; empty when the node has no such user."""
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return set()
    return set(os.getgrouplist(user.pw_name, user.pw_gid))


def _class_bits(file_uid: int, file_gid: int, uid: int, gids: set[int]) -> tuple[int, int]:
    """(read bit, search bit) of the class (owner, group, other) that applies to ``uid``."""
    if file_uid == uid:
        return stat.S_IRUSR, stat.S_IXUSR
    if file_gid in gids:
        return stat.S_IRGRP, stat.S_IXGRP
    return stat.S_IROTH, stat.S_IXOTH


@dataclass
class PermissionFix:
    path: str
    mode_before: int
    mode_after: int
    owner_before: tuple[int, int]
    owner_after: tuple[int, int]

    def line(self, after: bool) -> str:
        mode = self.mode_after if after else self.mode_before
        uid, gid = self.owner_after if after else self.owner_before
        return f"{stat.S_IMODE(mode):04o} {uid}:{gid} {self.path}\n"


def gate_permissions(
    root: str,
    uid: int,
    gids: set[int] | None,
    fix: bool,
    owner: int | None,
    group: int | None,
    check_mode: bool,
) -> tuple[GateResult, list[PermissionFix]]:
    gate = GateResult("permissions")
    groups = serving_groups(uid) if gids is None else set(gids)
    fixes: list[PermissionFix] = []
    # Directories above the model: searchable by the uid, reported only (they belong to other roles).
    parent = os.path.dirname(root)
    while True:
        try:
            st = os.stat(parent)
        except OSError as exc:
            gate.error(parent, f"cannot stat: {exc.strerror}")
            break
        _, search = _class_bits(st.st_uid, st.st_gid, uid, groups)
        if not st.st_mode & search:
            gate.error(
                parent, f"mode {stat.S_IMODE(st.st_mode):04o}: uid {uid} cannot enter it (above the model)"
            )
        if parent == os.path.dirname(parent):
            break
        parent = os.path.dirname(parent)
    entries: list[tuple[str, str]] = [(root, ".")]
    for directory, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames) + sorted(filenames):
            full = os.path.join(directory, name)
            entries.append((full, os.path.relpath(full, root)))
    for full, relpath in entries:
        st = os.lstat(full)
        if stat.S_ISLNK(st.st_mode):
            continue  # the manifest walk refuses symlinks; nothing to chmod through one
        is_dir = stat.S_ISDIR(st.st_mode)
        new_uid = owner if owner is not None else st.st_uid
        new_gid = group if group is not None else st.st_gid
        new_owner = (new_uid, new_gid)
        old_owner = (st.st_uid, st.st_gid)
        read, search = _class_bits(*(new_owner if fix else old_owner), uid, groups)
        needed = read | (search if is_dir else 0)
        missing = needed & ~st.st_mode
        what = "directory" if is_dir else "file"
        if not missing and (not fix or new_owner == old_owner):
            continue
        if not fix:
            gate.error(
                relpath,
                f"{what} mode {stat.S_IMODE(st.st_mode):04o} owner {st.st_uid}:{st.st_gid}: "
                f"uid {uid} cannot {'list/enter' if is_dir else 'read'} it",
            )
            continue
        new_mode = st.st_mode | missing
        fixes.append(PermissionFix(relpath, st.st_mode, new_mode, old_owner, new_owner))
        if not check_mode:
            try:
                if new_owner != old_owner:
                    os.chown(full, new_uid, new_gid)
                if new_mode != st.st_mode:
                    os.chmod(full, stat.S_IMODE(new_mode))
            except OSError as exc:
                gate.error(relpath, f"cannot fix: {exc.strerror} (run with become: true)")
                continue
        changes = []
        if new_mode != st.st_mode:
            changes.append(f"mode {stat.S_IMODE(st.st_mode):04o} -> {stat.S_IMODE(new_mode):04o}")
        if new_owner != old_owner:
            changes.append(f"owner {old_owner[0]}:{old_owner[1]} -> {new_uid}:{new_gid}")
        gate.findings.append(
            Finding(relpath, ("would fix: " if check_mode else "fixed: ") + ", ".join(changes), FIXED)
        )
    return gate.close(
        f"every file readable by uid {uid}" + (f" ({len(fixes)} fixed)" if fixes else "")
    ), fixes


# The whole admission ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    gates: dict[str, GateResult]
    python_files: list[str]
    pickle_files: list[str]
    fixes: list[PermissionFix]
    check_mode: bool

    @property
    def refused_by(self) -> list[str]:
        return [name for name in GATES if self.gates[name].verdict == FAILED]

    @property
    def admitted(self) -> bool:
        return not self.refused_by

    @property
    def changed(self) -> bool:
        return bool(self.fixes)

    @property
    def diff_before(self) -> str:
        return "".join(f.line(after=False) for f in self.fixes)

    @property
    def diff_after(self) -> str:
        return "".join(f.line(after=True) for f in self.fixes)

    def gates_dict(self) -> dict[str, dict[str, Any]]:
        return {name: self.gates[name].as_dict() for name in GATES}

    def message(self, root: str) -> str:
        if self.admitted:
            ran = [n for n in GATES if self.gates[n].verdict == PASSED]
            return f"admitted {root}: passed {', '.join(ran)}"
        parts = []
        for name in self.refused_by:
            errors = [f for f in self.gates[name].findings if f.level == ERROR]
            details = "; ".join(f"{f.file or '-'}: {f.message}" for f in errors[:5])
            more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
            parts.append(f"{name} ({details}{more})")
        return f"refused {root}: " + " | ".join(parts)


@dataclass
class Admission:
    root: str
    gates: list[str]
    tools: dict[str, ModuleType]
    run: Runner
    check_mode: bool = False
    publisher_manifest: str | None = None
    publisher_format: str = "auto"
    publisher_ignore: list[str] = field(default_factory=list)
    pickle_policy: str = "scan"
    python_policy: str = "scan"
    clamav_database: str | None = None
    clamscan: str = "clamscan"
    tokenizer_samples: list[str] = field(default_factory=list)
    serving_uid: int = 1001
    serving_gids: list[int] | None = None
    fix_permissions: bool = False
    owner: int | None = None
    group: int | None = None
    workers: int = 0
    cache_path: str | None = None

    def run_gates(self) -> Outcome:
        skip = [p for p in (self.publisher_manifest, self.cache_path) if p]
        try:
            files = scan_tree(self.root, skip=skip)
        except ManifestError as exc:
            raise AdmissionError(str(exc)) from exc
        pickle_files = [p for p in files if is_pickle(self.root, p)]
        python_files = [p for p in files if p.endswith(".py")]
        results: dict[str, GateResult] = {}
        fixes: list[PermissionFix] = []
        # Permissions first: with fix_permissions the other gates then read what the server will read.
        if "permissions" in self.gates:
            results["permissions"], fixes = gate_permissions(
                self.root,
                self.serving_uid,
                set(self.serving_gids) if self.serving_gids is not None else None,
                self.fix_permissions,
                self.owner,
                self.group,
                self.check_mode,
            )
        if "publisher" in self.gates:
            assert self.publisher_manifest
            results["publisher"] = gate_publisher(
                self.root,
                files,
                self.publisher_manifest,
                self.publisher_format,
                self.publisher_ignore,
                self.workers,
                self.cache_path,
                write_cache=not self.check_mode,
            )
        if "safetensors" in self.gates:
            results["safetensors"] = gate_safetensors(self.root, files)
        if "pickle" in self.gates:
            results["pickle"] = gate_pickle(
                self.root, pickle_files, self.pickle_policy, self.tools.get("picklescan.scanner")
            )
        if "python" in self.gates:
            results["python"] = gate_python(self.root, python_files, self.python_policy, self.run)
        if "clamav" in self.gates:
            assert self.clamav_database
            results["clamav"] = gate_clamav(self.root, files, self.clamav_database, self.clamscan, self.run)
        if "tokenizer" in self.gates:
            results["tokenizer"] = gate_tokenizer(
                self.root, files, self.tokenizer_samples, self.tools["tokenizers"]
            )
        for name in GATES:
            if name not in results:
                results[name] = GateResult(name, SKIPPED, "not selected (option gates)")
        return Outcome(results, python_files, pickle_files, fixes, self.check_mode)
