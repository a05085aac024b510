"""A standby's REST front (``control.http.forward``) in front of a real "leader" on loopback.

The leader is a small aiohttp app that echoes what reached it and streams three chunks, each
held until the test lets it go; the standby is ``forward.standby`` served by the server
``llmgw server`` runs (``router.server``), in front of a small local app that says it answered.
The leadership is a fake with ``Leadership``'s attributes: the election is not under test here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from aiohttp import web

from llmgw.control.auth import Auth, principals
from llmgw.control.cluster import Cluster
from llmgw.control.http import api as api_mod
from llmgw.control.http import forward
from llmgw.control.leader import Instance, Me
from llmgw.control.store.store import Lease, Store, StoredControlPlane
from llmgw.core import pki
from llmgw.router import server as router_server
from llmgw.router import tlslisten
from llmgw.testing.procs import free_port

ME = Me("cp-b", "http://127.0.0.1:1", "127.0.0.1:2", "0.15")


class FakeLeadership:
    """``Leadership``'s attributes, set by the test."""

    def __init__(self, *, leading: bool = False, leader: StoredControlPlane | None = None,
                 instances: tuple[Instance, ...] = (), lease: Lease | None = None) -> None:
        self.leading, self.me, self._leader, self._instances = leading, ME, leader, list(instances)
        self.lease = lease
        self.term = 3 if leading else 0

    def valid(self) -> bool:
        return self.leading

    def leader(self) -> StoredControlPlane | None:
        return self._leader

    def peers(self) -> tuple[str, ...]:
        return (self.me.agent_addr,)

    def describe(self) -> list[Instance]:
        return self._instances


def _leader_row(url: str) -> StoredControlPlane:
    return StoredControlPlane("cp-a", url, "127.0.0.1:3", "0.15", 1.0, 2.0)


