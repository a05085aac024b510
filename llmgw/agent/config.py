"""The agent's settings, and the defaults it finds rather than being told.

A file that has to say which machine it is on and at what address differs on
every node, and a copy taken from one node to the next registers the second as
the first; so the node id comes from the hostname and the management address
from the route to the control plane.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from pathlib import Path

from llmgw.core.errors import LlmgwError

log = logging.getLogger(__name__)
DEFAULT_AGENT_PORT = 8081


@dataclasses.dataclass(frozen=True, slots=True)
class AgentConfig:
    servers: tuple[str, ...]
    node_id: str
    mgmt_addr: str
    state_dir: Path
    model_dirs: tuple[Path, ...] = ()
    heartbeat_interval_s: float = 5.0
    reconnect_base_s: float = 0.5
    reconnect_max_s: float = 30.0
    stop_grace_s: float = 10.0
    labels: tuple[tuple[str, str], ...] = ()


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/llmgw/agent")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "llmgw" / "agent"


def normalize_servers(servers: list[str]) -> tuple[str, ...]:
    """HOST:PORT list, defaults filled in, duplicates dropped (a duplicate is tried twice in a row on failover)."""
    out: list[str] = []
    for raw in servers:
        addr = raw.strip()
        if "://" in addr:
            raise LlmgwError(f"--server {raw!r}: give HOST:PORT (the agent port, {DEFAULT_AGENT_PORT} by default), "
                             "not a URL")
        if not addr:
            continue
        host, sep, port = addr.rpartition(":")
        if not sep or not port.isdigit() or not host:
            addr = f"{addr}:{DEFAULT_AGENT_PORT}"
        if addr not in out:
            out.append(addr)
    if not out:
        raise LlmgwError("no control plane address: pass --server HOST:PORT")
    return tuple(out)


def addr_toward(server: str) -> str:
    """This machine's source address on the route to ``server``.

    A UDP "connect" makes the kernel choose the route without sending a packet;
    asking the interfaces instead would have to guess among docker bridges,
    VPNs and link-local addresses.
    """
    host, _, port = server.rpartition(":")
    host = host.strip("[]")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, int(port or DEFAULT_AGENT_PORT)))
            return str(s.getsockname()[0])
    except OSError as e:
        log.warning("cannot find the route to %s (%s); engines will listen on 127.0.0.1", server, e)
        return "127.0.0.1"


def build(*, servers: list[str], node_id: str | None = None, mgmt_addr: str | None = None,
          state_dir: Path | None = None, model_dirs: list[Path] | None = None,
          heartbeat_interval_s: float = 5.0) -> AgentConfig:
    addrs = normalize_servers(servers)
    found_id = node_id or socket.gethostname()
    found_addr = mgmt_addr or addr_toward(addrs[0])
    cfg = AgentConfig(servers=addrs, node_id=found_id, mgmt_addr=found_addr,
                      state_dir=state_dir or default_state_dir(), model_dirs=tuple(model_dirs or ()),
                      heartbeat_interval_s=heartbeat_interval_s)
    log.info("agent: node id %s%s, management address %s%s, control plane %s, state in %s",
             cfg.node_id, "" if node_id else " (hostname)", cfg.mgmt_addr, "" if mgmt_addr else " (route)",
             ", ".join(cfg.servers), cfg.state_dir)
    return cfg
