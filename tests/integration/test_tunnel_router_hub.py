"""``llmgw router --workers N`` (issue 33): its workers reach tunnelled engines through the hub's relay
(``tunnel.remote.workers_relay``), which opens each stream on the control plane's tunnel port with the hub's router
token; the workers hold only their secret. In one process with real TLS, a real store's tokens and real HTTP.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from test_tunnel import BODY, dialled, port_of, run, store_auth, tunnelled

from llmgw.api import tunnel
from llmgw.router import client
from llmgw.router.tunnel.relay import RelayTunnels
from llmgw.router.tunnel.remote import workers_relay
from llmgw.serving.tunnels import open_door


def test_a_router_hubs_workers_reach_the_tunnel_through_its_relay_with_its_token(tmp_path: Path) -> None:
    async def main() -> None:
        async with tunnelled(tmp_path) as (hub, dialer, engine, engine_url, other_url, keys), \
                store_auth(tmp_path) as (db, auth):
            await dialled(hub, dialer)
            door = open_door(hub, auth)
            assert door is not None
            token, _ = await auth.issue(kind="router", subject="edge")
            cp = "https://127.0.0.1:1"  # the control plane the hub follows: its host, and the port its answer said
            ports: dict[str, int] = {}  # as the hub's Upstream learns them
            relays = [workers_relay([cp], token=t, ports=ports, ca_pem=lambda: keys.ca.cert_pem.decode(),
                                    secret="w-secret") for t in (token, "", "llmgw_made_up")]
            with_token, no_token, bad_token = [await r.start() for r in relays]

            def worker(at: str, secret: str = "w-secret") -> client.Pool:
                pool = client.Pool(connect_timeout_s=5)
                pool.tunnels = RelayTunnels(at, secret=secret)
                return pool

            url = tunnel.url("n1", port_of(engine_url))
            pool = worker(with_token)
            # Before a table said the tunnel port: refused with why, nothing sent.
            with pytest.raises(client.ConnectFailed, match="no control plane followed has said its tunnel port"):
                await pool.request(url, "/v1/chat/completions", b"", BODY)
            ports[cp] = hub.port
            for _ in range(2):  # streamed through worker -> hub's relay -> tunnel port (TLS, token) -> node
                response = await pool.request(url, "/v1/chat/completions", b"", BODY)
                assert (await response.read()).endswith(b"data: [DONE]\n\n")
            # No open proxy: the node's other service is refused by the node, a stranger by the relay.
            with pytest.raises(client.ConnectFailed, match="not an engine of node n1"):
                await pool.request(tunnel.url("n1", port_of(other_url)), "/secret", b"", b"")
            stranger = worker(with_token, secret="guess")
            with pytest.raises(client.ConnectFailed, match="for its own router workers"):
                await stranger.request(url, "/v1/chat/completions", b"", BODY)
            # A hub without a token, or with one the control plane does not know: the refusal says what to do.
            for at, said in ((no_token, "give the router --token-file"), (bad_token, "takes only a router token")):
                refused = worker(at)
                with pytest.raises(client.ConnectFailed, match=said):
                    await refused.request(url, "/v1/chat/completions", b"", BODY)
                refused.close()
            # A leaving worker's client closes the engine's connection through both hops.
            response = await pool.request(url, "/slow", b"", b"")
            assert await response.readany()
            response.close()
            await asyncio.wait_for(engine.left.wait(), 10)
            pool.close()
            stranger.close()
            for relay in relays:
                await relay.stop()
            door.stop()
    run(main)
