"""Model manifests: the list of (relative path, size, sha256) of every file of a model directory.

Shared by the ``model_manifest`` and ``model_admission`` modules, the unit tests and the benchmark
(``scripts/bench-model-manifest``). Standard library only, so it runs under any node Python.

Speed: files are hashed in parallel threads (hashlib's SHA-256 releases the GIL while it hashes a
buffer, so threads scale across cores without the cost of processes), each file read sequentially into
one reused buffer of ``block_size`` bytes with ``readinto`` (no allocation per block). One file is one
task: a SHA-256 cannot be split, so a directory of N files uses at most N cores.

Cache: ``{relative path: [size, mtime_ns, inode, device, sha256]}`` in a JSON file beside the manifest.
A file whose (size, mtime_ns, inode, device) is unchanged is not read again, so re-verifying an unchanged
directory costs one ``stat`` per file, whatever the size of the weights. rsync writes every changed file
to a new inode and sets its mtime, so a synced file is always hashed again.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

MANIFEST_FORMAT = "model-manifest/1"
CACHE_FORMAT = "model-manifest-cache/1"
DEFAULT_BLOCK_SIZE = 8 * 1024 * 1024
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SHA1_RE = re.compile(r"^[0-9a-f]{40}$")


class ManifestError(Exception):
    """A problem with a directory, a manifest or a file; ``str()`` names the file."""


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass
class HashStats:
    files: int = 0
    hashed_files: int = 0
    hashed_bytes: int = 0
    cache_hits: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "hashed_files": self.hashed_files,
            "hashed_bytes": self.hashed_bytes,
            "cache_hits": self.cache_hits,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class VerifyResult:
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    mismatched: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.mismatched)

    def summary(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"missing: {', '.join(self.missing)}")
        if self.extra:
            parts.append(f"extra: {', '.join(self.extra)}")
        if self.mismatched:
            parts.append("mismatched: " + ", ".join(f"{m['path']} ({m['reason']})" for m in self.mismatched))
        return "; ".join(parts) if parts else "matches"


def default_cache_path(manifest_path: str) -> str:
    """The cache lives beside the manifest: ``<dir>/.<manifest name>.cache``."""
    directory, name = os.path.split(os.path.abspath(manifest_path))
    return os.path.join(directory, f".{name}.cache")


def _is_excluded(relpath: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(relpath, pattern) for pattern in patterns)


def scan_tree(root: str, exclude: Iterable[str] = (), skip: Iterable[str] = ()) -> dict[str, os.stat_result]:
    """Every regular file under ``root``: {relative path (``/``-separated): stat}.

    ``exclude``: glob patterns on the relative path. ``skip``: absolute paths left out (the manifest and
    its cache when they live inside ``root``). A symlink or a special file is an error naming it: weights
    must be plain files (a Hugging Face cache snapshot is made of symlinks; download with --local-dir).
    """
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise ManifestError(f"{root}: not a directory")
    patterns = list(exclude)
    skipped = {os.path.abspath(p) for p in skip}
    found: dict[str, os.stat_result] = {}

    def walk(directory: str, prefix: str) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            raise ManifestError(f"{directory}: cannot list: {exc.strerror}") from exc
        for entry in entries:
            relpath = prefix + entry.name
            if entry.path in skipped or _is_excluded(relpath, patterns):
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise ManifestError(f"{entry.path}: is a symlink; a model directory must hold plain files")
            if stat.S_ISDIR(st.st_mode):
                walk(entry.path, relpath + "/")
            elif stat.S_ISREG(st.st_mode):
                found[relpath] = st
            else:
                raise ManifestError(f"{entry.path}: not a regular file")

    walk(root, "")
    return found


def hash_file(path: str, block_size: int = DEFAULT_BLOCK_SIZE) -> str:
    """SHA-256 of one file, read in ``block_size`` blocks into one reused buffer."""
    digest = hashlib.sha256()
    buffer = bytearray(block_size)
    view = memoryview(buffer)
    try:
        with open(path, "rb", buffering=0) as f:
            with contextlib.suppress(AttributeError, OSError):
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while True:
                n = f.readinto(buffer)
                if not n:
                    break
                digest.update(view[:n])
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror}") from exc
    return digest.hexdigest()


def git_blob_sha1(path: str) -> str:
    """The git blob id of a file (what the Hugging Face hub lists for files not stored in LFS)."""
    size = os.path.getsize(path)
    digest = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1024 * 1024), b""):
                digest.update(block)
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror}") from exc
    return digest.hexdigest()


def _cache_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]


def load_cache(cache_path: str, root: str) -> dict[str, list[Any]]:
    """The cache's entries; empty when missing or unreadable.

    An entry is trusted only when the file at that relative path still has the same size, mtime_ns, inode
    and device, so the cache follows a directory renamed within its filesystem (staging -> version
    directory: no second full hash) and gives nothing for another directory (other inodes). ``root`` is
    recorded for the reader; it is not part of the key.
    """
    try:
        with open(cache_path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def save_cache(cache_path: str, root: str, entries: dict[str, list[Any]]) -> None:
    atomic_write(cache_path, json.dumps({"format": CACHE_FORMAT, "root": root, "entries": entries}), 0o600)


def atomic_write(path: str, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    except OSError as exc:
        raise ManifestError(f"{path}: cannot write: {exc.strerror}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ManifestError(f"{path}: cannot write: {exc.strerror}") from exc


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def hash_tree(
    root: str,
    files: dict[str, os.stat_result],
    *,
    workers: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    cache_path: str | None = None,
    write_cache: bool = True,
    only: Callable[[str], bool] | None = None,
) -> tuple[dict[str, str], HashStats]:
    """SHA-256 of ``files`` (from ``scan_tree``), in parallel, through the cache when given.

    ``only``: hash just the relative paths it accepts (the rest are left out of the result).
    """
    started = time.perf_counter()
    root = os.path.abspath(root)
    stats = HashStats()
    cache = load_cache(cache_path, root) if cache_path else {}
    digests: dict[str, str] = {}
    todo: list[str] = []
    for relpath, st in files.items():
        if only is not None and not only(relpath):
            continue
        stats.files += 1
        cached = cache.get(relpath)
        if isinstance(cached, list) and len(cached) == 5 and cached[:4] == _cache_key(st):
            digests[relpath] = cached[4]
            stats.cache_hits += 1
        else:
            todo.append(relpath)
    # Largest first, so that one big file does not start last and leave the other cores idle.
    todo.sort(key=lambda p: files[p].st_size, reverse=True)
    count = workers if workers > 0 else default_workers()
    if todo:
        if count == 1 or len(todo) == 1:
            results = [hash_file(os.path.join(root, p), block_size) for p in todo]
        else:
            with ThreadPoolExecutor(max_workers=min(count, len(todo))) as pool:
                results = list(pool.map(lambda p: hash_file(os.path.join(root, p), block_size), todo))
        for relpath, digest in zip(todo, results, strict=True):
            digests[relpath] = digest
            stats.hashed_files += 1
            stats.hashed_bytes += files[relpath].st_size
    if cache_path and write_cache and (todo or set(cache) != set(digests)):
        entries = {p: [*_cache_key(files[p]), d] for p, d in digests.items()}
        save_cache(cache_path, root, entries)
    stats.seconds = time.perf_counter() - started
    return digests, stats


def build_manifest(files: dict[str, os.stat_result], digests: dict[str, str]) -> dict[str, Any]:
    entries = [FileEntry(p, files[p].st_size, digests[p]) for p in sorted(files)]
    return {
        "format": MANIFEST_FORMAT,
        "algorithm": "sha256",
        "file_count": len(entries),
        "total_size": sum(e.size for e in entries),
        "files": [e.as_dict() for e in entries],
    }


def dump_manifest(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=2, sort_keys=False) + "\n"


def _check_relpath(relpath: Any, where: str) -> str:
    if not isinstance(relpath, str) or not relpath:
        raise ManifestError(f"{where}: path must be a non-empty string")
    parts = relpath.split("/")
    if relpath.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ManifestError(f"{where}: path {relpath!r} must be relative, without '.', '..' or '//'")
    return relpath


def parse_manifest(text: str, source: str) -> dict[str, FileEntry]:
    """Entries of a manifest in our format; errors name ``source`` and the faulty field."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"{source}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{source}: not a model manifest (field 'format' must be {MANIFEST_FORMAT!r})")
    files = data.get("files")
    if not isinstance(files, list):
        raise ManifestError(f"{source}: field 'files' must be a list")
    entries: dict[str, FileEntry] = {}
    for index, item in enumerate(files):
        where = f"{source}: files[{index}]"
        if not isinstance(item, dict):
            raise ManifestError(f"{where}: must be an object with path, size, sha256")
        relpath = _check_relpath(item.get("path"), where)
        size, digest = item.get("size"), item.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"{where} ({relpath}): size must be a non-negative integer")
        if not isinstance(digest, str) or not SHA256_RE.match(digest):
            raise ManifestError(f"{where} ({relpath}): sha256 must be 64 lowercase hex digits")
        if relpath in entries:
            raise ManifestError(f"{where}: {relpath} listed twice")
        entries[relpath] = FileEntry(relpath, size, digest)
    return entries


