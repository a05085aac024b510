"""The mirror's two Low items and its upstream's redirects: /admin/stats needs an admin, 404s name no server path,
and a redirect from the upstream to loopback is not followed.

Real ``llmgw mirror`` processes on 127.0.0.1; the one peer that must not be loopback is the app in-process behind
httpx's ASGI transport with a made-up client address (no second host here to send it from).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx

from llmgw.mirror import app as mirror_app
from llmgw.testing import hfrepo, procs
from llmgw.testing.flakyhttp import FlakyHttp, write_file
from llmgw.testing.system import System

REPO = "org/tiny"
SHA = "a" * 40


@contextlib.contextmanager
def mirror(tmp: Path, root: Path, *, upstream: str = "", token: str = "") -> Iterator[str]:
    """A ``llmgw mirror`` process serving ``root``; yields its URL and stops it by its pid whatever happens."""
    port = procs.free_port()
    argv = [sys.executable, "-m", "llmgw", "mirror", "--dir", str(root), "--port", str(port), "--log-level", "warning"]
    env = None
    if upstream:
        argv += ["--upstream", upstream]
    if token:
        (tmp / f"token-{port}").write_text(token)
        argv += ["--admin-token-file", str(tmp / f"token-{port}")]
    url = f"http://127.0.0.1:{port}"
    with procs.Proc.start(argv, env=env, log_path=tmp / f"mirror-{port}.log") as proc:
        proc.wait_http(url + "/healthz", timeout=30)
        yield url


def test_admin_stats_needs_the_admin_token(tmp_path: Path) -> None:
    """With an admin token: no token or a wrong one is 401 with the sentence, the right one answers."""
    with mirror(tmp_path, tmp_path / "m", token="s3cret") as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.get(url + "/admin/stats", headers=headers, trust_env=False)
            assert r.status_code == 401 and "admin token" in r.json()["error"], r.text
        ok = httpx.get(url + "/admin/stats", headers={"Authorization": "Bearer s3cret"}, trust_env=False)
        assert ok.status_code == 200 and ok.json() == {"upstream": None}


def test_admin_stats_without_a_token_answers_only_loopback(tmp_path: Path) -> None:
    """No admin token: a peer on the mirror's own host reads the stats, any other peer is refused with what to do."""
    app = mirror_app.build(tmp_path / "m", upstream="http://127.0.0.1:9")

    async def ask(client: tuple[str, int]) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://mirror") as c:
            return await c.get("/admin/stats")

    async def both() -> tuple[httpx.Response, httpx.Response]:
        try:
            return await ask(("127.0.0.1", 40000)), await ask(("10.1.2.3", 40000))
        finally:
            await app.state.mirror.aclose()

    local, remote = asyncio.run(both())
    assert local.status_code == 200 and local.json()["upstream"]["url"] == "http://127.0.0.1:9"
    assert remote.status_code == 401 and "--admin-token-file" in remote.json()["error"]
    assert "127.0.0.1:9" not in remote.text


def test_not_found_names_the_repo_path_not_the_servers_directory(tmp_path: Path) -> None:
    """A missing repo, and a file gone from disk: 404 saying the repo's path, never the mirror's absolute dir."""
    root = tmp_path / "mirror-dir-secret-location"
    sha = hfrepo.write_repo(root, REPO, {"config.json": b"{}", "w.bin": b"weights"})
    (root / "hf" / "org" / "tiny" / sha / "w.bin").unlink()
    with mirror(tmp_path, root) as url:
        gone = httpx.get(url + "/api/models/org/absent", trust_env=False)
        assert gone.status_code == 404 and "hf/org/absent/" in gone.json()["error"]
        missing = httpx.get(f"{url}/org/tiny/resolve/{sha}/w.bin", trust_env=False)
        assert missing.status_code == 404 and "w.bin" in missing.json()["error"]
        for r in (gone, missing):
            assert str(root) not in r.text and "secret-location" not in r.text and str(tmp_path) not in r.text


def test_a_redirect_from_the_upstream_to_loopback_is_not_followed(tmp_path: Path) -> None:
    """The upstream (trusted, on loopback) redirects a file to another loopback port: refused, that port never hit."""
    with FlakyHttp(tmp_path / "hub") as hub, FlakyHttp(tmp_path / "inner") as inner:
        write_file(inner.root / "w.bin", 64)
        hub.json_routes[f"/api/models/{REPO}/revision/main"] = {"sha": SHA}
        hub.json_routes[f"/api/models/{REPO}/tree/{SHA}"] = [{"type": "file", "path": "w.bin", "size": 64,
                                                              "oid": "b" * 40}]
        hub.redirects[f"/{REPO}/resolve/{SHA}/w.bin"] = f"{inner.url}/w.bin"
        with mirror(tmp_path, tmp_path / "edge", upstream=hub.url, token="t") as url:
            r = httpx.post(url + "/admin/add", json={"source": f"hf://{REPO}"}, headers={"Authorization": "Bearer t"},
                           trust_env=False, timeout=60)
            assert r.status_code == 502, r.text
            said = json.loads(r.text)["error"]
            assert "redirected to 127.0.0.1 is a loopback address; not followed" in said, said
        assert hub.count("GET", f"/{REPO}/resolve/{SHA}/w.bin") == 1
        assert inner.seen == []


def test_the_servers_mounted_mirror_shows_its_stats_to_an_admin_only(tmp_path: Path) -> None:
    """`llmgw server --mirror-dir`: /mirror/admin/stats without a credential is 401; with the admin's token, 200."""
    s = System(tmp_path / "sys", server_args=["--mirror-dir", str(tmp_path / "weights")])
    try:
        s.start_server()
        for headers in ({"Authorization": ""}, {"Authorization": "Bearer not-a-token"}):
            r = s.request("GET", "/mirror/admin/stats", headers=headers)
            assert r.status_code == 401 and "an admin's token of this control plane" in r.json()["error"], r.text
        assert s.request("GET", "/mirror/admin/stats").json() == {"upstream": None}   # the admin's token
        # Reads stay open: nodes fetch with no credential.
        assert s.request("GET", "/mirror/healthz", headers={"Authorization": ""}).status_code == 200
    finally:
        s.close()
