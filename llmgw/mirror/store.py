"""The mirror's directory: Hugging Face repos by revision, ``mirror://`` content, and cached file metadata.

Layout (``DIR`` is ``--dir``)::

    DIR/hf/<org>/<repo>/refs/<branch>        the commit sha the branch resolves to (one line)
    DIR/hf/<org>/<repo>/<sha>/<files>        the files of that commit, as the repo has them
    DIR/hf/<org>/<repo>/meta/<sha>.json      each file's size, sha256 and git blob id (computed once)
    DIR/files/<name>/...                     ``mirror://name/...``
    DIR/.partial/                            downloads from the upstream in progress (renamed into place)

A revision copied in by hand (or written by ``llmgw.testing.hfrepo``) is "local": its files are what is on
disk, and their hashes are computed the first time they are asked for and kept in the metadata file, keyed
by size and mtime so an edited file is hashed again. A revision learned from the upstream is "upstream":
its file list is the upstream's, and a file not yet on disk is fetched when first asked for.

Every call here blocks (hashing reads whole files): the app runs them in a worker thread.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from llmgw.mirror import paths

SHA = re.compile(r"[0-9a-f]{40}")
CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One file of a revision."""

    path: str
    size: int
    sha256: str = ""   # "" when unknown: a small file from an upstream that gave only its git blob id
    oid: str = ""      # the git blob id (sha1 of "blob <size>\0" + bytes), or the upstream's

    @property
    def etag(self) -> str:
        return self.sha256 or self.oid

    def to_doc(self, mtime_ns: int = 0) -> dict[str, Any]:
        return {"size": self.size, "sha256": self.sha256, "oid": self.oid, "mtime_ns": mtime_ns}


@dataclasses.dataclass(frozen=True, slots=True)
class Revision:
    repo: str            # "org/name"
    sha: str
    origin: str          # "local" | "upstream"
    files: dict[str, Entry]


