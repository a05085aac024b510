"""A TLS-terminating relay in front of an engine that cannot serve TLS itself: standard library only.

The xllamacpp wheels are built without SSL (2026.10.11549: ``ssl_file_key``/``ssl_file_cert`` make ``Server()``
fail with "the server is built without SSL support"), so the llama.cpp launcher serves llama.cpp on a loopback
port and this relay on the address and port it was given: it accepts TLS with the node's engine certificate and
copies bytes both ways to the engine, nothing else (the engine still checks its bearer key). It runs in the
launcher's process, as the engine's user, so it lives and dies with the engine (an agent restarted under a
running engine leaves it serving). One asyncio loop on a thread of its own; Nagle off on both sides, so a
streamed token is not held back waiting for the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading

CHUNK = 64 * 1024


def server_context(keyfile: str, certfile: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        writer.close()


async def _relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, upstream: tuple[str, int]) -> None:
    _nodelay(client_w)
    try:
        engine_r, engine_w = await asyncio.open_connection(*upstream)
    except OSError:
        client_w.close()
        return
    _nodelay(engine_w)
    # Either side ending ends both: an HTTP client that leaves mid-answer stops the engine's writes too.
    await asyncio.gather(_pipe(client_r, engine_w), _pipe(engine_r, client_w), return_exceptions=True)


async def start(host: str, port: int, ctx: ssl.SSLContext, upstream: tuple[str, int]) -> asyncio.Server:
    """Listens on ``host:port`` with TLS and relays each connection to ``upstream`` (plain TCP)."""
    return await asyncio.start_server(lambda r, w: _relay(r, w, upstream), host, port, ssl=ctx,
                                      reuse_address=True, ssl_handshake_timeout=10.0)


def run_in_thread(host: str, port: int, ctx: ssl.SSLContext, upstream: tuple[str, int]) -> tuple[str, int]:
    """Starts the relay on a daemon thread; returns the address it listens on (OSError when it cannot bind)."""
    loop = asyncio.new_event_loop()
    started: list[asyncio.Server] = []
    failed: list[BaseException] = []
    ready = threading.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            started.append(loop.run_until_complete(start(host, port, ctx, upstream)))
        except BaseException as e:  # told to the caller, which exits with it
            failed.append(e)
            ready.set()
            return
        ready.set()
        loop.run_forever()

    threading.Thread(target=main, name="tls relay", daemon=True).start()
    ready.wait()
    if failed:
        raise failed[0]
    bound = started[0].sockets[0].getsockname()
    return str(bound[0]), int(bound[1])
