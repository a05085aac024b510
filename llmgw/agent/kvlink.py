"""The agent's end of the KV events link: engines publish to it, it sends sampled digests to the control plane.

For a shard whose spec asks (``ShardSpec.kv_events``: its model routes ``kv_aware``) and whose engine
publishes vLLM's events (vLLM, the sim; rank 0 only), ``attach`` picks two free loopback ports, starts a
``kvfollow.KvFollower`` (it binds the SUB the engine's PUB connects to) and adds ``--kv-events-config``
to the engine's argv (an operator cannot: the flag is reserved, ``core.engines``). Every
``kvdigest.INTERVAL_S`` ``run`` turns each follower's block set into a ``kvdigest.Digest`` (sampled, as
a delta) and sends it on the stream (``AgentMessage.kv_digest``); after every Register (``resend``: a new
leader, or the same one after a break, knows nothing) each replica's next digest is its whole set. A
relaunched engine gets a new follower and a new epoch (its cache is empty); a stopped or failed shard's
follower is closed (``seen``), and the leader drops the replica's set when it leaves the route table.

An engine adopted from a previous agent keeps publishing where it was told: its argv (the state file's)
names the ports, and ``attach`` of that plan binds them again (ZMQ's PUB reconnects by itself); the new
follower's first event is a gap it fills from the engine's replay buffer, as after any break.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

from llmgw.agent import kvfollow
from llmgw.agent.supervisor import launching
from llmgw.api import convert
from llmgw.core import kvdigest
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

log = logging.getLogger(__name__)

PUBLISHERS = kvdigest.PUBLISHERS
TOPIC = "kv"
_ENDED = frozenset({ShardState.STOPPED, ShardState.FAILED})
#: Each replica's whole set is sent again this often: a leader that lost a digest has it back (the leader
#: turns one equal to what it holds into the difference, so routers get only what changed).
FULL_EVERY_S = 30.0


def _arg(args: list[str], name: str) -> str | None:
    found = None
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag == name:
            found = value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return found


def hashing_of(spec: ShardSpec) -> kvdigest.Hashing:
    """How the engine hashes: ``--prefix-caching-hash-algo`` (sha256 by default), its PYTHONHASHSEED ("": unset)
    and its block size until its events say (``--block-size``, else vLLM's default: 16 on a GPU, 128 on a CPU)."""
    args = list(spec.args)
    size = _arg(args, "--block-size")
    default = 16 if spec.gpus or spec.engine == "sim" else 128
    algo = _arg(args, "--prefix-caching-hash-algo") or "sha256"
    return kvdigest.Hashing(int(size) if size and size.isdigit() and int(size) > 0 else default, algo,
                            dict(spec.env).get("PYTHONHASHSEED", ""))


@dataclasses.dataclass
class _Link:
    follower: kvfollow.KvFollower
    sampler: kvdigest.Sampler
    hashing: kvdigest.Hashing
    task: asyncio.Task[None]
    full_at: float = 0.0


class KvLinks:
    """The followers of this node's publishing engines, by shard id, and the loop that sends their digests."""

    def __init__(self, send: Callable[..., None], *, interval_s: float = kvdigest.INTERVAL_S) -> None:
        """``send(kv_digest=pb.KvDigest)``: the stream's ``Outbox.send`` (dropped with no stream up)."""
        self._send = send
        self._interval_s = interval_s
        self._links: dict[str, _Link] = {}

    def attach(self, spec: ShardSpec, plan: launching.Plan) -> launching.Plan:
        """``plan`` with the engine told to publish to a new follower, when ``spec`` asks; else ``plan`` as it is.

        A plan that names its ports already (an adopted engine's argv) is followed on them, unchanged."""
        self.detach(spec.shard_id)
        if not spec.kv_events or spec.engine not in PUBLISHERS or spec.rank > 0:
            return plan
        told = _arg(list(plan.argv), "--kv-events-config")
        if told is not None:
            ends = kvfollow.endpoints_of(told)
            if ends is None:
                log.warning("shard %s: its --kv-events-config is not one this agent wrote; not followed",
                            spec.shard_id)
                return plan
            self._follow(spec, *ends)
            return plan
        pub = launching.free_port("127.0.0.1")
        replay = launching.free_port("127.0.0.1")
        while replay == pub:
            replay = launching.free_port("127.0.0.1")
        self._follow(spec, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")
        config = kvfollow.kv_events_config(pub, replay, topic=TOPIC)
        return dataclasses.replace(plan, argv=[*plan.argv, "--kv-events-config", config])

    def _follow(self, spec: ShardSpec, endpoint: str, replay: str) -> None:
        follower = kvfollow.KvFollower(endpoint, replay, topic=TOPIC)
        task = asyncio.create_task(follower.run(), name=f"kv events {spec.shard_id}")
        self._links[spec.shard_id] = _Link(follower, kvdigest.Sampler(spec.replica_id, time.time_ns()),
                                           hashing_of(spec), task)
        log.info("shard %s publishes its KV cache events to this agent on %s (replay %s)", spec.shard_id,
                 endpoint, replay)

    def detach(self, shard_id: str) -> None:
        link = self._links.pop(shard_id, None)
        if link is not None:
            # Closed once its task has ended: not under a receive in flight.
            link.task.add_done_callback(lambda _t, f=link.follower: f.close())
            link.task.cancel()

    def seen(self, status: ShardStatus) -> None:
        """A shard's status: a stopped or failed one's follower is closed."""
        if status.state in _ENDED:
            self.detach(status.shard_id)

    def resend(self) -> None:
        """A new stream: each replica's next digest is its whole set."""
        for link in self._links.values():
            link.sampler.resend()

    def tick(self, now: float | None = None) -> int:
        """Sends each replica's digest, where it changed; the number sent."""
        now = time.monotonic() if now is None else now
        sent = 0
        for link in self._links.values():
            if now - link.full_at >= FULL_EVERY_S:
                link.full_at = now
                link.sampler.resend()
            blocks = link.follower.blocks
            if blocks.block_size is not None and blocks.block_size != link.hashing.block_size:
                link.hashing = dataclasses.replace(link.hashing, block_size=blocks.block_size)
                link.sampler.resend()  # another sampling rate: the whole set again
            # An engine that has stored nothing yet says so (an empty set): kv_aware then scores it 0, not unknown.
            digest = link.sampler.next(blocks.blocks, link.hashing)
            if digest is not None:
                self._send(kv_digest=convert.digest_to_pb(digest))
                sent += 1
        return sent

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                self.tick()
            except Exception:  # a bug here must not end the node's link for good
                log.exception("sending KV digests failed; trying again")

    def close(self) -> None:
        for shard_id in list(self._links):
            with contextlib.suppress(Exception):
                self.detach(shard_id)
