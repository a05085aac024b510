"""A backup file: a small clear header, then the backup's bytes sealed with AES-256-GCM under a passphrase.

Layout (``HEADER`` bytes, then the chunks)::

    magic "LLMGWBAK" | format 1 | KDF 1 (scrypt) | log2 N | r | p | salt (16) | nonce prefix (7)
    | chunk size (4, big-endian) | key check (16)

The key is scrypt(passphrase, salt, N, r, p), 64 bytes: the first 32 are the AES-256-GCM key, the last 32
only prove the passphrase (``key check`` is the first 16 bytes of their SHA-256), so a wrong passphrase is
told apart from a damaged file before anything is decrypted. The check costs a guesser nothing the first
chunk would not: scrypt is the price of every guess either way.

The bytes are sealed in chunks (``CHUNK`` of plaintext each, 16 bytes of tag added), as age's STREAM does:
chunk ``i``'s nonce is the prefix, ``i`` (4 bytes) and a last-chunk flag (1 byte), and every chunk
authenticates the whole header as associated data. So a database of any size is sealed and opened
without holding it in memory, each chunk is checked before its bytes are used, chunks cannot be
reordered or swapped between files, the header cannot be changed (a weaker N, say), and a file cut
short, even at a chunk's end, is refused: its last chunk was not sealed as the last one.

A file is written 0600 from creation (``os.open`` with the mode, never chmod-ed after), under a temporary
name beside it, and takes its name only once complete (a hard link, which refuses to replace a file
that exists, or with ``force`` a rename): a reader never sees half a backup and an interrupted one
leaves nothing under the name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import struct
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Self

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from llmgw.core.errors import LlmgwError

MAGIC = b"LLMGWBAK"
FORMAT = 1
KDF_SCRYPT = 1
#: scrypt's cost: N = 2**17, r = 8, p = 1 (128 MiB and about a third of a second per try).
LOG_N, R, P = 17, 8, 1
#: What a file may ask of scrypt (a file is not trusted to make a restore allocate gigabytes).
MAX_LOG_N, MAX_R, MAX_P = 20, 16, 4
CHUNK = 1 << 20
_HEAD = struct.Struct(">8sBBBBB16s7sI")
HEADER = _HEAD.size + 16
TAG = 16
#: The shortest passphrase taken: a backup holds the cluster CA's key.
MIN_PASSPHRASE = 8


class BackupRefused(LlmgwError):
    """A backup file that cannot be opened (wrong passphrase, damaged, cut short, not a backup); says which."""


def check_passphrase(passphrase: str) -> None:
    if len(passphrase) < MIN_PASSPHRASE:
        raise LlmgwError(f"the backup passphrase is shorter than {MIN_PASSPHRASE} characters: a backup holds the "
                         "cluster CA's key, so choose a long one (and keep it: without it the backup cannot be "
                         "opened, by anyone)")


def read_passphrase_file(path: Path, flag: str) -> str:
    """A passphrase file's first line, refused when its group or others may read it; LlmgwError naming ``flag``."""
    try:
        mode = path.stat().st_mode
        lines = path.read_text().splitlines()
    except OSError as e:
        raise LlmgwError(f"cannot read {flag} {path}: {e.strerror or e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LlmgwError(f"{flag} {path} may be read by its group or others (mode {stat.S_IMODE(mode):04o}): the "
                         f"passphrase opens every backup and the cluster CA's key in it; `chmod 600 {path}`")
    if not lines or not lines[0].strip():
        raise LlmgwError(f"{flag} {path} is empty: put the backup passphrase on its first line")
    check_passphrase(lines[0])
    return lines[0]


def _keys(passphrase: str, salt: bytes, log_n: int, r: int, p: int) -> tuple[bytes, bytes]:
    derived = Scrypt(salt=salt, length=64, n=1 << log_n, r=r, p=p).derive(passphrase.encode())
    return derived[:32], hashlib.sha256(derived[32:]).digest()[:16]


def _nonce(prefix: bytes, index: int, last: bool) -> bytes:
    if index >= 1 << 32:
        raise LlmgwError("a backup of more than 4 PiB cannot be sealed")
    return prefix + index.to_bytes(4, "big") + (b"\x01" if last else b"\x00")