def read_manifest(path: str) -> dict[str, FileEntry]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the manifest: {exc.strerror}") from exc
    return parse_manifest(text, path)


def compare(
    expected: dict[str, FileEntry], files: dict[str, os.stat_result], digests: dict[str, str]
) -> VerifyResult:
    """Missing, extra and mismatched files; ``digests`` needs only the files present in both."""
    result = VerifyResult()
    result.missing = sorted(set(expected) - set(files))
    result.extra = sorted(set(files) - set(expected))
    for relpath in sorted(set(expected) & set(files)):
        want, size = expected[relpath], files[relpath].st_size
        if size != want.size:
            reason = "size"
        elif digests.get(relpath) != want.sha256:
            reason = "sha256"
        else:
            continue
        result.mismatched.append(
            {
                "path": relpath,
                "reason": reason,
                "expected_size": want.size,
                "actual_size": size,
                "expected_sha256": want.sha256,
                "actual_sha256": digests.get(relpath),
            }
        )
    return result


def verify_tree(
    root: str,
    expected: dict[str, FileEntry],
    *,
    exclude: Iterable[str] = (),
    skip: Iterable[str] = (),
    workers: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    cache_path: str | None = None,
    write_cache: bool = True,
) -> tuple[VerifyResult, HashStats]:
    """Compare ``root`` with ``expected``; files whose size already differs are not hashed."""
    files = scan_tree(root, exclude, skip)

    def worth_hashing(relpath: str) -> bool:
        return relpath in expected and expected[relpath].size == files[relpath].st_size

    digests, stats = hash_tree(
        root,
        files,
        workers=workers,
        block_size=block_size,
        cache_path=cache_path,
        write_cache=write_cache,
        only=worth_hashing,
    )
    return compare(expected, files, digests), stats


