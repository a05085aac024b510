"""The backup file's format: sealed and opened again, and every way a file can be wrong refused with a sentence."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from llmgw.control.backup import sealed
from llmgw.core.errors import LlmgwError

PASS = "correct horse battery staple"
#: A cheap scrypt for tests; the header records it, and the reader uses what the header says.
LOG_N = 10


def _write(path: Path, data: bytes, *, passphrase: str = PASS, force: bool = False) -> None:
    with sealed.SealedWriter(path, passphrase, force=force, log_n=LOG_N) as w:
        for i in range(0, len(data), 70_000):  # written in pieces that do not line up with the chunks
            w.write(data[i:i + 70_000])


def _read(path: Path, passphrase: str = PASS) -> bytes:
    with sealed.SealedReader(path, passphrase) as r:
        out = bytearray()
        while piece := r.read(10240):  # as tarfile reads: a record at a time
            out += piece
        assert r.complete
        return bytes(out)


@pytest.mark.parametrize("size", [0, 1, sealed.CHUNK - 1, sealed.CHUNK, sealed.CHUNK + 1, 2 * sealed.CHUNK + 5])
def test_round_trip_at_every_chunk_edge(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    _write(tmp_path / "b", data)
    assert _read(tmp_path / "b") == data
    raw = (tmp_path / "b").read_bytes()
    assert raw.startswith(sealed.MAGIC)
    if size >= 64:
        assert data[:64] not in raw  # sealed, not stored


def test_written_0600_from_creation_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        _write(tmp_path / "b", b"secret")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o600
    assert sealed.is_backup(tmp_path / "b")


def test_an_existing_file_is_never_overwritten_without_force(tmp_path: Path) -> None:
    (tmp_path / "b").write_bytes(b"precious")
    with pytest.raises(LlmgwError, match="exists; nothing was written.*--force"):
        _write(tmp_path / "b", b"new")
    assert (tmp_path / "b").read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no temporary file left
    _write(tmp_path / "b", b"new", force=True)
    assert _read(tmp_path / "b") == b"new"


def test_a_file_appearing_while_writing_is_not_replaced(tmp_path: Path) -> None:
    w = sealed.SealedWriter(tmp_path / "b", PASS, log_n=LOG_N)
    w.write(b"data")
    (tmp_path / "b").write_bytes(b"someone else's")
    with pytest.raises(LlmgwError, match="appeared while the backup was written"):
        w.close()
    assert (tmp_path / "b").read_bytes() == b"someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_a_failure_while_writing_leaves_nothing_under_the_name(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), sealed.SealedWriter(tmp_path / "b", PASS, log_n=LOG_N) as w:
        w.write(b"half")
        raise RuntimeError("the database copy failed")
    assert list(tmp_path.iterdir()) == []


def test_wrong_passphrase_is_told_as_such(tmp_path: Path) -> None:
    _write(tmp_path / "b", b"x" * 100)
    with pytest.raises(sealed.BackupRefused, match="wrong passphrase"):
        sealed.SealedReader(tmp_path / "b", "not the passphrase")


def test_a_short_passphrase_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LlmgwError, match="shorter than 8 characters"):
        sealed.SealedWriter(tmp_path / "b", "short")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cut", ["at a chunk's end", "inside a chunk", "header only", "half the header"])
def test_a_file_cut_short_is_refused(tmp_path: Path, cut: str) -> None:
    data = os.urandom(2 * sealed.CHUNK + 100)
    _write(tmp_path / "b", data)
    raw = (tmp_path / "b").read_bytes()
    keep = {"at a chunk's end": sealed.HEADER + 2 * (sealed.CHUNK + sealed.TAG),
            "inside a chunk": len(raw) - 50, "header only": sealed.HEADER, "half the header": 20}[cut]
    (tmp_path / "b").write_bytes(raw[:keep])
    with pytest.raises(sealed.BackupRefused, match="cut short|not an llmgw backup"):
        _read(tmp_path / "b")


def test_a_changed_byte_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "b", os.urandom(2 * sealed.CHUNK + 100))
    raw = bytearray((tmp_path / "b").read_bytes())
    raw[sealed.HEADER + sealed.CHUNK + sealed.TAG + 7] ^= 1  # in the second chunk
    (tmp_path / "b").write_bytes(bytes(raw))
    with pytest.raises(sealed.BackupRefused, match="damaged \\(part 2"):
        _read(tmp_path / "b")


def test_chunks_swapped_or_bytes_appended_are_refused(tmp_path: Path) -> None:
    _write(tmp_path / "b", os.urandom(3 * sealed.CHUNK))
    raw = (tmp_path / "b").read_bytes()
    h, c = sealed.HEADER, sealed.CHUNK + sealed.TAG
    (tmp_path / "swapped").write_bytes(raw[:h] + raw[h + c:h + 2 * c] + raw[h:h + c] + raw[h + 2 * c:])
    with pytest.raises(sealed.BackupRefused, match="damaged"):
        _read(tmp_path / "swapped")
    (tmp_path / "longer").write_bytes(raw + b"\0" * 40)
    with pytest.raises(sealed.BackupRefused):
        _read(tmp_path / "longer")


def test_a_changed_header_is_refused(tmp_path: Path) -> None:
    """The header is every chunk's associated data: a weaker KDF or another salt written in it is caught."""
    _write(tmp_path / "b", b"data")
    raw = bytearray((tmp_path / "b").read_bytes())
    raw[11] = LOG_N - 1  # log2 N
    (tmp_path / "b").write_bytes(bytes(raw))
    with pytest.raises(sealed.BackupRefused, match="wrong passphrase"):
        _read(tmp_path / "b")
    raw[11] = 40  # a restore asked to spend 2**40 * 1 KiB of memory
    (tmp_path / "b").write_bytes(bytes(raw))
    with pytest.raises(sealed.BackupRefused, match="no llmgw writes"):
        _read(tmp_path / "b")


def test_not_a_backup(tmp_path: Path) -> None:
    (tmp_path / "b").write_bytes(b"SQLite format 3\0" + b"\0" * 100)
    with pytest.raises(sealed.BackupRefused, match="not an llmgw backup"):
        _read(tmp_path / "b")
    assert not sealed.is_backup(tmp_path / "b")
