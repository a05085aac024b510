"""The weights already on this node, the model directories' space, and fingerprints to notice change.

Storage differs at every installation, so llmgw observes it rather than owning
it: a Lustre mount, a copy made by hand and a download all look the same from
here, and placement only needs to know that a file is present. A weight is a
``.gguf`` file, or a directory holding ``config.json`` and ``*.safetensors``
(the layout ``vllm serve`` and SGLang take); such a directory is one entry and
is not descended into.

Whether a directory is on a shared filesystem is decided from the mount it is
on: weights there are present on every node that mounts it and belong to no
one of them, so the control plane must neither count them as this node's disk
to free nor delete them.

Each weight carries what its header or config.json says about the model
(layers, heads, context, parameters; ``weightmeta`` reads them without loading
any tensor), so that placement can estimate the memory of a model whose file
states none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil

from llmgw.agent.discovery import weightmeta
from llmgw.agent.discovery.host import nearest_existing
from llmgw.core.inventory import ModelDir, WeightFile

#: Filesystems other nodes see too. Not 9p or virtiofs: those share a directory
#: between one VM and its own host, and no second node sees it.
SHARED_FS = frozenset({
    "nfs", "nfs4", "lustre", "ceph", "cephfs", "fuse.ceph", "fuse.ceph-fuse", "gpfs", "beegfs",
    "glusterfs", "fuse.glusterfs", "cifs", "smb3", "smbfs", "wekafs", "fuse.juicefs", "panfs", "afs",
})
Mounts = Sequence[tuple[str, str]]  # (mount point, filesystem type)


def system_mounts() -> list[tuple[str, str]]:
    """Every mount of this machine, pseudo-filesystems included (``all=True``: NFS and FUSE are "not physical")."""
    return [(p.mountpoint, p.fstype) for p in psutil.disk_partitions(all=True)]


def mount_of(path: str, mounts: Mounts) -> tuple[str, str]:
    """The (mount point, type) ``path`` is on: the longest mount point that is a whole-component prefix."""
    best = ("", "")
    for point, fstype in mounts:
        inside = point == "/" or path == point or path.startswith(point.rstrip("/") + "/")
        # ">=": a later mount over the same point hides the earlier one.
        if inside and len(point) >= len(best[0]):
            best = (point, fstype)
    return best


def model_dirs(dirs: Iterable[Path], *, mounts: Mounts | None = None,
               disk_usage: Callable[[str], Any] = psutil.disk_usage) -> tuple[ModelDir, ...]:
    """Space and filesystem of each directory (its nearest existing parent, so nothing is created)."""
    table = system_mounts() if mounts is None else mounts
    out: list[ModelDir] = []
    for d in dirs:
        # The real path: /models may be a symlink into /lustre, and the link's own
        # filesystem says nothing about where the weights are.
        real = os.path.realpath(nearest_existing(Path(d)))
        try:
            usage = disk_usage(real)
        except OSError:
            # One stale NFS handle must not hide the other directories.
            continue
        fstype = mount_of(real, table)[1]
        out.append(ModelDir(path=str(d), total_bytes=int(usage.total), free_bytes=int(usage.free),
                            shared=fstype in SHARED_FS, fs_type=fstype))
    return tuple(out)


def _size(entry: os.DirEntry[str]) -> int | None:
    try:
        # Following the link: a Hugging Face snapshot is symlinks into blobs/.
        return entry.stat(follow_symlinks=True).st_size
    except OSError:
        return None


def _safetensors_dir(path: Path, files: Sequence[os.DirEntry[str]]) -> WeightFile | None:
    """``path`` as one weight when its files are config.json and *.safetensors; None otherwise."""
    if not (any(e.name == "config.json" for e in files) and any(e.name.endswith(".safetensors") for e in files)):
        return None
    tensors = [e.name for e in files if e.name.endswith(".safetensors")]
    meta = weightmeta.cached(str(path), [str(path / n) for n in ("config.json", *tensors)],
                             lambda: weightmeta.safetensors(path, tensors))
    return WeightFile(path=str(path), size_bytes=sum(_size(e) or 0 for e in files), format="safetensors", **meta)


def _gguf(path: str, size: int) -> WeightFile:
    meta = weightmeta.cached(path, [path], lambda: weightmeta.gguf(path))
    return WeightFile(path=path, size_bytes=size, format="gguf", **meta)


def weight_at(path: str) -> WeightFile | None:
    """The weight at ``path`` (a .gguf file, or a directory of config.json and *.safetensors); None otherwise.

    For the agent's check before a launch: the numbers come from the cache the
    scans fill (keyed by path, size and time), so a weight under a model
    directory is not read again, and one elsewhere costs its headers only.
    """
    where = Path(path)
    try:
        if where.is_dir():
            files = [e for e in os.scandir(where) if not e.name.startswith(".") and e.is_file()]
            return _safetensors_dir(where, files)
        if where.name.endswith(".gguf") and where.is_file():
            return _gguf(str(where), where.stat().st_size)
    except OSError:
        pass  # unreadable or gone: no metadata, and the checks that need it are skipped
    return None


def _walk(path: Path, depth: int, max_depth: int, seen: set[tuple[int, int]], found: dict[str, WeightFile]) -> None:
    try:
        st = path.stat()
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return  # unreadable or gone: skipped, never an exception
    if (st.st_dev, st.st_ino) in seen:
        return  # a symlink loop, or one directory reached by two paths
    seen.add((st.st_dev, st.st_ino))
    files: list[os.DirEntry[str]] = []
    subdirs: list[os.DirEntry[str]] = []
    for e in entries:
        # Dot-directories hold partial downloads (huggingface_hub's .cache/ in a local_dir).
        if e.name.startswith("."):
            continue
        try:
            if e.is_dir():
                subdirs.append(e)
            elif e.is_file():  # a broken link is neither, and is skipped
                files.append(e)
        except OSError:
            continue
    if (weight := _safetensors_dir(path, files)) is not None:
        found[str(path)] = weight
        return
    for e in files:
        if e.name.endswith(".gguf") and (size := _size(e)) is not None:
            found[e.path] = _gguf(e.path, size)
    if depth < max_depth:
        for e in subdirs:
            _walk(Path(e.path), depth + 1, max_depth, seen, found)


def scan_weights(dirs: Iterable[Path], *, max_depth: int = 4) -> tuple[WeightFile, ...]:
    """Every weight under ``dirs`` down to ``max_depth`` levels, sorted by path (so fingerprints are stable)."""
    found: dict[str, WeightFile] = {}
    seen: set[tuple[int, int]] = set()
    for d in dirs:
        _walk(Path(d).absolute(), 0, max_depth, seen, found)
    return tuple(sorted(found.values(), key=lambda w: w.path))


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"": type(value).__name__, **{f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def fingerprint(items: object) -> str:
    """A sha256 of a canonical form of ``items`` (dataclasses, tuples, numbers, strings): equal iff equal data."""
    text = json.dumps(_plain(items), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
