"""The KV link's pure parts: sampling, the agent's digests, the leader's sets and log, the wire document,
and the router's match on sampled sets (``core.kvdigest``, ``api.kvdocs``, ``router.kvfeed.apply``).
"""

from __future__ import annotations

import random

import pytest

from llmgw.api import convert, kvdocs
from llmgw.api.reports import WireError
from llmgw.core import kvdigest, kvhash
from llmgw.router import kvfeed, kvview, pick, policies
from llmgw.router.kvview import KvView
from llmgw.router.table import Endpoint

H16 = kvdigest.Hashing(16)


def test_keys_are_the_low_64_bits_and_one_block_in_128_tokens_is_sampled() -> None:
    digest = kvhash.digest("sha256", "x")
    assert kvdigest.key64(digest) == kvhash.external(digest) == kvdigest.key64(kvhash.external(digest))
    assert kvdigest.rate(16) == 8 and kvdigest.rate(128) == 1 and kvdigest.rate(256) == 1
    keys = [random.Random(1).getrandbits(64) for _ in range(1)] + list(range(8000))
    share = sum(kvdigest.sampled(k, 8) for k in keys) / len(keys)
    assert 0.1 < share < 0.15
    assert all(kvdigest.sampled(k, 1) for k in (1, 3, 7))


def test_the_agent_sends_the_whole_set_first_then_deltas_and_the_whole_set_again_after_a_register() -> None:
    s = kvdigest.Sampler("r1", epoch=7)
    assert s.next([8, 16], None) is None  # no block size known yet: nothing to say
    d = s.next([8, 16, 3, 5], H16)
    assert d is not None and d.full and sorted(d.added) == [8, 16] and d.seq == 1 and d.epoch == 7
    assert s.next([8, 16, 3], H16) is None  # unsampled blocks moved: nothing to send
    d = s.next([16, 24], H16)
    assert d is not None and not d.full and d.added == (24,) and d.removed == (8,) and d.seq == 2
    s.resend()
    d = s.next([16, 24], H16)
    assert d is not None and d.full and sorted(d.added) == [16, 24] and d.seq == 3


def test_the_leader_logs_changes_resets_a_router_it_cannot_bring_forward_and_drops_on_a_gap() -> None:
    sets = kvdigest.Sets(log_size=3)
    assert sets.apply(kvdigest.Digest("r1", 1, 1, H16, (8, 16), full=True))
    assert sets.apply(kvdigest.Digest("r1", 1, 2, H16, (24,), (8,)))
    assert sets.replicas["r1"].keys == {16, 24}
    assert [c.added for c in sets.since(1) or []] == [(24,)]
    assert sets.since(sets.version) == []
    # A delta after a lost one: the set is no longer known, so it goes (routers are told: gone).
    assert not sets.apply(kvdigest.Digest("r1", 1, 4, H16, (32,)))
    assert "r1" not in sets.replicas and (sets.since(2) or [])[-1].gone
    # A new engine (epoch) replaces the set whole; the same engine's whole set again is logged as a difference.
    assert sets.apply(kvdigest.Digest("r1", 2, 1, H16, (8,), full=True))
    assert sets.apply(kvdigest.Digest("r1", 2, 2, H16, (8, 40), full=True))
    last = (sets.since(sets.version - 1) or [])[-1]
    assert not last.full and last.added == (40,) and last.removed == ()
    assert sets.since(0) is None  # the log (3 entries) no longer reaches back: the router takes a snapshot
    assert [(c.replica_id, sorted(c.added), c.full) for c in sets.snapshot()] == [("r1", [8, 40], True)]
    sets.keep_only(["r9"])
    assert sets.replicas == {} and (sets.since(sets.version - 1) or [])[-1].gone


def test_the_document_and_the_proto_carry_everything_and_a_bad_document_names_its_field() -> None:
    doc = kvdocs.KvDoc(5, False, (kvdigest.Change(5, "r1", H16, (1, 2**64 - 1), (3,)),
                                   kvdigest.Change(5, "r2", gone=True)), "abc")
    back = kvdocs.KvDoc.from_doc(doc.to_doc())
    assert back == doc
    with pytest.raises(WireError, match=r"changes\[0\].added"):
        kvdocs.KvDoc.from_doc({"version": 1, "changes": [{"replica": "r", "block_size": 16, "added": "AAA"}]})
    d = kvdigest.Digest("r1", 9, 3, kvdigest.Hashing(16, "sha256_cbor", "0"), (2**64 - 1,), (5,), True)
    assert convert.digest_from_pb(convert.digest_to_pb(d)) == d


def _hashes(tokens: list[int]) -> list[int]:
    return [int(kvhash.external(h)) for h in kvhash.block_hashes(tokens, 16)]


def test_a_router_matches_the_longest_prefix_on_the_sampled_blocks_it_was_sent() -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(50_000) for _ in range(16 * 64)]
    ext = _hashes(tokens)
    sampled = [i for i, k in enumerate(ext) if kvdigest.sampled(k, 8)]
    assert len(sampled) >= 3
    view = KvView()
    # r0's engine holds the first 40 blocks, r1's all 64; each sends only its sampled blocks.
    for rid, held in (("r0", ext[:40]), ("r1", ext)):
        s = kvdigest.Sampler(rid, 1)
        d = s.next(held, H16)
        assert d is not None
        kvfeed.apply(view, kvdocs.KvDoc(1, False, (kvdigest.Change(1, rid, H16, d.added, full=True),)))
    caches = [view.get("r0"), view.get("r1")]
    depth = kvview.matched_blocks(tokens, [c for c in caches if c is not None])
    assert depth[1] == max(sampled) + 1  # the deepest sampled block held
    assert depth[0] == max(i for i in sampled if i < 40) + 1
    policy = policies.create(policies.Options(kv_view=view))["kv_aware"]
    eps = (Endpoint("r0", "http://127.0.0.1:1"), Endpoint("r1", "http://127.0.0.1:2"))
    chosen, _ = policy.pick("m", eps, key=pick.RequestKey(blocks=(1,), tokens=tuple(tokens)))
    assert chosen is not None and chosen.replica_id == "r1"
    # A delta takes r1's deepest sampled block away; a reset with nothing leaves the view empty.
    kvfeed.apply(view, kvdocs.KvDoc(2, False, (kvdigest.Change(2, "r1", H16, (), (ext[max(sampled)],)),)))
    r1 = view.get("r1")
    assert r1 is not None and ext[max(sampled)] not in r1.blocks
    kvfeed.apply(view, kvdocs.KvDoc(3, True, ()))
    assert list(view.replicas()) == []
