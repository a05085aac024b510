"""The HTTP server's limits on reading requests (``llmgw.router.limits``), on real loopback sockets.

A client that sends half a header line, or a body that stops, is answered 408 and disconnected after the
(shortened) timeout; one address past its connection cap gets 503 while another address is still served;
and a response that streams for longer than every timeout is not cut, since they bound reading only.
No timed assertion: each test waits for the server to act, bounded by a generous outer timeout.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

from llmgw.router import limits, server
from llmgw.testing.procs import free_port
from llmgw.testing.system import System


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers the body's length; for /stream, ten SSE events 0.1 s apart (a second: past every timeout set)."""
    body = (await receive())["body"]
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(10):
            await asyncio.sleep(0.1)
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"%d" % len(body), "more_body": False})


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))


async def _serving(lim: limits.Limits) -> tuple[server.Server, int]:
    port = free_port()
    http = server.Server(_app, limits=lim)
    await http.start("127.0.0.1", port)
    return http, port


async def _open(port: int, *, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


def test_half_a_header_line_is_answered_408_and_disconnected() -> None:
    """The client sends part of its request line and stops: 408, then the server closes."""
    async def main() -> None:
        http, port = await _serving(limits.Limits(header_timeout_s=0.3, idle_timeout_s=0))
        try:
            reader, writer = await _open(port)
            writer.write(b"POST /v1/chat/compl")
            await writer.drain()
            got = await reader.read()  # until the server closes: it never would without the timeout
            assert got.startswith(b"HTTP/1.1 408 "), got
            assert b"request_timeout" in got and b"headers within 0.3 s" in got
            writer.close()
        finally:
            await http.shutdown(1)
    run(main())


def test_a_header_block_sent_a_line_at_a_time_is_still_bounded() -> None:
    """Trickling header lines does not reset the header deadline: it runs from the request's first byte."""
    async def main() -> None:
        http, port = await _serving(limits.Limits(header_timeout_s=0.5, idle_timeout_s=0))
        try:
            reader, writer = await _open(port)
            writer.write(b"GET / HTTP/1.1\r\n")
            closed = asyncio.create_task(reader.read())
            for i in range(100):  # 10 s of trickling, unless the server closes first
                if closed.done():
                    break
                writer.write(b"X-Pad-%d: y\r\n" % i)
                await asyncio.sleep(0.1)
            got = await closed
            assert got.startswith(b"HTTP/1.1 408 "), got
            writer.close()
        finally:
            await http.shutdown(1)
    run(main())


def test_a_body_that_stops_is_answered_408_and_disconnected() -> None:
    """Headers promise 100 bytes, 10 arrive, then nothing: 408 after the body timeout, and the close."""
    async def main() -> None:
        http, port = await _serving(limits.Limits(body_timeout_s=0.3, idle_timeout_s=0))
        try:
            reader, writer = await _open(port)
            writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789")
            await writer.drain()
            got = await reader.read()
            assert got.startswith(b"HTTP/1.1 408 "), got
            assert b"no pause over 0.3 s" in got
            writer.close()
        finally:
            await http.shutdown(1)
    run(main())


def test_a_slow_body_that_keeps_moving_is_read_whole() -> None:
    """A body in pieces, each pause under the timeout though the whole takes longer, is answered 200."""
    async def main() -> None:
        http, port = await _serving(limits.Limits(header_timeout_s=0.5, body_timeout_s=0.5, idle_timeout_s=0))
        try:
            reader, writer = await _open(port)
            writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n")
            for _ in range(10):
                writer.write(b"x")
                await asyncio.sleep(0.15)  # 1.5 s for the body, every pause 0.15 s
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 "), head
            writer.close()
        finally:
            await http.shutdown(1)
    run(main())


def test_past_the_cap_an_address_gets_503_while_another_is_served() -> None:
    """N connections from 127.0.0.1 are held; the N+1st gets 503 and is closed; 127.0.0.2 is still served."""
    async def main() -> None:
        http, port = await _serving(limits.Limits(max_per_address=3, idle_timeout_s=0))
        try:
            held = [await _open(port) for _ in range(3)]
            for reader, writer in held:  # each answered, so each is surely accepted and counted
                writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
            reader, writer = await _open(port)
            got = await reader.read()
            assert got.startswith(b"HTTP/1.1 503 "), got
            assert b"too_many_connections" in got
            writer.close()
            other_reader, other_writer = await _open(port, source="127.0.0.2")
            other_writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await other_reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
            other_writer.close()
            # One held connection closed frees its place for the next from that address. The server closes
            # it (Connection: close), so the client's EOF comes after the server counted it gone.
            held[0][1].write(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            assert b"HTTP/1.1 200 " in await held[0][0].read()  # after the first answer's body, "0"
            again_reader, again_writer = await _open(port)
            again_writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert (await again_reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
            again_writer.close()
            for _, writer in held:
                writer.close()
        finally:
            await http.shutdown(1)
    run(main())


def test_a_stream_longer_than_every_timeout_is_not_cut() -> None:
    """The timeouts bound reading the request: a 1 s SSE answer with 0.2 s limits arrives whole."""
    async def main() -> None:
        http, port = await _serving(limits.Limits(header_timeout_s=0.2, body_timeout_s=0.2, idle_timeout_s=0.2))
        try:
            reader, writer = await _open(port)
            writer.write(b"POST /stream HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head
            body = await reader.readuntil(b"0\r\n\r\n")
            assert all(b"data: %d" % i in body for i in range(10)), body
            writer.close()
        finally:
            await http.shutdown(1)
    run(main())


def test_limits_refuse_negative_values() -> None:
    """A negative timeout or cap is a ValueError naming it, not a server that closes everything at once."""
    for bad in ({"header_timeout_s": -1.0}, {"body_timeout_s": float("inf")}, {"max_per_address": -1}):
        try:
            limits.Limits(**bad)  # type: ignore[arg-type]
        except ValueError as e:
            assert "expected" in str(e)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_127_0_0_2_is_a_loopback_source_here() -> None:
    """The cap test's second address: Linux routes all of 127/8 to lo, so a socket may bind it."""
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))


def test_llmgw_server_takes_the_limits_from_its_flags(tmp_path: Path) -> None:
    """`llmgw server --header-timeout 0.5`: its HTTP port closes a half-sent request with 408."""
    system = System(tmp_path, secure=False, server_args=["--header-timeout", "0.5"])
    try:
        system.start_server()
        with socket.create_connection(("127.0.0.1", system.http_port), timeout=30) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHo")
            got = b""
            while chunk := s.recv(4096):  # until the server closes
                got += chunk
        assert got.startswith(b"HTTP/1.1 408 "), got
    finally:
        system.close()
