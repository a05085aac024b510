"""The router's own HTTP/1.1 server and client (``server``, ``client``) on real loopback sockets.

Each test runs the server or the client in this process against a peer written
here with asyncio streams, so the bytes on the wire are what is asserted:
framing, keep-alive, pipelining, limits, disconnects, timeouts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from llmgw.router import asgi, client, server
from llmgw.testing.procs import free_port

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


async def _serving(app: App, **options: Any) -> tuple[server.Server, int]:
    port = free_port()
    http = server.Server(app, **options)
    await http.start("127.0.0.1", port)
    return http, port


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One response: status line, headers (lower-case names), body (de-chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status, *lines = head[:-4].split(b"\r\n")
    headers = {k.lower(): v for k, _, v in (line.partition(b": ") for line in lines)}
    if b"content-length" in headers:
        return status, headers, await reader.readexactly(int(headers[b"content-length"]))
    if headers.get(b"transfer-encoding") == b"chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return status, headers, body
            body += chunk[:-2]
    return status, headers, await reader.read()


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers with the request's method, path, query and body as JSON; a body in parts for /parts."""
    message = await receive()
    doc = {"method": scope["method"], "path": scope["path"], "query": scope["query_string"].decode(),
           "body": message["body"].decode(), "cancels": asgi.CANCELS in scope["extensions"]}
    if scope["path"] == "/parts":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    body = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


def test_keep_alive_and_pipelined_requests_are_answered_in_order() -> None:
    """Two requests written at once on one connection get two answers, in order, and it stays open."""
    async def main() -> None:
        http, port = await _serving(echo)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /a?x=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\none"
                         b"POST /b%20c HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\ntwo")
            first = json.loads((await _read_response(reader))[2])
            second = json.loads((await _read_response(reader))[2])
            assert (first["path"], first["query"], first["body"]) == ("/a", "x=1", "one")
            assert (second["path"], second["body"]) == ("/b c", "two")
            assert first["cancels"] is True
            writer.write(b"GET /c HTTP/1.1\r\nHost: t\r\n\r\n")
            status, headers, _ = await _read_response(reader)
            assert status == b"HTTP/1.1 200 OK" and b"date" in headers and b"connection" not in headers
            writer.close()
        finally:
            await http.shutdown(1)
    run(main())


def test_a_body_in_parts_is_chunked_and_http10_gets_it_until_close() -> None:
    """more_body sends become chunks on HTTP/1.1; HTTP/1.0 has no chunking, so the connection ends the body."""
    async def main() -> None:
        http, port = await _serving(echo)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /parts HTTP/1.1\r\nHost: t\r\n\r\n")
            _, headers, body = await _read_response(reader)
            assert headers[b"transfer-encoding"] == b"chunked" and body == b"data: 1\n\ndata: 2\n\n"
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /parts HTTP/1.0\r\n\r\n")
            _, headers, body = await _read_response(reader)
            assert b"transfer-encoding" not in headers and headers[b"connection"] == b"close"
            assert body == b"data: 1\n\ndata: 2\n\n"
        finally:
            await http.shutdown(1)
    run(main())


def test_connection_close_head_and_expect_continue() -> None:
    """Connection: close is honoured; HEAD gets headers only; Expect: 100-continue gets its 100 first."""
    async def main() -> None:
        http, port = await _serving(echo)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert b"content-length:" in head
            writer.write(b"POST /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\n"
                         b"Connection: close\r\n\r\n")
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"ok")
            status, headers, body = await _read_response(reader)
            assert headers[b"connection"] == b"close" and json.loads(body)["body"] == "ok"
            assert await reader.read() == b""  # HEAD sent no body, and the server closed after the close
        finally:
            await http.shutdown(1)
    run(main())


