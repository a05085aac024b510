"""Is a port taken, and by whom: the pre-flight check of ``llmgw up``.

"In use" means something listens on it. The check binds with ``SO_REUSEADDR``,
as the server itself does: without it, Ctrl-C on ``llmgw up`` and an immediate
second ``llmgw up`` was refused for about a minute ("port 8080 is in use")
while nothing listened, because the first run's closed connections sat in
TIME_WAIT and a plain bind counts those. With ``SO_REUSEADDR`` Linux still
refuses the bind while a socket *listens* on the port (on this address or on
the wildcard), which is exactly the case to refuse.

When the kernel tells (``/proc/net/tcp*`` and ``/proc/PID/fd``, readable for our
own processes and for all of them as root), the refusal names the listener,
as ``ss -ltnp`` would: "pid 4242 (python3)". Elsewhere it just says the port is
taken.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

#: The state column of /proc/net/tcp for a listening socket (include/net/tcp_states.h).
_TCP_LISTEN = "0A"


def in_use(port: int, *, host: str = "127.0.0.1") -> bool:
    """True if a socket listens on ``host:port`` (or on the wildcard address with that port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def listeners(port: int, *, proc: Path = Path("/proc")) -> list[str]:
    """Who listens on TCP ``port``: "pid 4242 (python3)" for each process the kernel shows us.

    Empty when nothing listens or when the sockets' owners cannot be read
    (another user's processes, no /proc): a bonus for the message, never needed
    for the decision.
    """
    inodes = _listening_inodes(port, proc)
    if not inodes:
        return []
    found: list[str] = []
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            fds = list((pid_dir / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                found.append(f"pid {pid_dir.name} ({_comm(pid_dir)})")
                break
    return sorted(found, key=lambda s: int(s.split()[1]))


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            cols = line.split()
            if len(cols) < 10 or cols[3] != _TCP_LISTEN:
                continue
            local_port = int(cols[1].rsplit(":", 1)[1], 16)
            if local_port == port:
                inodes.add(cols[9])
    return inodes


def _comm(pid_dir: Path) -> str:
    try:
        return (pid_dir / "comm").read_text().strip() or "?"
    except OSError:
        return "?"


def refusal(port: int, flag: str) -> str:
    """The sentence for a port something listens on: what holds it, when known, and the flag to use instead."""
    who = listeners(port)
    held = f" by {', '.join(who)}" if who else ""
    return f"port {port} is in use{held} (another `llmgw up`?); stop it or pass {flag}"
