"""`llmgw server --mirror-dir`: the hub settings a mounted mirror fills in, and what the server's app sends it."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from llmgw import serve
from llmgw.control.reconcile import decide
from llmgw.serving import front


def cfg(host: str, *, hub: decide.Hub | None = None, serves_hub: bool = True,
        serves_files: bool = True) -> serve.ServerConfig:
    return serve.ServerConfig(host=host, hub=hub or decide.Hub(), mirror=serve.MirrorConfig(
        dir=Path("/w"), serves_hub=serves_hub, serves_files=serves_files))


def test_own_mirror_is_the_default_for_what_no_flag_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no --hub-endpoint/--mirror-url both point at /mirror; a flag given is kept; a wildcard names the host."""
    hub = front.own_mirror_hub(cfg("127.0.0.1"), 8080)
    assert (hub.endpoint, hub.mirror_url) == ("http://127.0.0.1:8080/mirror",) * 2
    given = decide.Hub(endpoint="https://hub.example", mirror_url="", token="t")
    hub = front.own_mirror_hub(cfg("10.0.0.5", hub=given, serves_hub=False), 9000)
    assert (hub.endpoint, hub.mirror_url, hub.token) == ("https://hub.example", "http://10.0.0.5:9000/mirror", "t")
    # Another node fetching from 127.0.0.1 would ask itself.
    monkeypatch.setattr(socket, "getfqdn", lambda: "ctl.example")
    assert front.own_mirror_hub(cfg("0.0.0.0"), 80).endpoint == "http://ctl.example:80/mirror"
    assert front.own_mirror_hub(cfg("::1"), 80).endpoint == "http://[::1]:80/mirror"


def test_own_mirror_is_https_when_the_port_serves_tls() -> None:
    """Nodes fetch from the URL the port really speaks: https:// with TLS (agents trust the cluster CA for it)."""
    import dataclasses

    from llmgw.serving.config import tls_plan

    tls = dataclasses.replace(cfg("10.0.0.5"), tls=tls_plan(host="10.0.0.5"))
    hub = front.own_mirror_hub(tls, 8080)
    assert (hub.endpoint, hub.mirror_url) == ("https://10.0.0.5:8080/mirror",) * 2
    plain = dataclasses.replace(cfg("10.0.0.5"), tls=tls_plan(host="10.0.0.5", plain_http=True))
    assert front.own_mirror_hub(plain, 8080).endpoint == "http://10.0.0.5:8080/mirror"


def test_plain_http_behind_a_proxy_shows_the_ui_and_rest_https_and_leaves_v1_alone() -> None:
    """--plain-http: the UI/REST see the scheme the browser used at the TLS proxy (Secure cookies); /v1 untouched."""
    seen: list[tuple[str, str]] = []

    def app(name: str) -> Any:
        async def call(scope: dict[str, Any], _receive: Any, _send: Any) -> None:
            seen.append((name, scope["scheme"]))
        return call

    dispatch = front.dispatch(app("router"), app("api"), behind_tls_proxy=True)
    for path in ("/v1/models", "/api/v1/models"):
        asyncio.run(dispatch({"type": "http", "path": path, "scheme": "http", "headers": []}, None, None))
    assert seen == [("router", "http"), ("api", "https")]


def test_dispatch_sends_mirror_paths_to_the_mirror_with_its_root_path() -> None:
    """/mirror and /mirror/... reach the mirror (root_path /mirror); /mirrors, /v1/ and /api/ do not."""
    seen: list[tuple[str, str, str]] = []

    def app(name: str) -> Any:
        async def call(scope: dict[str, Any], _receive: Any, _send: Any) -> None:
            seen.append((name, scope["path"], scope.get("root_path", "")))
        return call

    dispatch = front.dispatch(app("router"), app("api"), mirror=app("mirror"))
    for path in ("/mirror/org/m/resolve/main/x", "/mirror", "/mirrors", "/v1/models", "/api/v1/weights"):
        asyncio.run(dispatch({"type": "http", "path": path, "root_path": ""}, None, None))
    assert seen == [("mirror", "/mirror/org/m/resolve/main/x", "/mirror"), ("mirror", "/mirror", "/mirror"),
                    ("api", "/mirrors", ""), ("router", "/v1/models", ""), ("api", "/api/v1/weights", "")]
    seen.clear()
    asyncio.run(front.dispatch(app("router"), app("api"))({"type": "http", "path": "/mirror/x"}, None, None))
    assert seen == [("api", "/mirror/x", "")]
