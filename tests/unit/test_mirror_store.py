"""The mirror's layout: refs, revisions, and file hashes computed once and cached by size and mtime."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from llmgw.mirror import app as app_mod
from llmgw.mirror import paths, store
from llmgw.testing import hfrepo


def test_branch_and_sha_resolve_to_the_written_commit(tmp_path: Path) -> None:
    """refs/main names the commit; a full sha resolves to itself; an unknown revision or repo to None."""
    sha = hfrepo.write_repo(tmp_path, "org/tiny", {"config.json": b"{}"})
    s = store.Store(tmp_path)
    assert s.sha_for("org/tiny", "main") == sha
    assert s.sha_for("org/tiny", sha) == sha
    assert s.sha_for("org/tiny", "dev") is None
    assert s.sha_for("org/other", "main") is None
    assert s.sha_for("org/tiny", "0" * 40) is None
    with pytest.raises(paths.PathRefused):
        s.sha_for("org/tiny", "../../etc")


def test_revision_lists_files_with_sha256_and_git_oid(tmp_path: Path) -> None:
    """Each file's size, sha256 and git blob id are those of its bytes."""
    files = hfrepo.sample_files(seed=5, shard_bytes=1000)
    sha = hfrepo.write_repo(tmp_path, "org/tiny", files)
    rev = store.Store(tmp_path).revision("org/tiny", sha)
    assert rev is not None and rev.origin == "local" and sorted(rev.files) == sorted(files)
    for path, data in files.items():
        e = rev.files[path]
        assert e.size == len(data) and e.sha256 == hashlib.sha256(data).hexdigest()
        assert e.oid == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_hashes_are_cached_until_size_or_mtime_change(tmp_path: Path) -> None:
    """A second listing reuses the cached hash (same size and mtime); a touched file is hashed again."""
    sha = hfrepo.write_repo(tmp_path, "org/tiny", {"w.bin": b"a" * 100})
    s = store.Store(tmp_path)
    first = s.revision("org/tiny", sha)
    assert first is not None
    assert (tmp_path / "hf" / "org" / "tiny" / "meta" / f"{sha}.json").is_file()
    f = tmp_path / "hf" / "org" / "tiny" / sha / "w.bin"
    st = f.stat()
    f.write_bytes(b"b" * 100)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    cached = s.revision("org/tiny", sha)
    assert cached is not None and cached.files["w.bin"].sha256 == first.files["w.bin"].sha256
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    again = s.revision("org/tiny", sha)
    assert again is not None and again.files["w.bin"].sha256 == hashlib.sha256(b"b" * 100).hexdigest()


def test_listing_skips_symlinks_out_of_the_directory(tmp_path: Path) -> None:
    """A symlink in a snapshot that leads outside the mirror's directory is not listed."""
    root = tmp_path / "m"
    sha = hfrepo.write_repo(root, "org/tiny", {"config.json": b"{}"})
    (tmp_path / "secret").write_text("s")
    (root / "hf" / "org" / "tiny" / sha / "leak.json").symlink_to(tmp_path / "secret")
    rev = store.Store(root).revision("org/tiny", sha)
    assert rev is not None and sorted(rev.files) == ["config.json"]


def test_upstream_revision_keeps_the_upstream_list(tmp_path: Path) -> None:
    """A revision learned from the upstream lists the upstream's files before any is on disk."""
    s = store.Store(tmp_path)
    sha = "a" * 40
    s.save_upstream("org/tiny", sha, [store.Entry("w.bin", 10, "f" * 64, "1" * 40)])
    s.set_ref("org/tiny", "main", sha)
    rev = s.revision("org/tiny", s.sha_for("org/tiny", "main") or "")
    assert rev is not None and rev.origin == "upstream" and rev.files["w.bin"].size == 10
    s.record_sha256("org/tiny", sha, "w.bin", "e" * 64)   # already known: unchanged
    doc = json.loads((tmp_path / "hf" / "org" / "tiny" / "meta" / f"{sha}.json").read_text())
    assert doc["files"]["w.bin"]["sha256"] == "f" * 64


@pytest.mark.parametrize(("header", "want"), [
    (None, (0, 100, False)), ("bytes=0-9", (0, 10, True)), ("bytes=90-", (90, 100, True)),
    ("bytes=-5", (95, 100, True)), ("bytes=50-500", (50, 100, True)), ("bytes=100-", None), ("bytes=-0", None),
    ("bytes=0-1,5-6", (0, 100, False)), ("items=0-1", (0, 100, False)), ("bytes=x-y", (0, 100, False)),
])
def test_one_range(header: str | None, want: tuple[int, int, bool] | None) -> None:
    """Single byte ranges (start-end, start-, -suffix) are honoured, past-the-end ones are 416 (None)."""
    assert app_mod._one_range(header, 100) == want
