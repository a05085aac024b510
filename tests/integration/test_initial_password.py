"""The first administrator's password on a server's first start: printed on a terminal, kept out of a journal.

A service manager (systemd) sends the server's stderr to its journal, which keeps it for good; the password
printed there outlived any change of it. With no terminal the server writes it to a 0600 file in the data
directory, prints only the file's path, and the file goes at the first change of admin's password. Real
``llmgw server`` processes, their stderr a pipe or a pseudo-terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import signal
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx

from llmgw.control import datadir
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW


@contextlib.contextmanager
def first_start(root: Path, *, stderr: int, read_from: int = -1) -> Iterator[tuple[str, bytearray]]:
    """``llmgw server`` on an empty data directory with ``stderr`` (``subprocess.PIPE``, or a terminal's end whose
    other end is ``read_from``): its URL and everything it wrote, read as it comes; stopped by its pid."""
    ports = root / "ports.json"
    proc = subprocess.Popen([*LLMGW, "server", "--data-dir", str(root / "data"), "--ports-file", str(ports),
                             "--http-port", "0", "--agent-port", "0", "--join-port", "0"],
                            stdin=subprocess.DEVNULL, stdout=stderr, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "HOME": str(root / "home")})
    out = bytearray()
    read_end = proc.stdout.fileno() if proc.stdout else read_from

    def drain() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(read_end, 65536):
                out.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        wait_for(lambda: ports.exists() and ports.read_text(), timeout=90, what="the server's ports file")
        yield f"http://127.0.0.1:{json.loads(ports.read_text())['http_port']}", out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def login(url: str, password: str) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/login", json={"username": "admin", "password": password}, timeout=30)


def test_without_a_terminal_the_password_goes_to_a_0600_file_until_it_is_changed(tmp_path: Path) -> None:
    """stderr a pipe: the output names the file, never the password; the file is 0600 and its password logs in;
    resetting admin's password removes it (and the old password no longer works)."""
    with first_start(tmp_path, stderr=subprocess.PIPE) as (url, out):
        file = tmp_path / "data" / datadir.INITIAL_PASSWORD
        wait_for(lambda: b"initial-admin-password" in out, timeout=30, what="the file named in the output")
        password = file.read_text().strip()
        assert stat.S_IMODE(file.stat().st_mode) == 0o600 and len(password) >= 20
        assert password.encode() not in out and f"password: in {file}".encode() in out, out.decode()
        token = login(url, password).json()["token"]
        reset = httpx.put(f"{url}/api/v1/users/admin", json={"reset_password": True}, timeout=30,
                          headers={"authorization": f"Bearer {token}"})
        assert reset.status_code == 200, reset.text
        assert not file.exists()
        assert login(url, password).status_code == 401 and login(url, reset.json()["password"]).status_code == 200
        assert password.encode() not in out


def test_on_a_terminal_the_password_is_printed_and_no_file_is_written(tmp_path: Path) -> None:
    """stderr a terminal (a person ran it): the password is printed once, as before, and no file holds it."""
    master, slave = pty.openpty()
    try:
        with first_start(tmp_path, stderr=slave, read_from=master) as (url, out):
            os.close(slave)
            slave = -1
            wait_for(lambda: b"keep it now" in out, timeout=30, what="the password printed")
            found = re.findall(rb"password \(shown once, not stored; keep it now\): (\S+)", bytes(out))
            assert len(found) == 1, out.decode()
            assert not (tmp_path / "data" / datadir.INITIAL_PASSWORD).exists()
            assert login(url, found[0].decode()).status_code == 200
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
