"""The agent's fetcher refuses loopback, link-local and its own addresses, redirect hops included, with a sentence.

Real HTTP servers on 127.0.0.1 (``FlakyHttp``) stand for the services an operator's URL must not reach; each
test checks both the refusal's words and that the refused server saw no request at all.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent import fetch
from llmgw.agent.fetch import guard
from llmgw.core import errors, netpolicy, sources
from llmgw.testing.flakyhttp import FlakyHttp, write_file

COMMIT = "c" * 40


def _ensure(cache: Path, req: fetch.Request, **kw: Any) -> str:
    async def go() -> str:
        f = fetch.Fetcher(cache, retry_base_s=0.01, stall_s=5, max_attempts=2, **kw)
        try:
            return await f.ensure(req)
        finally:
            await f.close()
    return asyncio.run(go())


def test_a_loopback_url_is_refused_by_default_and_nothing_is_requested(tmp_path: Path) -> None:
    """http://127.0.0.1:PORT/... and http://localhost:PORT/...: refused naming fetch_allow_private; no request sent."""
    with FlakyHttp(tmp_path / "srv") as srv:
        write_file(srv.root / "m.gguf", 4096)
        for url in (f"{srv.url}/m.gguf", f"http://localhost:{srv.port}/m.gguf"):
            with pytest.raises(netpolicy.Refused) as refused:
                _ensure(tmp_path / "cache", fetch.Request(source=sources.parse(url)))
            said = str(refused.value)
            assert "is a loopback address" in said and "server-side request forgery" in said, said
            assert f"with {guard.SETTING}" in said
            assert f"allow 127.0.0.1:{srv.port} " in said or f"allow localhost:{srv.port} " in said
        assert srv.seen == []
        # Allowed by the setting, the same URL is fetched.
        got = _ensure(tmp_path / "cache", fetch.Request(source=sources.parse(f"{srv.url}/m.gguf")),
                      policy=guard.policy_of([srv.allowed]))
        assert Path(got).read_bytes() == (srv.root / "m.gguf").read_bytes()


def test_a_link_local_url_is_refused_before_any_connection(tmp_path: Path) -> None:
    """The cloud metadata address (169.254.169.254) and fe80:: are refused with the sentence, never dialled."""
    for url in ("http://169.254.169.254/latest/meta-data/iam/security-credentials/x.gguf",
                "http://[fe80::1]:8080/m.gguf"):
        with pytest.raises(netpolicy.Refused, match="is a link-local address .*169.254.169.254"):
            _ensure(tmp_path / "cache", fetch.Request(source=sources.parse(url)))


def test_a_redirect_to_loopback_is_refused_at_the_hop(tmp_path: Path) -> None:
    """An allowed server answering 302 to another loopback port: the hop is checked, refused, and never reached."""
    with FlakyHttp(tmp_path / "a") as allowed, FlakyHttp(tmp_path / "b") as inner:
        write_file(inner.root / "secret.gguf", 1024)
        allowed.redirects["/m.gguf"] = f"{inner.url}/secret.gguf"
        with pytest.raises(errors.FetchError, match=f"is a loopback address.*allow 127.0.0.1:{inner.port}"):
            _ensure(tmp_path / "cache", fetch.Request(source=sources.parse(f"{allowed.url}/m.gguf")),
                    policy=guard.policy_of([allowed.allowed]))
        assert allowed.count("GET", "/m.gguf") >= 1 and inner.seen == []


def test_the_clusters_hub_is_trusted_but_its_redirects_are_checked(tmp_path: Path) -> None:
    """The hub endpoint the control plane names is fetched from on loopback; its redirect to another one is not."""
    with FlakyHttp(tmp_path / "hub") as hub, FlakyHttp(tmp_path / "elsewhere") as elsewhere:
        hub.json_routes["/api/models/org/r/revision/main"] = {"sha": COMMIT,
                                                             "siblings": [{"rfilename": "m.gguf", "size": 64}]}
        hub.redirects[f"/org/r/resolve/{COMMIT}/m.gguf"] = f"{elsewhere.url}/m.gguf"
        write_file(elsewhere.root / "m.gguf", 64)
        req = fetch.Request(source=sources.parse("hf://org/r"), endpoint=hub.url)
        with pytest.raises(errors.FetchError, match=f"{elsewhere.url}/m.gguf: 127.0.0.1 is a loopback address"):
            _ensure(tmp_path / "cache", req)
        assert hub.count("GET", "/api/models/org/r/revision/main") == 1 and elsewhere.seen == []
        # The API's own redirect (aiohttp follows it) goes through the same check.
        hub.redirects["/api/models/org/r/revision/main"] = f"{elsewhere.url}/api"
        with pytest.raises(errors.FetchError, match="is a loopback address"):
            _ensure(tmp_path / "cache2", req)
        assert elsewhere.seen == []
