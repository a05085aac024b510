"""The control plane's data directory and ``llmgw init``: owner-only, made once, never overwritten.

Layout: ``DIR`` (0700) holds ``llmgw.db`` (0600) and ``pki/`` (0700) with ``ca.crt``, ``ca.key``,
``server.crt`` and ``server.key`` (keys 0600). Initialised means ``pki/`` exists: init builds it as a
temporary directory beside it and renames it into place last, so an init that failed half way leaves
nothing that makes the next one refuse.

The administrator's password is returned to the caller to print once; it is never logged or put in
an exception. Only its argon2id hash reaches the store. One exception to "never written": a server that
initialises its own directory with no terminal to print to (a service manager, whose journal keeps
stderr for good) writes it to ``initial-admin-password`` (0600) here and says only where it is; the
file is removed when admin's password is first changed (``tell_admin_password``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import secrets
import shutil
import tempfile
import time
from typing import TextIO

import argon2
from sqlalchemy.engine import url as sa_url

from llmgw.control.store import store as store_mod
from llmgw.core import pki
from llmgw.core.errors import LlmgwError

log = logging.getLogger(__name__)
PKI = "pki"
DB = "llmgw.db"
ADMIN = "admin"
#: Where a server started without a terminal leaves the first administrator's password (0600).
INITIAL_PASSWORD = "initial-admin-password"


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
    """The control plane's store: ``database`` (``--database``, a PostgreSQL URL) when given, else the one the
    directory remembers (``database_for``), else SQLite here."""
    url = database_for(data_dir, database)
    try:
        return store_mod.Store.open_url(url) if url else store_mod.Store.open(data_dir)
    except store_mod.StoreUnreachable as e:
        if database or not url:
            raise
        raise store_mod.StoreUnreachable(
            f"{e}. The URL is the one {database_file(data_dir)} remembers, which never holds a password: if the "
            "database needs one, give the whole URL in LLMGW_DATABASE or the password in ~/.pgpass (PGPASSFILE), "
            "never on the command line") from None


# -- which database a data directory's cluster uses --------------------------------------------------
# Found by a careless operator: `llmgw token create --data-dir D` without --database on a cluster whose
# store is PostgreSQL made a new SQLite file in D, wrote the token there, exited 0 and printed a join
# command no server would honour. D now says which database it belongs to.

#: In the data directory: the database its cluster's store is, as a URL without its password.
DATABASE_FILE = "database.json"


def database_file(data_dir: pathlib.Path) -> pathlib.Path:
    return data_dir / DATABASE_FILE


def without_password(url: str) -> str:
    """``url`` with any password taken out (the user, host, port and database name kept)."""
    if not url:
        return ""
    parsed = sa_url.make_url(url)
    # _replace, not set(): set(password=None) leaves the password as it was (None there means "unchanged").
    return parsed._replace(password=None).render_as_string(hide_password=False) if parsed.password else url


def remembered_database(data_dir: pathlib.Path) -> str | None:
    """The database ``data_dir`` remembers ("" for SQLite in it), or None when it remembers none."""
    try:
        doc = json.loads(database_file(data_dir).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise LlmgwError(f"{database_file(data_dir)} cannot be read ({e}); it says which database this directory's "
                         "cluster uses: fix it, or move it aside and give --database") from None
    url = doc.get("database") if isinstance(doc, dict) else None
    if not isinstance(url, str):
        raise LlmgwError(f"{database_file(data_dir)} holds no \"database\"; move it aside and give --database")
    return url


def remember_database(data_dir: pathlib.Path, database: str) -> None:
    """Writes which database ``data_dir`` belongs to (0600, without a password), unless it says so already."""
    if database_file(data_dir).exists():
        return
    owner_only_dir(data_dir)
    doc = {"database": without_password(database),
           "about": "the store of the cluster this directory's CA belongs to ('' is SQLite in this directory); "
                    "llmgw commands given this directory open it. Its password, if any, is never written here"}
    with contextlib.suppress(FileExistsError):  # two commands at once: the first one's says the same
        write_private(database_file(data_dir), (json.dumps(doc, indent=1) + "\n").encode())


def _same(a: str, b: str) -> bool:
    return without_password(a) == without_password(b)


def database_for(data_dir: pathlib.Path, given: str) -> str:
    """The database a command on ``data_dir`` opens: ``given`` (--database or LLMGW_DATABASE) or the one the
    directory remembers; "" is SQLite in the directory. LlmgwError when they differ, or when nothing says."""
    remembered = remembered_database(data_dir)
    if given:
        if remembered is not None and not _same(remembered, given):
            raise LlmgwError(f"{data_dir} belongs to the database {remembered or 'in it (SQLite)'} (its "
                             f"{DATABASE_FILE}), not {without_password(given)}: leave --database and LLMGW_DATABASE "
                             f"out to use its own; if its cluster really moved, move {database_file(data_dir)} aside")
        return given
    if remembered is not None:
        return remembered
    if is_initialised(data_dir) and not (data_dir / DB).exists():
        # Initialised before directories remembered their database, and not for SQLite (init makes llmgw.db then).
        raise LlmgwError(f"{data_dir} was initialised for a database it does not name (no {DATABASE_FILE}, no "
                         f"{DB}): give --database URL (or LLMGW_DATABASE, with a password); `llmgw server` on this "
                         f"directory writes {DATABASE_FILE} at its next start")
    return ""


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
        remember_database(data_dir, database)
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


def initial_password_file(data_dir: pathlib.Path) -> pathlib.Path:
    return data_dir / INITIAL_PASSWORD


def tell_admin_password(done: Initialised, out: TextIO) -> None:
    """Tells whoever started the server the first administrator's password, once, without a journal keeping it.

    On a terminal it is printed. Otherwise ``out`` is a pipe or a file (systemd sends it to the journal, which
    keeps it for good and lets the ``adm`` group read it): the password goes to a 0600 file in the data
    directory and only the file's path is printed. ``forget_initial_password`` removes the file when admin's
    password is first changed, so it never outlives the password it holds.
    """
    head = (f"llmgw server: initialised {done.data_dir} (cluster CA {done.ca_hash})\n"
            f"administrator: {ADMIN}\n")
    tail = "log in with `llmgw login`; `llmgw token create` makes a node's join command"
    if not done.admin_password:  # a further control plane of a cluster: its users were kept
        print(head + tail, file=out, flush=True)
        return
    if out.isatty():
        print(f"{head}password (shown once, not stored; keep it now): {done.admin_password}\n{tail}", file=out,
              flush=True)
        return
    path = initial_password_file(done.data_dir)
    path.unlink(missing_ok=True)  # a stale file from a directory moved aside and made again: this one holds it
    write_private(path, (done.admin_password + "\n").encode())
    print(f"{head}password: in {path} (mode 0600, readable only by this server's user; not printed here, as "
          "this output is not a terminal and a service manager keeps it in its journal). Read it, log in, and "
          f"change it with `llmgw user reset-password {ADMIN}`: that removes the file\n{tail}", file=out, flush=True)


def forget_initial_password(path: pathlib.Path | None) -> bool:
    """Removes the first administrator's password file (``tell_admin_password``); whether one was there."""
    if path is None:
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    log.info("removed %s: admin's password was changed, so the one it held no longer works", path)
    return True
