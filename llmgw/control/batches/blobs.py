"""Where a file's bytes are: a file of the data directory (SQLite) or chunk rows of the database (PostgreSQL).

On SQLite one control plane serves the data directory, so the bytes are a file under ``DATA_DIR/files``, mode
0600, named by the file's id (which llmgw draws; never a name from the upload). On PostgreSQL control planes on
several machines share the database and nothing else, so the bytes are rows of ``oai_file_chunks`` (1 MiB each):
every control plane reaches them, a backup of the database carries them, and no shared file system is needed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from llmgw.control.store.batches import BatchStore, StoredFile

DB, DIR = "db", "dir"


def location(directory: Path | None) -> str:
    return DIR if directory is not None else DB


def _path(directory: Path, file_id: str) -> Path:
    if not file_id.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"not a file id: {file_id!r}")
    return directory / file_id


def write(directory: Path, file_id: str, data: bytes) -> None:
    """``data`` into the file's own 0600 file (created anew; the directory 0700)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(_path(directory, file_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def chunks(store: BatchStore, directory: Path | None, f: StoredFile) -> Iterator[bytes]:
    if f.location == DB:
        yield from store.file_chunks(f.id)
        return
    if directory is None:
        raise FileNotFoundError(f"file {f.id} is in a data directory this control plane does not have")
    with open(_path(directory, f.id), "rb") as fh:
        while block := fh.read(1 << 20):
            yield block


def read(store: BatchStore, directory: Path | None, f: StoredFile) -> bytes:
    return b"".join(chunks(store, directory, f))


def remove(directory: Path | None, f: StoredFile) -> None:
    if f.location == DIR and directory is not None:
        try:
            _path(directory, f.id).unlink()
        except FileNotFoundError:
            pass
