"""The engine tunnel (issue 33) end to end in one process, with real TLS and real HTTP: an agent's dialer, the
router's tunnel port (``TunnelHub``) and the router's HTTP client (``client.Pool``) reaching an aiohttp engine
through it. Streaming, the refusal of anything that is not the node's engine (no open proxy), a certificate the
control plane refuses, cancellation reaching the engine, back-pressure, and a tunnel that drops and is re-dialled.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from llmgw.agent.tunnel.dialer import TunnelDialer
from llmgw.api import tunnel
from llmgw.core import pki
from llmgw.router import client
from llmgw.router.tunnel.hub import TunnelHub, server_context
from llmgw.testing.aioserve import serving
from llmgw.testing.procs import free_port

BODY = b'{"model": "m", "stream": true}'
BIG_CHUNKS = 1024  # 64 MiB: more than the sockets between engine and router hold


class Pki:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = pki.create_ca()
        server = pki.server_cert(self.ca, ["127.0.0.1"])
        (root / "ca.crt").write_bytes(self.ca.cert_pem)
        (root / "server.crt").write_bytes(server.cert_pem)
        (root / "server.key").write_bytes(server.key_pem)

    def node(self, node_id: str) -> Callable[[], ssl.SSLContext]:
        key = pki.new_key()
        cert = pki.sign_csr(self.ca, pki.create_csr(node_id, key), node_id)
        (self.root / f"{node_id}.crt").write_bytes(cert)
        (self.root / f"{node_id}.key").write_bytes(pki.key_pem(key))

        def context() -> ssl.SSLContext:
            ctx = ssl.create_default_context(cafile=str(self.root / "ca.crt"))
            ctx.load_cert_chain(str(self.root / f"{node_id}.crt"), str(self.root / f"{node_id}.key"))
            return ctx
        return context

    def hub_context(self) -> ssl.SSLContext:
        return server_context(ca_pem=self.ca.cert_pem, cert_file=str(self.root / "server.crt"),
                              key_file=str(self.root / "server.key"))


class Engine:
    """An engine's HTTP API: SSE chunks, a large body, and a stream that waits (to see its client leave)."""

    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.first_byte = asyncio.Event()  # set to let /slow answer
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_post("/big", self.big)
        self.app.router.add_post("/slow", self.slow)
        self.big_sent = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        assert await request.read() == BODY
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(5):
            await resp.write(b"data: {\"i\": %d}\n\n" % i)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def big(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        try:
            for _ in range(BIG_CHUNKS):
                await resp.write(b"x" * 65536)
                self.big_sent += 65536
        except (ConnectionError, asyncio.CancelledError):
            self.left.set()
            raise
        return resp

    async def slow(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            while True:
                await resp.write(b"data: tick\n\n")
                await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.CancelledError):
            self.left.set()
            raise


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def eventually(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    async with asyncio.timeout(timeout):
        for _ in range(int(timeout / 0.02) + 1):
            if got := check():
                return got
            await asyncio.sleep(0.02)
    raise AssertionError(f"not {what} within {timeout:g}s")


@contextlib.asynccontextmanager
async def tunnelled(root: Path, refused: dict[str, str] | None = None,
                    ) -> AsyncIterator[tuple[TunnelHub, TunnelDialer, Engine, str, str, Pki]]:
    """A hub, an engine and a second service beside it on loopback, node ``n1``'s dialer offered the hub."""
    keys = Pki(root)

    async def check(cert_pem: bytes, node: str) -> str:
        return (refused or {}).get(node, "")

    hub = TunnelHub(context=keys.hub_context(), check=check)
    await hub.start("127.0.0.1", 0)
    engine = Engine()
    other = web.Application()
    other.router.add_post("/secret", lambda r: web.Response(text="the node's other service"))
    async with serving(engine.app) as engine_url, serving(other) as other_url:
        dialer = TunnelDialer(node_id="n1", context=keys.node("n1"),
                              engines=lambda: {port_of(engine_url): ("127.0.0.1", port_of(engine_url), False)},
                              engine_ssl=lambda: True)
        try:
            yield hub, dialer, engine, engine_url, other_url, keys
        finally:
            await dialer.close()
            await hub.stop()


async def dialled(hub: TunnelHub, dialer: TunnelDialer) -> client.Pool:
    """The tunnel offered, dialled and up; a router's pool that reaches it."""
    dialer.offer("127.0.0.1", hub.port)
    await eventually(lambda: "n1" in hub.up(), "the tunnel up")
    pool = client.Pool(connect_timeout_s=5)
    pool.tunnels = hub
    return pool


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())


def test_a_stream_through_the_tunnel_and_nothing_but_the_nodes_engine(tmp_path: Path) -> None:
    async def main() -> None:
        async with tunnelled(tmp_path) as (hub, dialer, engine, engine_url, other_url, _):
            pool = await dialled(hub, dialer)
            url = tunnel.url("n1", port_of(engine_url))
            for _ in range(3):  # the connection is kept alive and reused over the same stream
                response = await pool.request(url, "/v1/chat/completions", b"Content-Type: application/json\r\n",
                                              BODY)
                assert response.status == 200
                body = await response.read()
                assert body.count(b"data: ") == 6 and body.endswith(b"data: [DONE]\n\n")
            # The node's other service, on a port of the same host: refused by the agent, nothing sent.
            with pytest.raises(client.ConnectFailed, match="not an engine of node n1"):
                await pool.request(tunnel.url("n1", port_of(other_url)), "/secret", b"", b"")
            # Another node's name through this node's tunnel: there is none.
            with pytest.raises(client.ConnectFailed, match="no tunnel from it"):
                await pool.request(tunnel.url("n2", port_of(engine_url)), "/v1/chat/completions", b"", BODY)
            pool.close()
    run(main)


def test_a_certificate_the_control_plane_refuses_gets_no_tunnel(tmp_path: Path) -> None:
    async def main() -> None:
        async with tunnelled(tmp_path, refused={"n1": "its certificate is revoked"}) as (hub, dialer, *_):
            dialer.offer("127.0.0.1", hub.port)
            await eventually(lambda: dialer.mux is not None and dialer.mux.admitted, "the refusal")
            assert dialer.mux is not None and dialer.mux.admitted == "its certificate is revoked"
            assert "n1" not in hub.up()
    run(main)


def test_a_client_that_leaves_closes_the_engines_connection(tmp_path: Path) -> None:
    async def main() -> None:
        async with tunnelled(tmp_path) as (hub, dialer, engine, engine_url, _, _k):
            pool = await dialled(hub, dialer)
            response = await pool.request(tunnel.url("n1", port_of(engine_url)), "/slow", b"", b"")
            assert await response.readany()
            response.close()  # the relay's close when its client went away
            await asyncio.wait_for(engine.left.wait(), 10)
            pool.close()
    run(main)


def test_a_slow_reader_holds_the_engine_back(tmp_path: Path) -> None:
    async def main() -> None:
        async with tunnelled(tmp_path) as (hub, dialer, engine, engine_url, _, _k):
            pool = await dialled(hub, dialer)
            response = await pool.request(tunnel.url("n1", port_of(engine_url)), "/big", b"", b"")
            await asyncio.sleep(0.5)  # not reading: the router's buffer, the window and the sockets fill, then stop
            held = engine.big_sent
            assert held < BIG_CHUNKS * 65536, "the engine wrote its whole 64 MiB to a reader that read nothing"
            got = len(await response.read())
            assert got == BIG_CHUNKS * 65536 and engine.big_sent == BIG_CHUNKS * 65536
            pool.close()
    run(main)


def test_a_dropped_tunnel_fails_its_streams_and_is_dialled_again(tmp_path: Path) -> None:
    async def main() -> None:
        async with tunnelled(tmp_path) as (hub, dialer, engine, engine_url, _, _k):
            pool = await dialled(hub, dialer)
            changes: list[tuple[str, bool]] = []
            hub.on_change = lambda node, up, why: changes.append((node, up))
            url = tunnel.url("n1", port_of(engine_url))
            response = await pool.request(url, "/slow", b"", b"")
            hub._tunnels["n1"].drop("cut by the test")
            with pytest.raises(client.BodyError, match="cut by the test"):
                await response.read()
            with pytest.raises(client.ConnectFailed, match="cut by the test"):
                await pool.request(url, "/v1/chat/completions", b"", BODY)
            await eventually(lambda: "n1" in hub.up(), "the tunnel dialled again")
            assert changes == [("n1", False), ("n1", True)] and dialer.dials == 2
            response = await pool.request(url, "/v1/chat/completions", b"", BODY)
            assert (await response.read()).endswith(b"[DONE]\n\n")
            pool.close()
    run(main)


def test_a_router_worker_reaches_the_tunnel_through_its_servers_relay(tmp_path: Path) -> None:
    from llmgw.router.tunnel.relay import RelayServer, RelayTunnels

    async def main() -> None:
        async with tunnelled(tmp_path) as (hub, dialer, engine, engine_url, _, _k):
            pool = await dialled(hub, dialer)
            relay = RelayServer(hub, "s3cret")
            address = await relay.start()
            pool.tunnels = RelayTunnels(address, secret="s3cret")
            url = tunnel.url("n1", port_of(engine_url))
            for _ in range(2):
                response = await pool.request(url, "/v1/chat/completions", b"", BODY)
                assert (await response.read()).endswith(b"data: [DONE]\n\n")
            response = await pool.request(url, "/slow", b"", b"")  # a leaving client stops the engine, relayed too
            assert await response.readany()
            response.close()
            await asyncio.wait_for(engine.left.wait(), 10)
            with pytest.raises(client.ConnectFailed, match="no tunnel from it"):
                await pool.request(tunnel.url("n2", 1), "/", b"", b"")
            stranger = client.Pool()
            stranger.tunnels = RelayTunnels(address, secret="guess")
            with pytest.raises(client.ConnectFailed, match="for its own router workers"):
                await stranger.request(url, "/v1/chat/completions", b"", BODY)
            pool.close()
            stranger.close()
            await relay.stop()
    run(main)


@contextlib.asynccontextmanager
async def store_auth(root: Path) -> AsyncIterator[tuple[Any, Any]]:
    """A real store (SQLite) and the control plane's ``Auth`` on it."""
    from llmgw.control.auth import Auth
    from llmgw.control.store.offloop import StoreThread
    from llmgw.control.store.store import Store

    db = StoreThread(Store.open(root / "store"))
    try:
        yield db, Auth(db)
    finally:
        db.close()


def test_a_standalone_router_reaches_the_tunnel_with_its_router_token_only(tmp_path: Path) -> None:
    from llmgw.control.auth import tokens
    from llmgw.router.tunnel.remote import ControlTunnels
    from llmgw.serving.tunnels import open_door

    async def main() -> None:
        async with tunnelled(tmp_path) as (hub, dialer, engine, engine_url, other_url, keys), \
                store_auth(tmp_path) as (db, auth):
            await dialled(hub, dialer)
            door = open_door(hub, auth)
            assert door is not None
            token, _ = await auth.issue(kind="router", subject="r1")
            user_token, _ = await auth.issue(kind="user", subject="admin")
            cp = "https://127.0.0.1:1"  # the control plane's URL: its host, and the tunnel port its answer said

            def router(with_token: str) -> client.Pool:
                pool = client.Pool(connect_timeout_s=5)
                pool.tunnels = ControlTunnels([cp], token=with_token, ports={cp: hub.port},
                                              ca_pem=lambda: keys.ca.cert_pem.decode())
                return pool

            pool = router(token)
            url = tunnel.url("n1", port_of(engine_url))
            for _ in range(2):  # TLS verified with the table's engine_ca and the URL's host
                response = await pool.request(url, "/v1/chat/completions", b"", BODY)
                assert (await response.read()).endswith(b"data: [DONE]\n\n")
            # No open proxy: the node's other service, and a node with no tunnel, are refused with nothing sent.
            with pytest.raises(client.ConnectFailed, match="not an engine of node n1"):
                await pool.request(tunnel.url("n1", port_of(other_url)), "/secret", b"", b"")
            with pytest.raises(client.ConnectFailed, match="no tunnel from it"):
                await pool.request(tunnel.url("n2", port_of(engine_url)), "/", b"", b"")
            # Only a router token: a user's (an administrator's even) and a made-up one are refused.
            for other in (user_token, "llmgw_made_up", "x"):
                stranger = router(other)
                with pytest.raises(client.ConnectFailed, match="takes only a router token"):
                    await stranger.request(url, "/v1/chat/completions", b"", BODY)
                stranger.close()
            # A router token deleted (as `llmgw router-token delete` does, in another process): its open stream is
            # cut and a new one refused, within about a second.
            response = await pool.request(url, "/slow", b"", b"")
            assert await response.readany()
            await db.call(db.store.delete_api_token, tokens.token_id(token))
            await asyncio.wait_for(engine.left.wait(), 10)
            response.close()
            pool.close()
            with pytest.raises(client.ConnectFailed, match="takes only a router token"):
                await router(token).request(url, "/v1/chat/completions", b"", BODY)
            door.stop()
    run(main)


class Kept(asyncio.Protocol):
    transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport


def test_a_router_tries_its_control_planes_for_the_one_holding_the_tunnel(tmp_path: Path) -> None:
    from llmgw.router.tunnel.relay import Door
    from llmgw.router.tunnel.remote import ControlTunnels

    async def allowed(token: str) -> str:
        return "" if token == "t" else "refused"

    async def main() -> None:
        async with tunnelled(tmp_path) as (hub, dialer, engine, engine_url, _, keys):
            await dialled(hub, dialer)
            standby = TunnelHub(context=keys.hub_context())  # a control plane no agent dialled
            await standby.start("127.0.0.1", 0)
            doors = [Door(hub, allowed), Door(standby, allowed)]
            hub.routers, standby.routers = doors[0].protocol, doors[1].protocol
            first, second = "https://127.0.0.1:1", "https://127.0.0.1:2"
            remote = ControlTunnels([first, second], token="t", ports={first: standby.port, second: hub.port},
                                    ca_pem=lambda: keys.ca.cert_pem.decode())
            pool = client.Pool(connect_timeout_s=5)
            pool.tunnels = remote
            url = tunnel.url("n1", port_of(engine_url))
            response = await pool.request(url, "/v1/chat/completions", b"", BODY)
            assert (await response.read()).endswith(b"data: [DONE]\n\n")
            assert remote.holder("n1") == second
            # Neither holds node n2's tunnel: the refusal names both.
            with pytest.raises(client.ConnectFailed, match=f"{first}.*no tunnel from it.*{second}.*no tunnel"):
                await pool.request(tunnel.url("n2", 1), "/", b"", b"")
            # A control plane whose tunnel port cannot be reached is tried after the others while it backs off.
            dead = "https://127.0.0.1:3"
            around = ControlTunnels([dead, second], token="t", ports={dead: free_port(), second: hub.port},
                                    ca_pem=lambda: keys.ca.cert_pem.decode())
            kept = await around.connect("n1", port_of(engine_url), Kept)
            assert around.backing_off() == {dead} and around.holder("n1") == second
            assert isinstance(kept, Kept) and kept.transport is not None
            kept.transport.close()
            # A hub with no door (an --insecure server's routers, or none opened) says what it takes.
            standby.routers = None
            lone = ControlTunnels([first], token="t", ports={first: standby.port},
                                  ca_pem=lambda: keys.ca.cert_pem.decode())
            with pytest.raises(client.ConnectFailed, match="takes node certificates"):
                await lone.connect("n1", port_of(engine_url), asyncio.Protocol)
            pool.close()
            for door in doors:
                door.stop()
            await standby.stop()
    run(main)


def test_the_routers_door_closes_a_silent_or_malformed_connection(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from llmgw.router.tunnel import relay

    monkeypatch.setattr(relay, "LINE_TIMEOUT_S", 0.3)

    async def nobody(token: str) -> str:
        return "refused"

    async def main() -> None:
        async with tunnelled(tmp_path) as (hub, _d, _e, _u, _o, keys):
            door = relay.Door(hub, nobody)
            hub.routers = door.protocol
            trust = ssl.create_default_context(cadata=keys.ca.cert_pem.decode())
            for sent, said in ((b"", b"ERR no request line within 0.3s\n"),
                               (b"one two\n", b"ERR expected one line: CREDENTIAL NODE PORT\n")):
                reader, writer = await asyncio.open_connection("127.0.0.1", hub.port, ssl=trust)
                writer.write(sent)
                assert await asyncio.wait_for(reader.read(), 10) == said
                writer.close()
            door.stop()
    run(main)
