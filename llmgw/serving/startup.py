"""``llmgw server``'s first steps before anything listens: the data directory initialised on a first start, the
host it advertises, where agents join, and the agent port's certificate (``serve.run`` calls them)."""

from __future__ import annotations

import socket
import sys

from llmgw.control import datadir
from llmgw.control.agentsvc import join as agentsvc_join
from llmgw.control.http import tokens as tokens_http
from llmgw.control.store import store as store_mod
from llmgw.core import pki
from llmgw.core.errors import LlmgwError
from llmgw.serving.config import ServerConfig


def advertised(cfg: ServerConfig) -> str:
    host = cfg.advertise or (socket.getfqdn() if cfg.host in ("0.0.0.0", "::", "") else cfg.host)
    return f"[{host.strip('[]')}]" if ":" in host else host


def init_if_needed(cfg: ServerConfig) -> None:
    """First start of a secure server: ``llmgw init`` done here, the password printed once to the terminal.

    Printed, not logged: a log line is kept in files and journals, and the password must live only
    on the terminal of whoever started the server (the store keeps its argon2 hash). Without a terminal,
    in a 0600 file of the data directory instead (``datadir.tell_admin_password``).
    """
    if cfg.insecure or datadir.is_initialised(cfg.data_dir):
        return
    wildcard = cfg.host in ("0.0.0.0", "::", "")
    hosts = [socket.getfqdn()] if wildcard else [] if cfg.host == "localhost" else [cfg.host.strip("[]")]
    try:
        done = datadir.init(cfg.data_dir, hosts=hosts, database=cfg.database)
    except (store_mod.StoreUrlRefused, store_mod.StoreUnreachable) as e:
        raise LlmgwError(f"--database: {e}") from None
    # On a terminal, printed; under a service manager (its journal keeps stderr) a 0600 file, named here.
    datadir.tell_admin_password(done, sys.stderr)


def join_point(cfg: ServerConfig, advertised: str, join_port: int) -> tokens_http.JoinPoint | None:
    """Where agents join: the advertised host and the join port this server really listens on (the command
    ``POST /api/v1/tokens`` answers names it; `llmgw token create` printed 8082 whatever the port was)."""
    if cfg.insecure or not join_port:
        return None
    return tokens_http.JoinPoint(f"{advertised}:{join_port}", pki.ca_hash(datadir.read_ca(cfg.data_dir).cert_pem))


def agent_tls(cfg: ServerConfig) -> agentsvc_join.AgentTls | None:
    """The agent service's CA and certificate from the data directory; None with ``--insecure``."""
    if cfg.insecure:
        return None
    pki_dir = cfg.data_dir / datadir.PKI
    try:
        return agentsvc_join.AgentTls(ca=datadir.read_ca(cfg.data_dir),
                                      server_cert_pem=(pki_dir / "server.crt").read_bytes(),
                                      server_key_pem=(pki_dir / "server.key").read_bytes(),
                                      node_cert_validity_s=cfg.node_cert_validity_s)
    except OSError as e:
        raise LlmgwError(f"cannot read the server's certificate in {pki_dir}: {e.strerror or e}; it is made by "
                         "`llmgw init`") from None
