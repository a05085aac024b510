"""``llmgw mirror``: the app under uvicorn, on 127.0.0.1 unless told otherwise, HTTPS when given a cert."""

from __future__ import annotations

import ipaddress
import logging
import socket
from pathlib import Path

import uvicorn

from llmgw.mirror import app as app_mod

log = logging.getLogger(__name__)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(root: Path, *, host: str = "127.0.0.1", port: int = 8090, upstream: str = "", admin_token: str = "",
        upstream_token: str = "", tls_cert: str = "", tls_key: str = "", log_level: str = "info") -> None:
    """Serves the mirror until SIGINT/SIGTERM."""
    if not _loopback(host) and not tls_cert:
        log.warning("serving %s on %s over plain HTTP: anyone on the network can read the weights and the admin "
                    "token crosses it in clear; pass --tls-cert and --tls-key", root, host)
    if not admin_token:
        log.info("no admin token: POST /admin/add is refused (enable it with --admin-token-file)")
    app = app_mod.build(root, upstream=upstream, admin_token=admin_token, upstream_token=upstream_token)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            ssl_certfile=tls_cert or None, ssl_keyfile=tls_key or None,
                            # The mirror sends weights, not pages: no gzip of safetensors, no ws.
                            ws="none", lifespan="on", timeout_keep_alive=30)
    server = uvicorn.Server(config)
    scheme = "https" if tls_cert else "http"
    log.info("mirror of %s on %s://%s:%d%s (%s)", root, scheme, host, port,
             f", pulling through from {upstream}" if upstream else "", socket.gethostname())
    server.run()
