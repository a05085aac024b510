"""What the agent sends the control plane: numbered messages on the live stream's queue, none without one.

Shard statuses, acks, log replies and heartbeats are all put here by whoever has them; one writer task
(``stream``) drains the queue onto the gRPC call, which allows only one write in flight. With no stream up a
message is dropped: the next Register resends the state it carried (the shards, their statuses).
"""

from __future__ import annotations

import asyncio
import itertools

from llmgw.api.v1 import agent_pb2 as pb


class Outbox:
    """The live stream's outgoing queue (None between streams) and the sequence numbers of what goes on it."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[pb.AgentMessage] | None = None
        self._seq = itertools.count(1)

    def message(self, **body: object) -> pb.AgentMessage:
        """An AgentMessage with the next sequence number (for one sent on a call directly: the Register)."""
        return pb.AgentMessage(seq=next(self._seq), **body)  # type: ignore[arg-type]

    def send(self, **body: object) -> None:
        """Queues an AgentMessage with ``body`` on the live stream; dropped when none is up."""
        if self.queue is not None:
            self.queue.put_nowait(self.message(**body))

    def ack(self, seq: int, *, error: str = "") -> None:
        """Answers command ``seq``: done, or refused with ``error``."""
        self.send(ack=pb.Ack(seq=seq, ok=not error, error=error))
