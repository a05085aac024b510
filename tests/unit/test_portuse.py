"""The pre-flight port check of `llmgw up`: "in use" means something listens, and it says who."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from llmgw.cli import portuse


def _time_wait_port() -> int:
    """A port with nothing listening on it and a closed connection of ours in TIME_WAIT on it."""
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", 0))
    lst.listen()
    port = lst.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = lst.accept()
    # The side that closes first keeps the TIME_WAIT: here the server's, on the port itself,
    # as after Ctrl-C on a server that had clients.
    conn.close()
    client.recv(1)
    client.close()
    lst.close()
    return port


def _tcp_states(port: int) -> set[str]:
    states = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if int(cols[1].rsplit(":", 1)[1], 16) == port:
                states.add(cols[3])
    return states


def test_a_port_left_in_time_wait_is_free() -> None:
    """A restart at once is allowed: connections in TIME_WAIT do not make a port "in use"."""
    port = _time_wait_port()
    assert "06" in _tcp_states(port), "the test needs a TIME_WAIT socket on the port"  # 06 = TIME_WAIT
    # A plain bind (the old check) is refused here; the check must not be.
    with socket.socket() as plain:
        try:
            plain.bind(("127.0.0.1", port))
            plain_refused = False
        except OSError:
            plain_refused = True
    assert plain_refused, "a plain bind should trip over TIME_WAIT; the premise of this test broke"
    assert portuse.in_use(port) is False


def test_a_listening_port_is_in_use_and_the_listener_is_named() -> None:
    """A port another process listens on is in use, and the refusal names that process's pid."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import socket,sys,time\n"
         "s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\n"
         "print(s.getsockname()[1], flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        assert portuse.in_use(port) is True
        assert f"pid {child.pid} (" in " ".join(portuse.listeners(port))
        message = portuse.refusal(port, "--http-port")
        assert f"port {port} is in use by pid {child.pid}" in message and "--http-port" in message
    finally:
        child.kill()
        child.wait()
    assert portuse.in_use(port) is False


def test_a_wildcard_listener_also_holds_the_loopback_port() -> None:
    """Something listening on 0.0.0.0:P makes 127.0.0.1:P in use too (the server would fail to bind it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        assert portuse.in_use(port) is True
        assert f"pid {os.getpid()} (" in " ".join(portuse.listeners(port))


def test_listeners_reads_nothing_where_proc_has_nothing(tmp_path: Path) -> None:
    """Without a readable /proc the message just says the port is taken (no crash, no guess)."""
    assert portuse.listeners(8080, proc=tmp_path) == []
