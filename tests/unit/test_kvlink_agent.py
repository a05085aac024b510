"""The agent's end of the KV link: which engines are told to publish (and to whom), what the digests carry,
the whole set again after a new stream (a failover to a standby, which knows nothing), and the flag an
operator may not set."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent import kvlink
from llmgw.agent.supervisor import launching
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core import errors, kvevents
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.core.specengine import parse_engine_args

SPEC = ShardSpec(shard_id="s1", replica_id="r1", model="m", engine="sim", served_name="m", kv_events=True)
PLAN = launching.Plan(argv=["python", "-m", "llmgw.sim.engine"], env={}, endpoint="http://127.0.0.1:1",
                      health_path="/health", log_path=Path("/nonexistent"))


def test_only_a_kv_aware_publishing_rank_0_is_told_and_the_endpoints_are_loopback() -> None:
    async def main() -> None:
        sent: list[pb.KvDigest] = []
        links = kvlink.KvLinks(lambda **body: sent.append(body["kv_digest"]))
        try:
            for spec in (dataclasses.replace(SPEC, kv_events=False), dataclasses.replace(SPEC, engine="llamacpp"),
                         dataclasses.replace(SPEC, nnodes=2, rank=1)):
                assert links.attach(spec, PLAN) is PLAN
            plan = links.attach(SPEC, PLAN)
            assert plan.argv[:-2] == PLAN.argv and plan.argv[-2] == "--kv-events-config"
            cfg = json.loads(plan.argv[-1])
            assert cfg["endpoint"].startswith("tcp://127.0.0.1:") and cfg["replay_endpoint"].startswith("tcp://127.0.0.1:")
            # Nothing stored yet: an empty whole set (the router scores it 0, not unknown), then nothing.
            assert links.tick() == 1 and sent[0].full and list(sent[0].added) == [] and sent[0].block_size == 16
            assert links.tick() == 0
            follower = links._links["s1"].follower
            batch = kvevents.Batch(0.0, (kvevents.Stored((8, 9, 16), None, tuple(range(48)), 16),))
            follower.blocks.apply(0, kvevents.encode_batch(batch))
            assert links.tick() == 1 and not sent[-1].full and sorted(sent[-1].added) == [8, 16]
            # A new stream (after a Register with a new leader): the whole set again.
            links.resend()
            assert links.tick() == 1 and sent[-1].full and sorted(sent[-1].added) == [8, 16]
            d = convert.digest_from_pb(sent[-1])
            assert (d.replica_id, d.seq, d.hashing.algo) == ("r1", 3, "sha256")
            # The engine stops: its follower goes, and nothing more is sent for it.
            links.seen(ShardStatus(shard_id="s1", replica_id="r1", state=ShardState.STOPPED))
            assert links.tick() == 0
            await asyncio.sleep(0)
        finally:
            links.close()

    asyncio.run(main())


def test_the_engines_hashing_comes_from_its_flags_and_env() -> None:
    spec: Any = dataclasses.replace(SPEC, engine="vllm", args=("--block-size", "32",
                                                                "--prefix-caching-hash-algo=sha256_cbor"),
                                    env=(("PYTHONHASHSEED", "0"),))
    h = kvlink.hashing_of(spec)
    assert (h.block_size, h.algo, h.seed) == (32, "sha256_cbor", "0")
    assert kvlink.hashing_of(dataclasses.replace(SPEC, engine="vllm")).block_size == 128  # vLLM on a CPU
    assert kvlink.hashing_of(dataclasses.replace(SPEC, engine="vllm", gpus=(0,))).block_size == 16


@pytest.mark.parametrize("engine", ["vllm", "sim", "sglang"])
def test_an_operator_cannot_point_an_engines_event_publisher_anywhere(engine: str) -> None:
    with pytest.raises(errors.SpecError, match="--kv-events-config is set by llmgw itself"):
        parse_engine_args(["--kv-events-config", '{"endpoint": "tcp://*:5557"}'], engine)
