"""tests/lab/images.py: the image inputs' sha256 digests are kept between `labctl up` runs (the Go binaries
took ~1 s to hash on every run), and a kept digest is used only while the file is unchanged: a changed file
is hashed again, an unchanged one is not, a corrupt or missing cache is rebuilt."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

import images


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files the cache really hashed (sha256_file's calls)."""
    calls: list[Path] = []
    real = images.sha256_file

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(images, "sha256_file", counting)
    return calls


@pytest.fixture(autouse=True)
def settled(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file written here has a ctime of now, which no test can set back: outside the racy window's own test,
    files count as settled (the window moved an hour back) and old_file's mtimes order them."""
    if request.node.name != "test_a_file_changed_a_moment_ago_is_not_kept":
        monkeypatch.setattr(images, "RACY_S", -3600.0)


def old_file(path: Path, data: bytes, age_s: float = 60) -> Path:
    """A file written AGE_S ago (its mtime; older than the racy window: its digest may be kept)."""
    path.write_bytes(data)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_an_unchanged_file_is_not_hashed_again(tmp_path: Path, hashed: list[Path]) -> None:
    binary = old_file(tmp_path / "kube-apiserver", b"v1.36.3")
    cache = tmp_path / "state" / "file-hashes.json"
    first = images.FileHashes(cache)
    assert first.digest(binary) == sha(b"v1.36.3")
    first.save()
    assert hashed == [binary]

    again = images.FileHashes(cache)  # the next run, from the file
    assert again.digest(binary) == sha(b"v1.36.3")
    assert hashed == [binary]


@pytest.mark.parametrize("change", ["content and mtime", "same size and mtime, new inode", "size only"])
def test_a_changed_file_is_hashed_again(tmp_path: Path, hashed: list[Path], change: str) -> None:
    binary = old_file(tmp_path / "etcd", b"etcd 3.6.0")
    cache = tmp_path / "file-hashes.json"
    first = images.FileHashes(cache)
    first.digest(binary)
    first.save()
    stat = binary.stat()

    if change == "content and mtime":
        new = b"etcd 3.6.1"
        old_file(binary, new, age_s=30)
    elif change == "same size and mtime, new inode":  # a rebuilt binary renamed into place, time kept
        new = b"etcd 3.6.9"
        replacement = old_file(tmp_path / "etcd.partial", new)
        os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        replacement.replace(binary)
        assert binary.stat().st_mtime_ns == stat.st_mtime_ns and binary.stat().st_size == stat.st_size
    else:  # same mtime (set back), another size
        new = b"etcd 3.6.1 rebuilt"
        binary.write_bytes(new)
        os.utime(binary, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    again = images.FileHashes(cache)
    assert again.digest(binary) == sha(new)
    assert hashed == [binary, binary]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"/x": {"sha256": 1}}', ""])
def test_a_corrupt_cache_is_ignored_and_rebuilt(tmp_path: Path, hashed: list[Path], content: str) -> None:
    binary = old_file(tmp_path / "coredns", b"coredns")
    cache = tmp_path / "file-hashes.json"
    cache.write_text(content)

    hashes = images.FileHashes(cache)
    assert hashes.digest(binary) == sha(b"coredns")
    hashes.save()
    assert hashed == [binary]
    assert images.FileHashes(cache).digest(binary) == sha(b"coredns")  # the rebuilt cache serves it
    assert hashed == [binary]


def test_a_file_changed_a_moment_ago_is_not_kept(tmp_path: Path, hashed: list[Path]) -> None:
    """Its mtime could still be the one a second change within the same clock tick leaves."""
    fresh = tmp_path / "pause"
    fresh.write_bytes(b"pause")
    cache = tmp_path / "file-hashes.json"
    first = images.FileHashes(cache)
    assert first.digest(fresh) == sha(b"pause")
    first.save()
    images.FileHashes(cache).digest(fresh)
    assert hashed == [fresh, fresh]


def test_the_saved_cache_drops_files_gone(tmp_path: Path) -> None:
    kept, gone = old_file(tmp_path / "kept", b"a"), old_file(tmp_path / "gone", b"b")
    cache = tmp_path / "file-hashes.json"
    hashes = images.FileHashes(cache)
    hashes.digest(kept)
    hashes.digest(gone)
    gone.unlink()
    hashes.save()
    assert set(images.FileHashes(cache).entries) == {str(kept.resolve())}