def hash_file(path: Path) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file, read once in 1 MiB chunks."""
    sha256 = hashlib.sha256()
    size = os.stat(path).st_size
    git = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha256.update(chunk)
            git.update(chunk)
    return sha256.hexdigest(), git.hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    # A crash mid-write must not leave half a metadata file that the next start reads as the truth.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Store:
    """The mirror's directory, read and written only through here."""

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.realpath(root))
        self.hf = self.root / "hf"
        self.files = self.root / "files"
        self.partial = self.root / ".partial"
        for d in (self.hf, self.files, self.partial):
            d.mkdir(parents=True, exist_ok=True)
        # Downloads a previous run left half done: names only the puller makes, never served, so safe to drop
        # (a restart fetches them again; resuming them is not worth trusting a file no check has passed).
        for leftover in self.partial.iterdir():
            if leftover.is_file() and not leftover.is_symlink():
                leftover.unlink()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_lock = threading.Lock()

    # -- Hugging Face repos --------------------------------------------------------------------------------

    def repo_dir(self, repo: str) -> Path:
        org, _, name = repo.partition("/")
        paths.segment(org, "the organisation")
        paths.segment(name, "the repository")
        return paths.inside(self.hf, f"{org}/{name}", what="repository")

    def sha_for(self, repo: str, rev: str) -> str | None:
        """The commit ``rev`` names here (a branch through ``refs/``, a full sha as itself), or None."""
        top = self.repo_dir(repo)
        if SHA.fullmatch(rev):
            return rev if (top / rev).is_dir() or self._meta_path(top, rev).is_file() else None
        ref = paths.inside(top, f"refs/{paths.segment(rev, 'the revision')}", what="revision")
        try:
            sha = ref.read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return sha if SHA.fullmatch(sha) else None

    def set_ref(self, repo: str, rev: str, sha: str) -> None:
        if SHA.fullmatch(rev):
            return
        top = self.repo_dir(repo)
        _write_atomic(paths.inside(top, f"refs/{paths.segment(rev, 'the revision')}", what="revision"), sha + "\n")

    def snapshot_file(self, repo: str, sha: str, path: str) -> Path:
        return paths.inside(self.repo_dir(repo), f"{sha}/{paths.relative(path)}")

    def _meta_path(self, top: Path, sha: str) -> Path:
        return top / "meta" / f"{sha}.json"

    def _read_meta(self, top: Path, sha: str) -> dict[str, Any]:
        try:
            doc = json.loads(self._meta_path(top, sha).read_text())
        except (FileNotFoundError, ValueError):
            return {"origin": "local", "files": {}}
        return doc if isinstance(doc, dict) and isinstance(doc.get("files"), dict) else {"origin": "local",
                                                                                         "files": {}}

    def _lock(self, repo: str, sha: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault((repo, sha), threading.Lock())

    def revision(self, repo: str, sha: str) -> Revision | None:
        """The revision's files with their hashes (hashing only files new or changed since last time)."""
        if not SHA.fullmatch(sha):
            return None
        top = self.repo_dir(repo)
        # One hasher per revision: a crowd asking at once waits for the first one and reuses its hashes.
        with self._lock(repo, sha):
            meta = self._read_meta(top, sha)
            if meta.get("origin") == "upstream":
                return Revision(repo, sha, "upstream", {p: Entry(p, d["size"], d.get("sha256", ""), d.get("oid", ""))
                                                        for p, d in meta["files"].items()})
            snap = top / sha
            if not snap.is_dir():
                return None
            files: dict[str, Entry] = {}
            docs: dict[str, Any] = {}
            changed = False
            for rel, full in _walk(snap):
                st = os.stat(full)
                old = meta["files"].get(rel)
                same = old and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns
                if same and old.get("sha256"):
                    entry = Entry(rel, st.st_size, old["sha256"], old.get("oid", ""))
                else:
                    sha256, oid = hash_file(full)
                    entry = Entry(rel, st.st_size, sha256, oid)
                    changed = True
                files[rel] = entry
                docs[rel] = entry.to_doc(st.st_mtime_ns)
            if changed or set(docs) != set(meta["files"]):
                _write_atomic(self._meta_path(top, sha), json.dumps({"origin": "local", "files": docs}, indent=1))
            return Revision(repo, sha, "local", files)

    def save_upstream(self, repo: str, sha: str, entries: list[Entry]) -> Revision:
        """Records a revision's file list as the upstream gave it; its files are fetched when asked for."""
        top = self.repo_dir(repo)
        with self._lock(repo, sha):
            meta = self._read_meta(top, sha)
            if meta.get("origin") == "upstream" and meta["files"]:
                files = meta["files"]
            else:
                files = {e.path: e.to_doc() for e in entries}
                _write_atomic(self._meta_path(top, sha), json.dumps({"origin": "upstream", "files": files}, indent=1))
        return Revision(repo, sha, "upstream", {p: Entry(p, d["size"], d.get("sha256", ""), d.get("oid", ""))
                                                for p, d in files.items()})

    def record_sha256(self, repo: str, sha: str, path: str, sha256: str) -> None:
        """After a download: the file's sha256, for a file the upstream listed without one."""
        top = self.repo_dir(repo)
        with self._lock(repo, sha):
            meta = self._read_meta(top, sha)
            doc = meta["files"].get(path)
            if doc is not None and not doc.get("sha256"):
                doc["sha256"] = sha256
                _write_atomic(self._meta_path(top, sha), json.dumps(meta, indent=1))

    # -- mirror:// content ---------------------------------------------------------------------------------

    def mirror_file(self, name: str, path: str) -> Path:
        paths.segment(name, "the mirror name")
        return paths.inside(self.files, f"{name}/{path}" if path else name)

    def mirror_listing(self, name: str, path: str = "") -> list[tuple[str, int]]:
        """(path relative to the name, size) of every file under ``mirror://name[/path]``, sorted."""
        top = self.mirror_file(name, path)
        if top.is_file():
            return [(path, top.stat().st_size)]
        base = self.mirror_file(name, "")
        prefix = os.path.relpath(top, base)
        prefix = "" if prefix == "." else prefix + "/"
        return [(prefix + rel, os.stat(full).st_size) for rel, full in _walk(top)] if top.is_dir() else []


def _walk(top: Path) -> list[tuple[str, Path]]:
    """(relative path, real path) of the regular files under ``top``, skipping links that lead out of it."""
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".partial"))
        for name in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), top).replace(os.sep, "/")
            try:
                full = paths.inside(top, rel)
            except paths.PathRefused:
                continue
            if full.is_file():
                out.append((rel, full))
    return sorted(out)
