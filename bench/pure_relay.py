"""The floor under any Python router: an HTTP/1.1 relay with no features, for ``router_costs.py``'s ratio.

One ``asyncio.Protocol`` per client connection on uvloop. Each whole request (request line, headers with
``Content-Length``, body) is written as it came to a keep-alive connection to one of the upstreams
(round robin, a pool of idle connections per upstream), and the answer is copied back to the client as
the upstream writes it, bytes untouched, until its end (``Content-Length`` or the last chunk of a
chunked body). No routing table, keys, limits, parsing of JSON, shaping, metering, metrics or logging:
what a request costs here is what moving its bytes through Python and the kernel costs, so llmgw's
cost over it is what its features and its structure cost.

It expects well-behaved peers (wrk and ``fast_upstream.py``): no pipelining, no chunked requests.

    python bench/pure_relay.py --port 9100 --upstream http://127.0.0.1:9000 [--upstream ...]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import sys
from collections import deque

_CL = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[ \t]*chunked", re.IGNORECASE)


class Upstream(asyncio.Protocol):
    """A keep-alive connection to an upstream: sends one request, copies its answer to ``client``."""

    def __init__(self, pool: deque[Upstream]) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.client: Client | None = None
        self._head = b""
        self._left = -1  # body bytes left (Content-Length); -2: chunked, look for the last chunk
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, client: Client, data: bytes) -> None:
        self.client, self._head, self._left, self._tail = client, b"", -1, b""
        assert self.transport is not None
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None or client.transport is None:
            return
        client.transport.write(data)
        if self._left == -1:  # the head is still arriving
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            match = _CL.search(self._head, 0, end + 2)
            if match:
                self._left = int(match.group(1)) - (len(self._head) - end - 4)
            elif _CHUNKED.search(self._head, 0, end + 2):
                self._left = -2
                data = self._head[end + 4:]
            else:
                self._left = 0
            self._head = b""
            if self._left >= 0:
                data = b""
        elif self._left >= 0:
            self._left -= len(data)
        if self._left == -2:
            self._tail = (self._tail + data)[-7:]
            done = self._tail.endswith(b"0\r\n\r\n")
        else:
            done = self._left <= 0
        if done:
            self.client = None
            self.pool.append(self)
            client.answered()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)
        if self.client is not None and self.client.transport is not None:
            self.client.transport.close()


class Client(asyncio.Protocol):
    """One client connection: each whole request goes to an upstream connection."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self._buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            self._buf = buf
            return
        match = _CL.search(buf, 0, end + 2)
        if len(buf) < end + 4 + (int(match.group(1)) if match else 0):
            self._buf = buf
            return
        self._buf = b""
        self.relay.forward(self, buf)

    def answered(self) -> None:
        pass


class Relay:
    def __init__(self, upstreams: list[tuple[str, int]]) -> None:
        self.upstreams = upstreams
        self.pools: dict[tuple[str, int], deque[Upstream]] = {u: deque() for u in upstreams}
        self._next = itertools.cycle(upstreams)

    def forward(self, client: Client, data: bytes) -> None:
        target = next(self._next)
        pool = self.pools[target]
        if pool:
            pool.pop().send(client, data)
        else:
            asyncio.ensure_future(self._connect(target, client, data))

    async def _connect(self, target: tuple[str, int], client: Client, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        pool = self.pools[target]
        _, upstream = await loop.create_connection(lambda: Upstream(pool), *target)
        upstream.send(client, data)


async def serve(host: str, port: int, upstreams: list[tuple[str, int]]) -> None:
    relay = Relay(upstreams)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(relay), host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--upstream", action="append", required=True, help="http://HOST:PORT, repeated")
    args = parser.parse_args(argv)
    targets = []
    for url in args.upstream:
        host, _, port = url.removeprefix("http://").rstrip("/").rpartition(":")
        targets.append((host, int(port)))
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    try:
        run(serve(args.host, args.port, targets))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