def test_oversized_body_malformed_request_and_failing_app() -> None:
    """413 before the whole body arrives, 400 for bytes that are not HTTP, 500 when the app raises."""
    async def failing(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async def main() -> None:
        http, port = await _serving(echo, max_body_bytes=10)
        broken, broken_port = await _serving(failing)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n" + b"x" * 20)
            status, _, body = await _read_response(reader)
            assert status.startswith(b"HTTP/1.1 413") and json.loads(body)["error"]["code"] == "request_too_large"
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            status, _, body = await _read_response(reader)
            assert status.startswith(b"HTTP/1.1 400") and "not valid HTTP" in json.loads(body)["error"]["message"]
            reader, writer = await asyncio.open_connection("127.0.0.1", broken_port)
            writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            status, _, body = await _read_response(reader)
            assert status.startswith(b"HTTP/1.1 500") and json.loads(body)["error"]["type"] == "internal_error"
        finally:
            await http.shutdown(1)
            await broken.shutdown(1)
    run(main())


def test_client_disconnect_cancels_the_request_at_once() -> None:
    """Closing the connection while the app waits cancels the app's task (how the router stops an engine)."""
    async def main() -> None:
        waiting, cancelled = asyncio.Event(), asyncio.Event()

        async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await receive()
            waiting.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        http, port = await _serving(slow)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            await asyncio.wait_for(waiting.wait(), 5)  # the app holds the request: there is something to cancel
            writer.close()
            await asyncio.wait_for(cancelled.wait(), 5)
        finally:
            await http.shutdown(1)
    run(main())


def test_shutdown_lets_a_request_in_flight_finish() -> None:
    """shutdown() stops listening but the open request still gets its whole answer within the grace."""
    async def main() -> None:
        started = asyncio.Event()

        async def slowish(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await receive()
            started.set()
            await asyncio.sleep(0.3)
            await echo(scope, _once(b""), send)

        http, port = await _serving(slowish)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /late HTTP/1.1\r\nHost: t\r\n\r\n")
        await writer.drain()
        await asyncio.wait_for(started.wait(), 5)  # in the app when the shutdown begins, not still unread
        stopping = asyncio.ensure_future(http.shutdown(5))
        status, _, body = await _read_response(reader)
        assert status == b"HTTP/1.1 200 OK" and json.loads(body)["path"] == "/late"
        await stopping
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
    run(main())


def _once(body: bytes) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}
    return receive


# -- the client --


class Engine:
    """A scripted upstream: ``answer(request_bytes)`` returns what to write back, or None to stay silent."""

    def __init__(self, answer: Callable[[bytes], bytes | None], *, close_after: bool = False) -> None:
        self.answer = answer
        self.close_after = close_after
        self.connections = 0
        self.closed = asyncio.Event()
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                out = self.answer(request)
                if out is None:
                    await reader.read()  # silent until the client goes
                    return
                writer.write(out)
                await writer.drain()
                if self.close_after:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()
            self.closed.set()


def _whole(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def _engine(engine: Engine) -> tuple[asyncio.AbstractServer, str]:
    port = free_port()
    srv = await asyncio.start_server(engine.handle, "127.0.0.1", port)
    return srv, f"http://127.0.0.1:{port}"


def test_client_reuses_a_keep_alive_connection_and_sends_the_head_given() -> None:
    """Two requests, one connection; the request carries Host, the extra lines and the length."""
    async def main() -> None:
        engine = Engine(lambda _: _whole(b'{"ok":1}'))
        srv, url = await _engine(engine)
        pool = client.Pool()
        try:
            for _ in range(2):
                response = await pool.request(url, "/v1/x", b"Authorization: Bearer k\r\n", b"{}")
                assert response.status == 200 and response.headers.get("Content-Type") == "application/json"
                assert await response.read() == b'{"ok":1}'
                response.close()
            assert engine.connections == 1
            first = engine.requests[0]
            assert first.startswith(b"POST /v1/x HTTP/1.1\r\nHost: 127.0.0.1:")
            assert b"Authorization: Bearer k\r\n" in first and first.endswith(b"Content-Length: 2\r\n\r\n{}")
        finally:
            pool.close()
            srv.close()
    run(main())


def test_client_reads_chunked_and_close_delimited_bodies() -> None:
    """A chunked stream arrives chunk by chunk; a body with neither length nor chunking ends at EOF."""
    async def main() -> None:
        chunked = Engine(lambda _: b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                   b"transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n")
        eof = Engine(lambda _: b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end", close_after=True)
        srv1, url1 = await _engine(chunked)
        srv2, url2 = await _engine(eof)
        pool = client.Pool()
        try:
            response = await pool.request(url1, "/", b"", b"")
            assert [chunk async for chunk in response.content.iter_any()] in ([b"hello!"], [b"hello", b"!"])
            response = await pool.request(url2, "/", b"", b"")
            assert await response.read() == b"until the end"
        finally:
            pool.close()
            srv1.close()
            srv2.close()
    run(main())


def test_client_errors_say_what_failed() -> None:
    """Refused: ConnectFailed; closed before the headers: Disconnected; silent: ReadTimeout; cut body: BodyError."""
    async def main() -> None:
        pool = client.Pool(read_timeout_s=0.3)
        dropped = Engine(lambda _: b"", close_after=True)
        silent = Engine(lambda _: None)
        cut = Engine(lambda _: b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort", close_after=True)
        servers = []
        try:
            with pytest.raises(client.ConnectFailed, match="cannot connect"):
                await pool.request(f"http://127.0.0.1:{free_port()}", "/", b"", b"")
            for engine, error in ((dropped, client.Disconnected), (silent, client.ReadTimeout)):
                srv, url = await _engine(engine)
                servers.append(srv)
                with pytest.raises(error):
                    await pool.request(url, "/", b"", b"")
            srv, url = await _engine(cut)
            servers.append(srv)
            response = await pool.request(url, "/", b"", b"")
            with pytest.raises(client.BodyError):
                await response.read()
        finally:
            pool.close()
            for srv in servers:
                srv.close()
    run(main())


def test_closing_a_response_mid_stream_closes_the_connection() -> None:
    """What the relay does when the client left: the engine sees its connection end, and it is not reused."""
    async def main() -> None:
        engine = Engine(lambda _: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        srv, url = await _engine(engine)
        pool = client.Pool()
        try:
            response = await pool.request(url, "/", b"", b"")
            assert await response.readany() == b"first"
            response.close()
            await asyncio.wait_for(engine.closed.wait(), 5)
            assert pool._take(pool.target(url)[0]) is None
        finally:
            pool.close()
            srv.close()
    run(main())


def test_a_large_body_survives_the_read_pause() -> None:
    """A body far over the buffer limit pauses reading from the engine and still arrives whole."""
    big = bytes(range(256)) * 8192  # 2 MiB
    async def main() -> None:
        engine = Engine(lambda _: _whole(big))
        srv, url = await _engine(engine)
        pool = client.Pool()
        try:
            response = await pool.request(url, "/", b"", b"")
            received = b""
            while chunk := await response.readany():
                received += chunk
                await asyncio.sleep(0)  # a slow reader: the buffer fills between reads
            assert received == big
        finally:
            pool.close()
            srv.close()
    run(main())


async def whole_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The router's own helpers: ``asgi.read_body`` (the server hands the body over without a message) and
    ``asgi.send_bytes`` (the server writes the answer in one call, without the two messages)."""
    try:
        body = await asgi.read_body(receive, limit=8)
    except Exception as exc:  # the 413 the router's app would answer
        await asgi.send_bytes(send, getattr(exc, "status", 500), b'{"error":"too large"}')
        return
    await asgi.send_bytes(send, 201, b"got " + body, content_type=b"text/plain",
                          extra=[(b"x-llmgw-upstream", b"r0"), (b"retry-after", b"3")])


def test_whole_answers_written_in_one_call_keep_every_header_and_framing() -> None:
    """The fast path (issue 27) writes what the message path wrote: status, type, length, extra headers, date;
    HEAD without a body; ``connection: close`` when the client asked; the body limit still refuses."""
    async def main() -> None:
        http, port = await _serving(whole_app)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /w HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
            status, headers, body = await _read_response(reader)
            assert status == b"HTTP/1.1 201 Created" and body == b"got hello"
            assert headers[b"content-type"] == b"text/plain" and headers[b"content-length"] == b"9"
            assert headers[b"x-llmgw-upstream"] == b"r0" and headers[b"retry-after"] == b"3"
            assert b"date" in headers and b"connection" not in headers
            writer.write(b"HEAD /w HTTP/1.1\r\nHost: t\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 201") and b"content-length: 4\r\n" in head
            writer.write(b"POST /w HTTP/1.1\r\nHost: t\r\nContent-Length: 9\r\n\r\ntoo large")
            status, _, body = await _read_response(reader)
            assert status.startswith(b"HTTP/1.1 413") and b"too large" in body
            writer.write(b"POST /w HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            status, headers, body = await _read_response(reader)
            assert body == b"got ok" and headers[b"connection"] == b"close"
            assert await reader.read() == b""  # HEAD's answer had no body, and the server closed after the close
        finally:
            await http.shutdown(1)
    run(main())