# Publisher lists ---------------------------------------------------------------------------------------

PUBLISHER_FORMATS = ("auto", "hf_json", "sha256sum", "model_manifest")


@dataclass(frozen=True)
class PublisherEntry:
    """One file as its publisher lists it: a sha256, or (Hugging Face, files not in LFS) a git blob sha1."""

    path: str
    size: int | None
    sha256: str | None
    git_sha1: str | None


def _hf_entry(item: Any, where: str) -> PublisherEntry | None:
    if not isinstance(item, dict):
        raise ManifestError(f"{where}: must be an object")
    if item.get("type") not in (None, "file"):
        return None  # a directory entry of the tree API
    relpath = _check_relpath(item.get("rfilename", item.get("path")), where)
    lfs = item.get("lfs")
    sha256 = None
    if isinstance(lfs, dict):
        sha256 = lfs.get("sha256", lfs.get("oid"))
        if isinstance(sha256, str) and sha256.startswith("sha256:"):
            sha256 = sha256[len("sha256:") :]
        if not isinstance(sha256, str) or not SHA256_RE.match(sha256):
            raise ManifestError(f"{where} ({relpath}): lfs.sha256 must be 64 lowercase hex digits")
    git_sha1 = item.get("blobId", item.get("oid"))
    if sha256 is None and (not isinstance(git_sha1, str) or not SHA1_RE.match(git_sha1)):
        raise ManifestError(f"{where} ({relpath}): neither lfs.sha256 nor a git blob id (blobId/oid)")
    size = item.get("size")
    if isinstance(lfs, dict) and isinstance(lfs.get("size"), int):
        size = lfs["size"]
    return PublisherEntry(
        relpath,
        size if isinstance(size, int) and not isinstance(size, bool) else None,
        sha256,
        None if sha256 else git_sha1,
    )


