"""A tunnel stream as an asyncio transport: what ``router.client.Connection`` runs on for a tunnelled engine.

Everything the connection does to a socket it does here: ``write`` sends DATA (held while the stream's send
window is shut), ``pause_reading``/``resume_reading`` hold what arrives and the credit with it (so the agent stops
reading the engine: back-pressure), ``close`` ends the stream (the agent closes the engine's connection, which
stops its generation, as a client's disconnect does). A stream that ends is ``connection_lost``: cleanly (the
engine closed) with no exception, else with ``ConnectionResetError`` naming why (the tunnel went down).
"""

from __future__ import annotations

import asyncio
from typing import Any

from llmgw.api import tunnel


class StreamTransport(asyncio.Transport):
    def __init__(self, stream: tunnel.Stream, protocol: asyncio.Protocol, node: str) -> None:
        super().__init__()
        self._stream = stream
        self._protocol = protocol
        self._node = node
        self._loop = asyncio.get_running_loop()
        self._lost = False
        stream.on_data = protocol.data_received
        stream.on_close = self._ended

    def _ended(self, why: str) -> None:
        self._lose(ConnectionResetError(why) if why else None)

    def _lose(self, exc: Exception | None) -> None:
        if not self._lost:
            self._lost = True
            self._protocol.connection_lost(exc)

    # -- asyncio.Transport --

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._stream.write(bytes(data))

    def is_closing(self) -> bool:
        return self._stream.closed or self._lost

    def close(self) -> None:
        self._stream.close()
        if not self._lost:
            self._loop.call_soon(self._lose, None)

    def abort(self) -> None:
        self.close()

    def pause_reading(self) -> None:
        self._stream.pause()

    def resume_reading(self) -> None:
        self._stream.resume()

    def is_reading(self) -> bool:
        return not self._stream.paused

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return len(self._stream.pending)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]
        self._stream.on_data = self._protocol.data_received

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return ("tunnel", self._node)
        return default