def is_backup(path: Path) -> bool:
    """Whether ``path`` starts with a backup's magic (what the scheduled retention deletes, and nothing else)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


class SealedWriter:
    """A write-only file object sealing what is written to it; ``close`` (or the ``with``'s end) names the file.

    An exception inside the ``with`` (or ``abort``) removes the temporary file: nothing takes the name.
    """

    def __init__(self, path: Path, passphrase: str, *, force: bool = False, log_n: int = LOG_N) -> None:
        check_passphrase(passphrase)
        self.path, self._force = path, force
        if path.exists() and not force:
            raise LlmgwError(f"{path} exists; nothing was written. Give another file name, or --force to replace it")
        salt, self._prefix = secrets.token_bytes(16), secrets.token_bytes(7)
        key, check = _keys(passphrase, salt, log_n, R, P)
        self._aead = AESGCM(key)
        self._header = _HEAD.pack(MAGIC, FORMAT, KDF_SCRYPT, log_n, R, P, salt, self._prefix, CHUNK) + check
        self._tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        self._f: BinaryIO | None = os.fdopen(fd, "wb")
        self._f.write(self._header)
        self._buf = bytearray()
        self._index = 0
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._f is None:
            raise ValueError("write to a closed backup")
        self._buf += data
        self.size += len(data)
        # Strictly more than a chunk: the last chunk (sealed as the last at close) is never empty unless all is.
        while len(self._buf) > CHUNK:
            self._seal(bytes(self._buf[:CHUNK]), last=False)
            del self._buf[:CHUNK]
        return len(data)

    def _seal(self, plain: bytes, *, last: bool) -> None:
        assert self._f is not None
        self._f.write(self._aead.encrypt(_nonce(self._prefix, self._index, last), plain, self._header))
        self._index += 1

    def close(self) -> None:
        """Seals the last chunk, syncs, and gives the file its name (refusing one that appeared meanwhile)."""
        if self._f is None:
            return
        try:
            self._seal(bytes(self._buf), last=True)
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self._f = None
            if self._force:
                os.replace(self._tmp, self.path)
            else:
                try:
                    os.link(self._tmp, self.path)  # atomic, and never over a file that exists
                except FileExistsError:
                    raise LlmgwError(f"{self.path} appeared while the backup was written; nothing was replaced. "
                                     "Give another file name, or --force") from None
                os.unlink(self._tmp)
        finally:
            self.abort()
        with contextlib.suppress(OSError):  # the name itself durable
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def abort(self) -> None:
        """Removes the temporary file; the name is left as it was."""
        if self._f is not None:
            self._f.close()
            self._f = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.close()
        else:
            self.abort()


class SealedReader:
    """A read-only file object giving a backup's bytes, each chunk checked before it is given.

    Made only when the passphrase is right (``BackupRefused`` otherwise, before any byte is read past the
    header). ``read`` raises ``BackupRefused`` on a damaged or cut-short file; the caller must treat what it
    took so far as nothing until ``read`` returned ``b""`` (the last chunk checked).
    """

    def __init__(self, path: Path, passphrase: str) -> None:
        try:
            self._f: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed by close()
        except OSError as e:
            raise BackupRefused(f"cannot read the backup {path}: {e.strerror or e}") from None
        try:
            self._header = self._f.read(HEADER)
            if len(self._header) < HEADER or not self._header.startswith(MAGIC):
                raise BackupRefused(f"{path} is not an llmgw backup (no backup header): give a file `llmgw backup` "
                                    "wrote")
            _, fmt, kdf, log_n, r, p, salt, self._prefix, chunk = _HEAD.unpack(self._header[:_HEAD.size])
            if fmt != FORMAT or kdf != KDF_SCRYPT:
                raise BackupRefused(f"{path} is a backup of format {fmt} (KDF {kdf}); this llmgw reads format "
                                    f"{FORMAT}: restore it with the llmgw version that wrote it, or a newer one")
            if not (1 <= log_n <= MAX_LOG_N and 1 <= r <= MAX_R and 1 <= p <= MAX_P and 0 < chunk <= 16 * CHUNK):
                raise BackupRefused(f"{path}: its header asks for key derivation or chunk sizes no llmgw writes; "
                                    "the file is damaged or was not written by llmgw")
            key, check = _keys(passphrase, salt, log_n, r, p)
            if not secrets.compare_digest(check, self._header[_HEAD.size:]):
                raise BackupRefused(f"wrong passphrase for {path} (or its header is damaged); nothing was written. "
                                    "Give the passphrase it was made with (LLMGW_BACKUP_PASSPHRASE, "
                                    "--passphrase-file, or at the prompt)")
        except BaseException:
            self._f.close()
            raise
        self.path = path
        self._aead = AESGCM(key)
        self._chunk = chunk
        self._index = 0
        self._buf = b""
        self._pos = 0
        self._done = False
        self._ahead = self._f.read(chunk + TAG)

    def _next(self) -> None:
        sealed, self._ahead = self._ahead, self._f.read(self._chunk + TAG)
        last = not self._ahead
        if len(sealed) < TAG:
            raise BackupRefused(f"{self.path} is cut short (its last part is missing); nothing was written. Copy it "
                                "again from where it was made")
        try:
            self._buf = self._aead.decrypt(_nonce(self._prefix, self._index, last), sealed, self._header)
            self._pos = 0
        except InvalidTag:
            if last:
                raise BackupRefused(f"{self.path} is cut short or damaged at its end; nothing was written. Copy it "
                                    "again from where it was made") from None
            raise BackupRefused(f"{self.path} is damaged (part {self._index + 1} fails its check: changed or "
                                "corrupted); nothing was written. Use another copy") from None
        self._index += 1
        self._done = last

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while n < 0 or len(out) < n:
            left = len(self._buf) - self._pos
            if not left:
                if self._done:
                    break
                self._next()
                continue
            take = left if n < 0 else min(n - len(out), left)
            out += memoryview(self._buf)[self._pos:self._pos + take]  # an offset, not a copy of the rest
            self._pos += take
        return bytes(out)

    @property
    def complete(self) -> bool:
        """Whether the last chunk was read and checked: only then is what was read the whole backup."""
        return self._done and self._pos == len(self._buf)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
