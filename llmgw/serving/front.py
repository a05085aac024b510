"""``llmgw server``'s HTTP front: one listener for the OpenAI API, the REST API, the admin UI and the mirror.

:func:`dispatch` sends each request by its path: ``/v1/`` to the router (``/v1/files`` and ``/v1/batches`` to the
control plane's batches), ``/ui`` to the admin UI, ``/mirror`` to the mounted weights mirror, the rest to the
REST API (a browser opening ``/`` is sent to
the UI). Also the listening socket, the loopback URL the in-process router reaches the REST API by,
and the hub settings that name this server's own mirror.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.api.batches import openai_path
from llmgw.control.auth import Auth, principals
from llmgw.control.reconcile import decide
from llmgw.control.ui import app as ui_app
from llmgw.control.ui.callbackurl import CallbackUrls
from llmgw.core.errors import LlmgwError
from llmgw.router.app import RouterApp
from llmgw.serving.config import ServerConfig

log = logging.getLogger("llmgw.serve")

#: Where the mounted mirror answers on the server's HTTP port.
MIRROR_PREFIX = "/mirror"
#: Where the admin web UI answers (``llmgw.control.ui``).
UI_PREFIX = "/ui"


def dispatch(router: RouterApp, api: Any, *, mirror: Any = None, behind_tls_proxy: bool = False,
             callback_urls: CallbackUrls = CallbackUrls(), batches: Any = None) -> Any:
    """The front app. ``behind_tls_proxy`` (``--plain-http``): the UI and REST API see the scheme ``https``, the
    one the browser used to reach the TLS-terminating proxy, so the session cookie is ``Secure`` there too.
    ``callback_urls``: where the provider may send a browser back after single sign-on (``CallbackUrls``)."""
    # The admin UI reads everything through ``api`` in-process, with the browser's own credential.
    ui = ui_app.create_ui(api, callback_urls=callback_urls)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path.startswith("/v1/"):
            await (batches if batches is not None and openai_path(path) else router)(scope, receive, send)
            return
        if behind_tls_proxy and scope["type"] == "http":
            scope = {**scope, "scheme": "https"}
        if path == UI_PREFIX or path.startswith(UI_PREFIX + "/"):
            await ui({**scope, "root_path": scope.get("root_path", "") + UI_PREFIX}, receive, send)
        elif path == "/" and any(k == b"accept" and b"text/html" in v for k, v in scope.get("headers", ())):
            # A browser opening the server's address lands on the UI; API clients keep what they had.
            await send({"type": "http.response.start", "status": 303, "headers": [(b"location", UI_PREFIX.encode()
                                                                                   + b"/"), (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
        elif mirror is not None and (path == MIRROR_PREFIX or path.startswith(MIRROR_PREFIX + "/")):
            # As starlette's Mount does: the mirror's routes match the path past root_path.
            await mirror({**scope, "root_path": scope.get("root_path", "") + MIRROR_PREFIX}, receive, send)
        else:
            await api(scope, receive, send)

    return app


def admin_check(auth: Auth) -> Callable[[str], Awaitable[bool]]:
    """Whether a bearer token is an admin's of this control plane: the mounted mirror's /admin/stats asks it."""
    async def is_admin(token: str) -> bool:
        if auth.is_insecure:
            return True   # as every REST call is, in loopback development
        found = await auth.principal(token) if token else None
        return found is not None and found.role == principals.ADMIN
    return is_admin


def callback_urls(cfg: ServerConfig, http_port: int) -> CallbackUrls:
    """The UI's SSO callback address rule (``control.ui.callbackurl``): ``--sso-redirect-url``, else a browser's
    own address when its host is one of this server's names (``--host``, ``--advertise-address``, ``--tls-san``,
    the FQDN)."""
    names = (cfg.host, cfg.advertise, *cfg.tls.sans, socket.getfqdn(), socket.gethostname())
    return CallbackUrls.of(redirect_url=cfg.sso_redirect_url, names=names, port=http_port)


def listen(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """The HTTP port's listening socket; ``reuse_port``: with SO_REUSEPORT, so the server's router workers
    (``serving.routerworkers``) accept on the same port (never otherwise: a second server started on the port
    by mistake must fail, not share it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise LlmgwError(f"cannot listen on {host}:{port}: {e.strerror}; "
                         "pass --http-port to use another port") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def own_mirror_hub(cfg: ServerConfig, http_port: int) -> decide.Hub:
    """The hub settings with this server's ``/mirror`` for what no flag named; nodes must reach the URL.

    On a wildcard address the URL names this host (its FQDN): a loopback URL would send every other
    node's fetch to itself.
    """
    assert cfg.mirror is not None
    host = socket.getfqdn() if cfg.host in ("0.0.0.0", "::", "") else cfg.host
    # https:// when the port serves TLS: agents trust the cluster CA for it.
    scheme = cfg.tls.scheme
    own = (f"{scheme}://[{host}]:{http_port}" if ":" in host else f"{scheme}://{host}:{http_port}") + MIRROR_PREFIX
    hub = dataclasses.replace(cfg.hub, endpoint=own if cfg.mirror.serves_hub else cfg.hub.endpoint,
                              mirror_url=own if cfg.mirror.serves_files else cfg.hub.mirror_url)
    log.info("weights mirror of %s at %s%s; remote weights: hf:// from %s%s, mirror:// from %s (--hub-endpoint, "
             "--mirror-url to name another address)", cfg.mirror.dir, own,
             f", pulling through from {cfg.mirror.upstream}" if cfg.mirror.upstream else "", hub.endpoint,
             " with a token" if hub.token else " without a token", hub.mirror_url or "nowhere")
    return hub
