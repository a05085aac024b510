"""Following one local vLLM engine's KV cache events: its block set, kept whole through gaps and restarts.

The agent starts each vLLM replica with ``--kv-events-config`` naming loopback endpoints it chose
(``kv_events_config``), so no router needs to reach an engine's ZMQ ports. vLLM binds a PUB
endpoint holding ``*`` (every interface) and connects to any other, so the agent gives
``tcp://127.0.0.1:PORT`` and binds the SUB there itself: nothing listens beyond loopback but the
replay ROUTER, which vLLM always binds (on the loopback address given). A ``KvFollower`` per
replica subscribes, applies each batch to a ``core.kvevents.ReplicaBlocks`` and, on a sequence
gap, asks the engine's replay endpoint for the missed batches (vLLM keeps ``buffer_steps`` of
them); when the replay cannot cover the gap the set is resynced (cleared and trusted from the
live stream on: a block missing from the set costs a worse score, a stale one a wrong pick). An
engine restart (``restarted``, called by the supervisor; also seen as sequence 0 again) clears it.
"""

from __future__ import annotations

import asyncio
import json
import logging

import zmq
import zmq.asyncio

from llmgw.core import kvevents

log = logging.getLogger(__name__)

#: How long a replay may take before the set is resynced instead.
REPLAY_TIMEOUT_S = 5.0


def kv_events_config(pub_port: int, replay_port: int, *, topic: str = "") -> str:
    """The ``--kv-events-config`` value for an engine publishing on loopback ports the agent chose."""
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                       "endpoint": f"tcp://127.0.0.1:{pub_port}",  # no '*': vLLM connects to the follower's SUB
                       "replay_endpoint": f"tcp://127.0.0.1:{replay_port}", "topic": topic})


def endpoints_of(config: str) -> tuple[str, str] | None:
    """(endpoint, replay endpoint) of a ``--kv-events-config`` this agent wrote (loopback tcp); None for another."""
    try:
        doc = json.loads(config)
    except ValueError:
        return None
    ends = (doc.get("endpoint"), doc.get("replay_endpoint")) if isinstance(doc, dict) else (None, None)
    if not all(isinstance(e, str) and e.startswith("tcp://127.0.0.1:") and e.rsplit(":", 1)[1].isdigit()
               for e in ends):
        return None
    return ends[0], ends[1]  # type: ignore[return-value]


class KvFollower:
    def __init__(self, endpoint: str, replay_endpoint: str | None, *, topic: str = "") -> None:
        self.endpoint, self.replay_endpoint, self.topic = endpoint, replay_endpoint, topic.encode()
        self.blocks = kvevents.ReplicaBlocks()
        # The engine counts from 0: a first batch past that is a gap, filled from its replay buffer (the PUB
        # connected late, or the engine was adopted from a previous agent and published before this follower).
        self.blocks.next_seq = 0
        self.replays = 0
        self.resyncs = 0
        self._ctx = zmq.asyncio.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self._sub.bind(endpoint)  # the engine's PUB connects here (see the module docstring)

    def restarted(self) -> None:
        """The engine process was restarted: its cache is empty."""
        self.blocks.clear()

    async def run(self) -> None:
        """Follows the stream until cancelled."""
        while True:
            frames = await self._sub.recv_multipart()
            if len(frames) != 3:
                continue
            _, seq_bytes, payload = frames
            await self.take(int.from_bytes(seq_bytes, "big"), payload)

    async def take(self, seq: int, payload: bytes) -> None:
        try:
            gap = self.blocks.apply(seq, payload)
        except ValueError:
            log.warning("KV event batch %d from %s is not vLLM's format: the replica's block set is resynced",
                        seq, self.endpoint)
            self.resyncs += 1
            self.blocks.resync(seq + 1)
            return
        if gap is None:
            return
        if not await self._replay(gap.start) or (self.blocks.next_seq or 0) <= seq:
            self.resyncs += 1
            self.blocks.resync(seq)
            self.blocks.apply(seq, payload)

    async def _replay(self, start: int) -> bool:
        """Applies the batches the replay endpoint still holds from ``start``; False when it could not."""
        if self.replay_endpoint is None:
            return False
        self.replays += 1
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        try:
            await dealer.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_S)
                if len(frames) != 4:
                    return False
                _, _, seq_bytes, payload = frames
                if seq_bytes == kvevents.END_SEQ:
                    return True
                if self.blocks.apply(int.from_bytes(seq_bytes, "big"), payload) is not None:
                    return False  # the buffer no longer reaches back to ``start``
        except (TimeoutError, ValueError):
            return False
        finally:
            dealer.close(linger=0)

    def close(self) -> None:
        self._sub.close(linger=0)
        self._ctx.term()
