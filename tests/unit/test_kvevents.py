"""``core.kvevents`` and ``core.msgpackmini`` against a batch vLLM's own classes encoded; the block set's rules."""

from __future__ import annotations

import json
import pathlib

import pytest

from llmgw.core import kvevents, kvhash, msgpackmini
from llmgw.core.kvevents import Batch, Cleared, Gap, Removed, ReplicaBlocks, Stored

CASES = json.loads((pathlib.Path(__file__).parents[1] / "fixtures/vllm_kv/hashes.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[f"{c['algo']}-seed{c['pythonhashseed']}" for c in CASES])
def test_vllm_batch_decodes_and_reencodes_byte_for_byte(case: dict) -> None:
    payload = bytes.fromhex(case["batch_msgpack"])
    batch = kvevents.decode_batch(payload)
    ext, tokens = case["external"], case["tokens"]
    assert batch.ts == 1700000000.5 and batch.dp_rank == 0
    assert batch.events == (Stored(tuple(ext[:2]), None, tuple(tokens[:32]), 16, "GPU"),
                            Stored(tuple(ext[2:]), ext[1], tuple(tokens[32:64]), 16, "GPU"),
                            Removed((ext[3],), "GPU"), Cleared())
    assert kvevents.encode_batch(batch) == payload


def test_array_like_events_of_older_releases_decode() -> None:
    payload = msgpackmini.encode([1.0, [["BlockStored", [7, 8], None, list(range(32)), 16, None, "GPU"],
                                        ["BlockRemoved", [7], "GPU"], ["AllBlocksCleared"]]])
    batch = kvevents.decode_batch(payload)
    assert batch.events == (Stored((7, 8), None, tuple(range(32)), 16, "GPU"), Removed((7,), "GPU"), Cleared())


def test_msgpack_round_trips_every_width() -> None:
    values = [None, True, False, 0, 127, 128, 255, 65535, 65536, 2**32, 2**64 - 1, -1, -32, -33, -129,
              -(2**31) - 1, -(2**63), 1.5, "", "x" * 31, "y" * 300, b"", b"z" * 70000, list(range(20)),
              {"k": [1, {"n": None}]}, {str(i): i for i in range(20)}]
    for v in values:
        assert msgpackmini.decode(msgpackmini.encode(v)) == v
    with pytest.raises(msgpackmini.MsgpackError):
        msgpackmini.decode(b"\x92\x01")  # an array of two holding one
    with pytest.raises(msgpackmini.MsgpackError):
        msgpackmini.decode(b"\xc7\x01\x01\x00")  # an ext type
    with pytest.raises(ValueError, match="array"):
        kvevents.decode_batch(msgpackmini.encode({"ts": 1}))


def _batch(*events: kvevents.Event) -> bytes:
    return kvevents.encode_batch(Batch(0.0, events))


def test_block_set_follows_store_remove_clear_and_media() -> None:
    r = ReplicaBlocks()
    assert r.apply(0, _batch(Stored((1, 2, 3), None, tuple(range(48)), 16))) is None
    assert r.blocks == {1, 2, 3} and r.block_size == 16
    r.apply(1, _batch(Removed((2,)), Stored((9,), None, (), 16, medium="CPU")))
    assert r.blocks == {1, 3}  # the CPU offload tier's block is not the accelerator's
    r.apply(2, _batch(Cleared()))
    assert r.blocks == set()


def test_gap_asks_replay_duplicates_skip_and_restart_clears() -> None:
    r = ReplicaBlocks()
    r.apply(5, _batch(Stored((1,), None, (), 16)))  # joined mid-stream: trusted from here
    assert r.apply(7, _batch(Stored((3,), None, (), 16))) == Gap(6)
    assert r.blocks == {1}  # nothing applied past the gap
    # The replay from 6 brings 6 and 7 again; then the live 7 arrives a second time.
    assert r.apply(6, _batch(Stored((2,), None, (), 16))) is None
    assert r.apply(7, _batch(Stored((3,), None, (), 16))) is None
    v = r.version
    assert r.apply(7, _batch(Removed((1, 2, 3)))) is None and r.blocks == {1, 2, 3} and r.version == v
    assert r.apply(0, _batch(Stored((50,), None, (), 16))) is None  # a restarted engine begins at 0
    assert r.blocks == {50} and r.next_seq == 1
    r.resync(10)
    assert r.blocks == set() and r.apply(10, _batch(Stored((4,), None, (), 16))) is None and r.blocks == {4}


REAL = json.loads((pathlib.Path(__file__).parents[1] / "fixtures/vllm_kv/real_cpu_capture.json").read_text())


def test_a_real_vllm_cpu_engines_batch_matches_our_hashes_and_reencodes() -> None:
    """A batch a real vLLM 0.32 CPU engine published (its provenance is in the fixture): what the router computes
    for the same token ids is what the engine published, and ``encode_batch`` (the sim's) writes the same bytes."""
    payload = bytes.fromhex(REAL["payload"])
    batch = kvevents.decode_batch(payload)
    (stored,) = batch.events
    assert isinstance(stored, Stored) and stored.block_size == 128 and stored.group_idx == 0
    mine = [kvhash.external(h) for h in kvhash.block_hashes(REAL["tokens"], stored.block_size)]
    assert list(stored.hashes) == mine and len(mine) == 2
    assert stored.token_ids == tuple(REAL["tokens"][:256])
    assert kvevents.encode_batch(batch) == payload