class Leader:
    """The leader's REST app: ``/stream`` sends three chunks, each after ``gates[i]`` is set; the rest echoes."""

    def __init__(self) -> None:
        self.gates = [asyncio.Event() for _ in range(3)]
        self.finished = asyncio.Event()
        self.stream_cut = asyncio.Event()
        self.hits = 0

    async def echo(self, request: web.Request) -> web.Response:
        self.hits += 1
        doc = {"method": request.method, "path": request.raw_path.split("?")[0],
               "query": request.rel_url.raw_query_string, "body": (await request.read()).decode(),
               "headers": {k.lower(): v for k, v in request.headers.items()}}
        response = web.json_response(doc, status=201, headers={"X-Leader": "yes"})
        response.headers.add("Set-Cookie", "a=1; Path=/")
        response.headers.add("Set-Cookie", "b=2; Path=/")
        return response

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        try:
            for i, gate in enumerate(self.gates):
                await gate.wait()
                await response.write(b'{"chunk": %d}\n' % i)
            self.finished.set()
            # Held open after the three, as `logs -f` is: only the client's leaving ends it.
            while True:
                await asyncio.sleep(0.02)
                await response.write(b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.stream_cut.set()
            raise
        return response

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_route("GET", "/stream", self.stream)
        app.router.add_route("*", "/{tail:.*}", self.echo)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
        return runner, f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"


async def local_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The standby's own REST app, stood in for: says it answered, and which path."""
    body = json.dumps({"local": scope["path"], "method": scope["method"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


@contextlib.asynccontextmanager
async def serving(view: FakeLeadership, ca_file: Path | None = None) -> AsyncIterator[tuple[str, forward.Standby]]:
    front = forward.standby(local_app, view, ca_file=ca_file)
    http = router_server.Server(front)
    port = free_port()
    await http.start("127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}", front
    finally:
        await http.shutdown(1)
        await front.close()


@contextlib.asynccontextmanager
async def leading_server(ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[tuple[Leader, str]]:
    leader = Leader()
    runner, url = await leader.start(ssl_context)
    try:
        yield leader, url
    finally:
        for gate in leader.gates:
            gate.set()
        await runner.cleanup()


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))  # type: ignore[arg-type]


def test_a_leader_answers_every_request_itself() -> None:
    """While this instance leads, a change and a read reach the local app; nothing is forwarded."""
    async def main() -> None:
        async with leading_server() as (leader, url):
            view = FakeLeadership(leading=True, leader=_leader_row(url))
            async with serving(view) as (front_url, _), httpx.AsyncClient() as c:
                r = await c.post(front_url + "/api/v1/models", content=b"{}")
                assert r.json() == {"local": "/api/v1/models", "method": "POST"}
                assert forward.FORWARDED_BY not in r.headers
                assert (await c.get(front_url + "/api/v1/nodes")).json()["local"] == "/api/v1/nodes"
            assert leader.hits == 0
    run(main())


def test_a_standby_forwards_method_path_query_body_and_the_headers_that_matter() -> None:
    """Method, raw path, query, body and the API's headers reach the leader; Host and others don't; marks both ways."""
    async def main() -> None:
        async with leading_server() as (leader, url):
            view = FakeLeadership(leader=_leader_row(url))
            async with serving(view) as (front_url, _), httpx.AsyncClient() as c:
                sent = {"Authorization": "Bearer tok", "Cookie": "llmgw_session=s", "Content-Type": "application/json",
                        "Accept": "application/json", "Origin": "http://elsewhere.example", "User-Agent": "ua/1",
                        "X-Llmgw-Actor": "alice", "X-Private": "no", "Keep-Alive": "timeout=5"}
                r = await c.put(front_url + "/api/v1/models/a%2Fb?x=1&y=two%20words", content=b'{"k": "v"}',
                                headers=sent)
                assert r.status_code == 201 and r.headers["content-type"].startswith("application/json")
                assert r.headers["x-leader"] == "yes" and r.headers[forward.FORWARDED_BY] == "cp-b"
                assert r.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]
                got = r.json()
                assert (got["method"], got["path"], got["query"], got["body"]) == (
                    "PUT", "/api/v1/models/a%2Fb", "x=1&y=two%20words", '{"k": "v"}')
                h = got["headers"]
                for name in ("authorization", "cookie", "content-type", "accept", "origin", "user-agent",
                             "x-llmgw-actor"):
                    assert h[name] == sent[{k.lower(): k for k in sent}[name]], name
                assert h["host"] == url.removeprefix("http://")  # the leader's own, never the standby's
                assert "x-private" not in h and "keep-alive" not in h
                assert h[forward.FORWARDED_BY] == "cp-b" and h["x-forwarded-for"] == "127.0.0.1"
                # Reads are forwarded too: node liveness and logs live only on the leader.
                r = await c.get(front_url + "/api/v1/nodes")
                assert r.json()["method"] == "GET" and r.json()["path"] == "/api/v1/nodes"
            assert leader.hits == 2
    run(main())


def test_an_origin_naming_the_standby_reaches_the_leader_as_its_own() -> None:
    """A browser page on the standby sends the standby's origin; the leader's CSRF check gets the leader's."""
    async def main() -> None:
        async with leading_server() as (_, url):
            async with serving(FakeLeadership(leader=_leader_row(url))) as (front_url, _), httpx.AsyncClient() as c:
                r = await c.post(front_url + "/api/v1/models", content=b"{}", headers={"Origin": front_url})
                assert r.json()["headers"]["origin"] == url
    run(main())


def test_a_stream_arrives_chunk_by_chunk_before_the_leader_finished() -> None:
    """Each chunk reaches the client while the leader still holds the next; the client leaving cuts the leader's."""
    async def main() -> None:
        async with leading_server() as (leader, url):
            async with serving(FakeLeadership(leader=_leader_row(url))) as (front_url, _):
                # The first gate opens before the request: a server sends its head with the first chunk
                # (aiohttp's and ours), so no status can arrive before it.
                leader.gates[0].set()
                async with aiohttp.ClientSession() as c, c.get(front_url + "/stream?follow=true") as r:
                    assert r.status == 200 and r.headers["content-type"] == "application/x-ndjson"
                    received = b""
                    for i, gate in enumerate(leader.gates):
                        gate.set()
                        while b'{"chunk": %d}\n' % i not in received:
                            received += await r.content.readany()
                        # The leader has not sent the next chunk: it waits for this loop's next gate.
                        assert not leader.finished.is_set() or i == 2
                    assert received.startswith(b'{"chunk": 0}\n{"chunk": 1}\n{"chunk": 2}\n')
                # The client left: the standby closes its connection to the leader, whose stream ends.
                await asyncio.wait_for(leader.stream_cut.wait(), 10)
    run(main())


def test_health_metrics_endpoints_and_controlplanes_are_answered_by_the_standby() -> None:
    """GET of the four local routes reaches the local app on a standby, even with no leader; a POST is forwarded."""
    async def main() -> None:
        async with leading_server() as (leader, url):
            async with serving(FakeLeadership()) as (front_url, _), httpx.AsyncClient() as c:
                for path in ("/healthz", "/metrics", "/api/v1/endpoints", "/api/v1/controlplanes"):
                    r = await c.get(front_url + path)
                    assert r.status_code == 200 and r.json()["local"] == path, path
            async with serving(FakeLeadership(leader=_leader_row(url))) as (front_url, _), httpx.AsyncClient() as c:
                r = await c.post(front_url + "/api/v1/endpoints", content=b"x")
                assert r.json()["path"] == "/api/v1/endpoints" and leader.hits == 1
    run(main())


def _assert_503(r: httpx.Response, *why: str) -> None:
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    error = r.json()["error"]
    assert error["code"] == "no_leader" and error["type"] == "server_error"
    message = error["message"]
    assert message.startswith("this control plane (cp-b) is a standby and no leader answers now (")
    assert message.endswith("); retry in a few seconds")
    for part in why:
        assert part in message, (part, message)


def test_no_leader_known_is_a_503_naming_whose_lease_expired_and_when_it_last_wrote() -> None:
    """No unexpired lease: 503 in the API's error shape, Retry-After 2, the last holder, its term and silence."""
    gone = Instance("cp-a", "standby", 0, -1.0, "http://127.0.0.1:9", "127.0.0.1:3", "0.15", 7.52)
    me = Instance("cp-b", "standby", 0, -1.0, ME.http_url, ME.agent_addr, "0.15", 0.2)
    expired = Lease("cp-a", 4, 100.0, 94.0, "127.0.0.1:3")

    async def main() -> None:
        view = FakeLeadership(instances=(gone, me), lease=expired)
        async with serving(view) as (front_url, _), httpx.AsyncClient() as c:
            _assert_503(await c.delete(front_url + "/api/v1/models/m"),
                        "(the lease of cp-a (term 4) expired and no standby has taken it yet; it last wrote 7.5s ago)")
        async with serving(FakeLeadership(instances=(me,))) as (front_url, _), httpx.AsyncClient() as c:
            _assert_503(await c.get(front_url + "/api/v1/nodes"), "(no control plane has taken the lease yet)")
    run(main())


def test_a_leader_that_does_not_answer_is_a_503_naming_it() -> None:
    """The leader known but its port closed: 503 naming the leader, its URL and the error; no traceback."""
    async def main() -> None:
        url = f"http://127.0.0.1:{free_port()}"
        async with serving(FakeLeadership(leader=_leader_row(url))) as (front_url, _), httpx.AsyncClient() as c:
            r = await c.post(front_url + "/api/v1/models", content=b"{}")
            _assert_503(r, f"its leader cp-a at {url} did not answer: ")
            assert "Traceback" not in r.text
    run(main())


def test_a_leader_on_https_is_verified_with_the_cluster_ca(tmp_path: Path) -> None:
    """A leader serving HTTPS (llmgw server --tls) is reached when its certificate is the cluster CA's, and refused
    (503 naming it) when the standby's CA did not issue it: the forwarder never talks to an impostor."""
    ca, other = pki.create_ca(), pki.create_ca()
    issued = pki.server_cert(ca, ["127.0.0.1"])
    for name, data in (("ca.crt", ca.cert_pem), ("other.crt", other.cert_pem), ("api.crt", issued.cert_pem),
                       ("api.key", issued.key_pem)):
        (tmp_path / name).write_bytes(data)
    leader_tls = tlslisten.CertReloader(tmp_path / "api.crt", tmp_path / "api.key").context

    async def main() -> None:
        async with leading_server(leader_tls) as (leader, url):
            assert url.startswith("https://")
            async with serving(FakeLeadership(leader=_leader_row(url)), tmp_path / "ca.crt") as (front_url, _), \
                    httpx.AsyncClient() as c:
                r = await c.post(front_url + "/api/v1/models", content=b'{"k": 1}')
                assert r.status_code == 201 and r.json()["body"] == '{"k": 1}', r.text
            async with serving(FakeLeadership(leader=_leader_row(url)), tmp_path / "other.crt") as (front_url, _), \
                    httpx.AsyncClient() as c:
                r = await c.post(front_url + "/api/v1/models", content=b"{}")
                _assert_503(r, f"its leader cp-a at {url} did not answer: ")
                assert "certificate" in r.text.lower()
            assert leader.hits == 1
    run(main())


def test_a_request_another_standby_forwarded_is_not_forwarded_again() -> None:
    """Two instances that each think the other leads answer 503 instead of bouncing a request between them."""
    async def main() -> None:
        async with leading_server() as (leader, url):
            async with serving(FakeLeadership(leader=_leader_row(url))) as (front_url, _), httpx.AsyncClient() as c:
                r = await c.get(front_url + "/api/v1/nodes", headers={forward.FORWARDED_BY: "cp-c"})
                _assert_503(r, "already forwarded")
            assert leader.hits == 0
    run(main())


def test_the_controlplanes_route_lists_describe_and_names_this_instance(tmp_path: Path) -> None:
    """GET /api/v1/controlplanes: every Instance as a dict and ``self``; without a leadership an empty list."""
    lead = Instance("cp-a", "leader", 4, 0.4, "http://10.0.0.1:8080", "10.0.0.1:8081", "0.15", 0.4)
    me = Instance("cp-b", "standby", 0, -1.0, "http://10.0.0.2:8080", "10.0.0.2:8081", "0.15", 0.1)
    store = Store.open(tmp_path)

    async def get(leadership: FakeLeadership | None) -> Any:
        app = api_mod.create_api(store, Cluster(store), auth=Auth.insecure(), leadership=leadership)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            r = await c.get("/api/v1/controlplanes")
            assert r.status_code == 200
            return r.json()

    try:
        assert asyncio.run(get(FakeLeadership(instances=(lead, me)))) == {
            "controlplanes": [dataclasses.asdict(lead), dataclasses.asdict(me)], "self": "cp-b"}
        assert asyncio.run(get(None)) == {"controlplanes": [], "self": ""}
    finally:
        store.close()


def test_every_user_role_reads_controlplanes_and_a_router_does_not() -> None:
    """The permission table: viewer, operator and admin may GET /api/v1/controlplanes; a router credential may not."""
    need = principals.required("GET", "/api/v1/controlplanes")
    assert need is not None
    allowed = {role for role in (*principals.USER_ROLES, principals.ROUTER)
               if need.allows(principals.Principal("user" if role != principals.ROUTER else "router", "x", role))}
    assert allowed == set(principals.USER_ROLES)
