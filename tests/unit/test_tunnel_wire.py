"""The tunnel's wire (``api/tunnel.py``) over a real socket pair: frames cut anywhere still parse, a frame over the
limit ends the tunnel (not a tunnel peer), an OPEN naming no port is refused, and a stream's window holds its sender
until the receiver's consumer reads (credit)."""

from __future__ import annotations

import asyncio
import socket

from llmgw.api import tunnel


async def pair(on_open=None) -> tuple[tunnel.Mux, tunnel.Mux, socket.socket]:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    _, opener = await loop.create_connection(lambda: tunnel.Mux(opener=True), sock=a)
    _, agent = await loop.create_connection(lambda: tunnel.Mux(opener=False, on_open=on_open), sock=b)
    return opener, agent, b


def test_frames_cut_anywhere_parse_and_an_oversized_one_ends_the_tunnel() -> None:
    async def main() -> None:
        got: list[bytes] = []

        async def accept(stream: tunnel.Stream, port: int) -> str:
            stream.on_data = got.append
            return "" if port == 8001 else f"port {port} is not an engine here"

        opener, agent, _ = await pair(accept)
        stream = await opener.open(8001, 5)
        # Two DATA frames delivered to the agent's parser a byte at a time.
        raw = tunnel.frame(tunnel.DATA, stream.sid, b"hello ") + tunnel.frame(tunnel.DATA, stream.sid, b"world")
        for i in range(len(raw)):
            agent.data_received(raw[i:i + 1])
        assert b"".join(got) == b"hello world"
        try:
            await opener.open(22, 5)
        except tunnel.TunnelError as exc:
            assert "port 22 is not an engine here" in str(exc)
        else:
            raise AssertionError("a port that is not an engine was opened")
        agent.data_received(tunnel.frame(tunnel.OPEN, 99, b"not-a-port"))
        for _ in range(500):  # the refusal is sent by a task of the agent's: until it ran
            if 99 not in agent.streams:
                break
            await asyncio.sleep(0.01)
        assert 99 not in agent.streams
        agent.data_received(b"\x04\x00\x00\x00\x01\xff\xff\xff\xff")  # a 4 GiB frame: not a tunnel peer
        assert agent.lost and "over the limit" in agent.why_lost
    asyncio.run(main())


def test_the_window_holds_the_sender_until_the_consumer_reads() -> None:
    async def main() -> None:
        accepted: list[tunnel.Stream] = []

        async def accept(stream: tunnel.Stream, port: int) -> str:
            accepted.append(stream)
            return ""

        opener, agent, _ = await pair(accept)
        stream = await opener.open(8001, 5)
        stream.pause()  # the router's client stopped reading
        blocked: list[bool] = []
        far = accepted[0]
        far.on_blocked = blocked.append
        far.write(b"x" * (tunnel.WINDOW + 1000))
        assert blocked == [True] and len(far.pending) == 1000 and far.blocked  # shut: the engine's reads pause
        received: list[bytes] = []
        stream.on_data = received.append
        stream.resume()  # the client reads: credit flows back, the rest is sent
        for _ in range(500):  # until the credit came back and the rest arrived
            if not far.pending and sum(map(len, received)) == tunnel.WINDOW + 1000:
                break
            await asyncio.sleep(0.01)
        assert blocked == [True, False] and sum(map(len, received)) == tunnel.WINDOW + 1000
    asyncio.run(main())
