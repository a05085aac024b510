"""vLLM's ZMQ KV event publisher, mimicked: the same sockets, frames, replay protocol and payload bytes.

Mimics ``ZmqEventPublisher`` of vLLM 0.32 (``vllm/distributed/kv_events.py``, upstream
https://github.com/vllm-project/vllm/blob/main/vllm/distributed/kv_events.py): a PUB socket sends
``(topic, seq as 8 bytes big-endian, payload)`` with ``seq`` counting from 0; a ROUTER on the replay
endpoint answers ``(identity, b"", start_seq)`` with every buffered batch from ``start_seq`` as
``(identity, b"", topic, seq, payload)`` and then ``(identity, b"", b"", -1, b"")``; endpoints with
``*`` (or ipc/inproc) are bound and others connected (the PUB; the replay ROUTER is always bound).
The payload is ``core.kvevents.encode_batch``: byte-for-byte
vLLM's msgspec encoding (a unit test holds it to bytes vLLM made).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

import zmq
import zmq.asyncio

from llmgw.core import kvevents


class KvPublisher:
    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, topic: str = "",
                 buffer_steps: int = 10_000) -> None:
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            self._pub.bind(endpoint)
        else:
            self._pub.connect(endpoint)
        self._replay = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
        self._topic = topic.encode()
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self.seq = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._replay is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def publish(self, batch: kvevents.Batch, *, lose: bool = False) -> int:
        """Sends ``batch`` as the next sequence number (``lose``: buffered for replay but never sent, a lost frame)."""
        seq, self.seq = self.seq, self.seq + 1
        payload = kvevents.encode_batch(batch)
        if not lose:
            await self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        return seq

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                continue  # as vLLM: an invalid replay request is logged and ignored
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
            await self._replay.send_multipart((client, b"", b"", kvevents.END_SEQ, b""))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
