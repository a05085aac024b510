"""A real PostgreSQL server of a test's own: initdb into a temporary directory, a free port on 127.0.0.1.

PostgreSQL refuses to run as root ("root" execution of the PostgreSQL server is not permitted), and CI
runs as root: there initdb and postgres run as the ``postgres`` system user (``runuser``), in a
directory that user owns. Run as anyone else, they run as that user. The server is stopped by its pid
(SIGINT: PostgreSQL's fast shutdown, then SIGKILL to its group) and its directory removed, even when
the test fails.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import psycopg
from psycopg import sql

from llmgw.testing import procs

#: The system user the server runs as when the tests run as root (Debian's package creates it).
SYSTEM_USER = "postgres"
DB = "llmgw"


class PostgresMissing(RuntimeError):
    """No PostgreSQL binaries here; the message says how to install them."""


def bindir() -> Path:
    """The directory holding initdb and postgres: PATH, then ``pg_config --bindir``, then Debian's layout."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out:
            candidates.append(Path(out))
    # Debian puts the server binaries outside PATH; the newest major version first.
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for d in candidates:
        if (d / "initdb").is_file() and (d / "postgres").is_file():
            return d
    raise PostgresMissing("PostgreSQL's initdb and postgres were not found (PATH, pg_config --bindir, "
                          "/usr/lib/postgresql/*/bin): install Debian's `postgresql` package "
                          "(`make test` does when apt can be used)")


class Postgres:
    """One PostgreSQL server: ``with Postgres(tmp) as pg: Store.open_url(pg.url)``."""

    def __init__(self) -> None:
        self.port = 0
        self._user = ""
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._as: list[str] = []
        self._made = 0

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the test database (trust authentication on 127.0.0.1)."""
        return f"postgresql+psycopg://{self._user}@127.0.0.1:{self.port}/{DB}"

    def create_database(self, name: str) -> str:
        """Creates an empty database on this server (one per test, so tests share one server); its URL.

        ``name`` gets a number of this server's own (``name_3``): modules sharing one server (tests/integration's
        session-wide ``pg``) may each count their names from 1."""
        self._made += 1
        name = f"{name}_{self._made}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={self._user} dbname={DB}",
                             autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return f"postgresql+psycopg://{self._user}@127.0.0.1:{self.port}/{name}"

    @property
    def log(self) -> str:
        return (self.dir / "postgres.log").read_text(errors="replace") if self.dir else ""

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        bins = bindir()
        # Under the system temp directory (1777), which the postgres user can reach; pytest's tmp_path is
        # root's and 0700, and initdb there fails with "could not change directory".
        self.dir = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
        if os.geteuid() == 0:
            user = pwd.getpwnam(SYSTEM_USER)
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", SYSTEM_USER, "--"]
            self._user = SYSTEM_USER
        else:
            self._user = pwd.getpwuid(os.geteuid()).pw_name
        data = self.dir / "data"
        subprocess.run([*self._as, str(bins / "initdb"), "-D", str(data), "-A", "trust", "-U", self._user,
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True)
        self.port = procs.free_port()
        self._launch(bins)
        subprocess.run([*self._as, str(bins / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                        "-U", self._user, DB], check=True, capture_output=True)

    def _launch(self, bins: Path) -> None:
        assert self.dir is not None
        data = self.dir / "data"
        log = open(self.dir / "postgres.log", "ab")  # noqa: SIM115 - handed to the server for its life
        if os.geteuid() == 0:
            os.chown(self.dir / "postgres.log", pwd.getpwnam(SYSTEM_USER).pw_uid, -1)
        # -k: the Unix socket in our directory, not /var/run/postgresql (which may not exist or be writable).
        # fsync off: a test database need not survive a power cut, and it keeps 2 shared cores free.
        self._proc = subprocess.Popen(
            [*self._as, str(bins / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port),
             "-k", str(self.dir), "-c", "fsync=off", "-c", "full_page_writes=off",
             "-c", "synchronous_commit=off"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._wait_ready(bins)

    def restart(self, *, down_s: float = 0.0) -> None:
        """Stops the server (fast shutdown: every connection is cut) and starts it again on the same data
        and port after ``down_s`` seconds, as an operator's restart or a crash-and-recover does."""
        self._shutdown()
        time.sleep(down_s)
        self._launch(bindir())

    def _wait_ready(self, bins: Path, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self._proc.returncode} before accepting connections:\n"
                                   f"{self.log[-4000:]}")
            ok = subprocess.run([str(bins / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                                check=False, capture_output=True)
            if ok.returncode == 0:
                return
            time.sleep(0.1)
        raise TimeoutError(f"postgres did not accept connections within {timeout:.0f}s:\n{self.log[-4000:]}")

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.dir / "data" / "postmaster.pid").read_text().split()[0]) if self.dir else None
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        """Stops the server by its pid (fast shutdown, then SIGKILL to its group) and removes its directory."""
        self._shutdown()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def _shutdown(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            # Under runuser our child is runuser, not postgres: signal the postmaster by the pid it wrote
            # (its first line), so the fast shutdown reaches it whatever runuser does with signals.
            postmaster = self._postmaster_pid()
            if postmaster is None:
                proc.send_signal(signal.SIGINT)
            else:
                os.kill(postmaster, signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc is not None:
            # postgres's own children (checkpointer, walwriter…) share its group: none may outlive it.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