def parse_publisher_list(text: str, source: str, form: str = "auto") -> tuple[str, dict[str, PublisherEntry]]:
    """Parse a publisher's file list; returns (the form it was read as, entries by relative path).

    Forms:
      * ``hf_json``: the Hugging Face hub's file metadata, either a model info object with ``siblings``
        (``/api/models/<repo>/revision/<rev>?blobs=true``: ``rfilename``, ``size``, ``lfs.sha256``,
        ``blobId``) or the list of the tree/paths-info API (``path``, ``size``, ``oid``, ``lfs.oid``).
        Files in LFS are checked by sha256; small files kept in git by their git blob sha1.
      * ``sha256sum``: lines ``<sha256>  <path>`` (``*<path>`` for binary mode), as ``sha256sum`` writes.
      * ``model_manifest``: a manifest written by the model_manifest module (shipped beside the weights).
    """
    if form not in PUBLISHER_FORMATS:
        raise ManifestError(f"{source}: unknown publisher list form {form!r}")
    stripped = text.lstrip()
    if form == "auto":
        if stripped.startswith("{") and f'"{MANIFEST_FORMAT}"' in stripped:
            form = "model_manifest"
        elif stripped.startswith(("{", "[")):
            form = "hf_json"
        else:
            form = "sha256sum"
    entries: dict[str, PublisherEntry] = {}
    if form == "model_manifest":
        for relpath, e in parse_manifest(text, source).items():
            entries[relpath] = PublisherEntry(relpath, e.size, e.sha256, None)
        return form, entries
    if form == "sha256sum":
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            match = re.match(r"^([0-9a-fA-F]{64}) [ *](.+)$", line)
            if not match:
                raise ManifestError(f"{source}:{number}: not a sha256sum line ('<sha256>  <path>')")
            relpath = match.group(2)
            relpath = relpath[2:] if relpath.startswith("./") else relpath
            relpath = _check_relpath(relpath, f"{source}:{number}")
            if relpath in entries:
                raise ManifestError(f"{source}:{number}: {relpath} listed twice")
            entries[relpath] = PublisherEntry(relpath, None, match.group(1).lower(), None)
        if not entries:
            raise ManifestError(f"{source}: no sha256sum lines")
        return form, entries
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"{source}: not valid JSON: {exc}") from exc
    items = data.get("siblings") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ManifestError(f"{source}: expected a hub model info object with 'siblings' or a list of files")
    for index, item in enumerate(items):
        entry = _hf_entry(item, f"{source}: [{index}]")
        if entry is not None:
            entries[entry.path] = entry
    return form, entries
