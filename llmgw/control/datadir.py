"""The control plane's data directory and ``llmgw init``: owner-only, made once, never overwritten.

Layout: ``DIR`` (0700) holds ``llmgw.db`` (0600) and ``pki/`` (0700) with ``ca.crt``, ``ca.key``,
``server.crt`` and ``server.key`` (keys 0600). Initialised means ``pki/`` exists: init builds it as a
temporary directory beside it and renames it into place last, so an init that failed half way leaves
nothing that makes the next one refuse.

The administrator's password is returned to the caller to print once; it is never written, logged
or put in an exception. Only its argon2id hash reaches the store.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import secrets
import shutil
import tempfile
import time

import argon2

from llmgw.control.store import store as store_mod
from llmgw.core import pki
from llmgw.core.errors import LlmgwError

log = logging.getLogger(__name__)
PKI = "pki"
DB = "llmgw.db"
ADMIN = "admin"


@dataclasses.dataclass(frozen=True, slots=True)
class Initialised:
    data_dir: pathlib.Path
    ca_hash: str
    admin_password: str = dataclasses.field(repr=False)  # repr=False: a logged Initialised shows no password


def ca_cert(data_dir: pathlib.Path) -> pathlib.Path:
    return data_dir / PKI / "ca.crt"


def is_initialised(data_dir: pathlib.Path) -> bool:
    return (data_dir / PKI).exists()


def write_private(path: pathlib.Path, data: bytes) -> None:
    """Creates ``path`` 0600 and writes ``data``; refuses to replace a file that exists.

    Created with its mode rather than chmod-ed after: a key written then chmod-ed is world-readable
    for a moment, and O_EXCL means a planted file or symlink is refused, not written through.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def write_public(path: pathlib.Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def owner_only_dir(path: pathlib.Path) -> None:
    """Makes ``path`` (and parents) and sets it 0700 whatever the umask or its mode before."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def open_store(data_dir: pathlib.Path, database: str = "") -> store_mod.Store:
    """The control plane's store: ``database`` (``--database``, a PostgreSQL URL) when given, else SQLite here."""
    return store_mod.Store.open_url(database) if database else store_mod.Store.open(data_dir)


def _read_ca_from(ca_from: pathlib.Path) -> pki.Issued:
    """The cluster CA another control plane made: ``ca.crt`` and ``ca.key`` in ``ca_from`` (its ``pki/``)."""
    try:
        ca = pki.Issued((ca_from / "ca.crt").read_bytes(), (ca_from / "ca.key").read_bytes())
        pki.server_cert(ca, [])  # proves the key signs for the certificate before anything is written
    except OSError as e:
        raise LlmgwError(f"--ca-from {ca_from}: cannot read ca.crt and ca.key there ({e.strerror or e}); copy "
                         "them from the first control plane's data directory (its pki/), keeping ca.key 0600") from None
    except (ValueError, pki.PkiError) as e:
        raise LlmgwError(f"--ca-from {ca_from}: ca.crt and ca.key are not a CA certificate and its key ({e})") from None
    return ca


def init(data_dir: pathlib.Path, *, hosts: list[str], database: str = "",
         ca_from: pathlib.Path | None = None) -> Initialised:
    """Makes the CA, the server's certificate and the ``admin`` user; refuses a directory already initialised.

    The CA and certificates are files in ``data_dir``; the user goes to the store, which is ``database``
    when given (a server on PostgreSQL reads its users there, not from a SQLite file beside the CA).

    Another control plane of a cluster (``ca_from``: the first one's CA, copied over) gets its own server
    certificate from the same CA, so agents trust every control plane alike; the database already has its
    users, which are kept (``admin_password`` is then empty). Without ``ca_from``, a database that already
    has users is refused: a second CA would split the cluster in two that cannot reach each other's agents.
    """
    data_dir = data_dir.resolve()
    if is_initialised(data_dir):
        raise LlmgwError(f"already initialised at {data_dir}; nothing was changed. To start over, stop the server "
                         f"and move {data_dir} aside (its CA signed every node's certificate, so every node must "
                         "join again)")
    owner_only_dir(data_dir)
    db = data_dir / DB
    if not database and not db.exists():
        # An empty file is an empty SQLite database; made 0600 first, SQLite keeps the mode (and gives
        # its -wal and -shm files the same), so the users' hashes are not world-readable.
        write_private(db, b"")
    ca = _read_ca_from(ca_from) if ca_from is not None else pki.create_ca()
    server = pki.server_cert(ca, hosts)
    password = secrets.token_urlsafe(18)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".pki-", dir=data_dir))  # 0700, as mkdtemp makes them
    try:
        write_public(tmp / "ca.crt", ca.cert_pem)
        write_private(tmp / "ca.key", ca.key_pem)
        write_public(tmp / "server.crt", server.cert_pem)
        write_private(tmp / "server.key", server.key_pem)
        store = open_store(data_dir, database)
        try:
            if store.list_users():
                if ca_from is None:
                    raise LlmgwError("this database already belongs to a cluster (it has users). A second control "
                                     "plane must share the cluster's CA: copy ca.crt and ca.key from the first one's "
                                     "data directory (pki/) to this machine and run `llmgw init --data-dir "
                                     f"{data_dir} --database URL --ca-from THAT_DIR`")
                password = ""  # the cluster's users stay as they are
            else:
                store.put_user(store_mod.StoredUser(ADMIN, "admin", argon2.PasswordHasher().hash(password),
                                                    time.time()))
        finally:
            store.close()
        os.rename(tmp, data_dir / PKI)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    digest = pki.ca_hash(ca.cert_pem)
    log.info("initialised %s: cluster CA %s, server certificate for %s, user %s", data_dir, digest,
             ", ".join([*hosts, *pki.LOOPBACK_NAMES]), ADMIN)
    return Initialised(data_dir, digest, password)


def read_ca(data_dir: pathlib.Path) -> pki.Issued:
    """The cluster CA (certificate and key) of an initialised directory."""
    if not is_initialised(data_dir):
        raise LlmgwError(f"{data_dir} is not initialised; run `llmgw init --data-dir {data_dir}` first")
    return pki.Issued((data_dir / PKI / "ca.crt").read_bytes(), (data_dir / PKI / "ca.key").read_bytes())


def server_names(data_dir: pathlib.Path) -> list[str]:
    """The server certificate's SANs, in the order init was given them (loopback names last)."""
    return pki.subject_alt_names((data_dir / PKI / "server.crt").read_bytes())
