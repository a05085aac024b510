"""The agent's KV event follower against the sim engine's vLLM-format publisher, over real ZMQ sockets on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket

from llmgw.agent import kvfollow
from llmgw.core import kvevents
from llmgw.core.kvevents import Batch, Cleared, Removed, Stored
from llmgw.sim.engine.kvpublish import KvPublisher


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stored(*hashes: int) -> Batch:
    return Batch(1.0, (Stored(hashes, None, tuple(range(16 * len(hashes))), 16),), 0)


async def _until(cond, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def _follow_through_loss_and_restart() -> None:
    pub_port, replay_port = _port(), _port()
    config = json.loads(kvfollow.kv_events_config(pub_port, replay_port, topic="kv"))
    follower = kvfollow.KvFollower(config["endpoint"], config["replay_endpoint"], topic="kv")
    publisher = KvPublisher(config["endpoint"], config["replay_endpoint"], topic="kv")
    publisher.start()
    task = asyncio.create_task(follower.run())
    try:
        # A PUB drops what it sends before the SUB is connected (ZMQ's slow joiner): send until one lands.
        await publisher.publish(_stored(1))
        for _ in range(200):
            if follower.blocks.blocks:
                break
            await asyncio.sleep(0.01)
            await publisher.publish(_stored(1))
        await _until(lambda: follower.blocks.blocks == {1}, "the first batch")
        # Batches the slow joiner dropped are a gap from seq 0, filled from the replay buffer: no resync.
        assert follower.resyncs == 0 and follower.replays <= 1
        replays = follower.replays
        await publisher.publish(_stored(2, 3), lose=True)  # never reaches the follower
        await publisher.publish(Batch(2.0, (Removed((1,)),)))
        await _until(lambda: follower.blocks.blocks == {2, 3}, "the lost batch replayed")
        assert follower.replays == replays + 1 and follower.resyncs == 0
        await publisher.publish(Batch(3.0, (Cleared(),)))
        await _until(lambda: follower.blocks.blocks == set(), "all blocks cleared")
        await publisher.publish(_stored(4))
        await _until(lambda: follower.blocks.blocks == {4}, "stored after the clear")
        follower.restarted()
        assert follower.blocks.blocks == set()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await publisher.close()
        follower.close()


def test_follower_replays_a_lost_batch_and_clears_on_cleared_and_restart() -> None:
    asyncio.run(_follow_through_loss_and_restart())


async def _resync_without_replay() -> None:
    follower = kvfollow.KvFollower(f"tcp://127.0.0.1:{_port()}", None)
    try:
        await follower.take(0, kvevents.encode_batch(_stored(1)))
        await follower.take(5, kvevents.encode_batch(_stored(9)))  # a gap no replay endpoint can fill
        assert follower.blocks.blocks == {9} and follower.resyncs == 1 and follower.blocks.next_seq == 6
        await follower.take(6, b"\xc1")  # not msgpack: resynced, not crashed
        assert follower.resyncs == 2 and follower.blocks.blocks == set()
    finally:
        follower.close()


def test_follower_without_replay_resyncs_on_a_gap_or_a_bad_batch() -> None:
    asyncio.run(_resync_without_replay())
