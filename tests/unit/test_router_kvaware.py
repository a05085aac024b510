"""``kv_aware``: replicas scored by the leading blocks their engines' events say they hold, hashed as vLLM hashes.

The replicas' block sets are the 64-bit hashes vLLM's own code computed for the fixture's tokens
(tests/fixtures/vllm_kv/hashes.json), so a match here is a match against what the engine publishes.
"""

from __future__ import annotations

import json
import pathlib

from llmgw.router import kvview, pick, policies, prefix
from llmgw.router.kvview import KvView, ReplicaCache
from llmgw.router.table import Endpoint

CASE = json.loads((pathlib.Path(__file__).parents[1] / "fixtures/vllm_kv/hashes.json").read_text())[0]
TOKENS: list[int] = CASE["tokens"]  # 70 tokens: 4 full blocks of 16
EXT: list[int] = CASE["external"]
EPS = tuple(Endpoint(f"r{i}", f"http://127.0.0.1:{9000 + i}") for i in range(3))


def _policy(holds: dict[str, list[int]], **options: float) -> policies.KvAware:
    view = KvView()
    for replica, blocks in holds.items():
        view.update(replica, ReplicaCache(frozenset(blocks), 16))
    policy = policies.create(policies.Options(kv_view=view, **options))["kv_aware"]
    assert isinstance(policy, policies.KvAware)
    return policy


KEY = pick.RequestKey(blocks=(11, 12), tokens=tuple(TOKENS))


def test_the_longest_held_prefix_wins_and_lacking_counts_the_rest() -> None:
    policy = _policy({"r0": EXT[:1], "r1": EXT[:3], "r2": []})
    chosen, lacking = policy.pick("m", EPS, key=KEY)
    assert chosen is not None and chosen.replica_id == "r1" and lacking == 1
    # A block held without its parent is no prefix: chained hashes end a match at the first miss.
    policy = _policy({"r0": EXT[1:], "r1": EXT[:1], "r2": []})
    assert policy.pick("m", EPS, key=KEY)[0].replica_id == "r1"  # type: ignore[union-attr]


def test_ties_go_to_the_least_loaded_and_the_cap_bounds_imbalance() -> None:
    policy = _policy({"r0": EXT, "r1": EXT, "r2": []})
    assert policy.pick("m", EPS, key=KEY, load={"r0": 3, "r1": 1})[0].replica_id == "r1"  # type: ignore[union-attr]
    policy = _policy({"r0": EXT, "r1": [], "r2": []}, kv_imbalance=4)
    assert policy.pick("m", EPS, key=KEY, load={"r0": 3})[0].replica_id == "r0"  # type: ignore[union-attr]
    chosen = policy.pick("m", EPS, key=KEY, load={"r0": 5})[0]
    assert chosen is not None and chosen.replica_id != "r0"  # past the cap the cache no longer counts
    assert policy.pick("m", EPS, key=KEY, exclude={"r0", "r1", "r2"}) == (None, 0)


def test_a_replica_holding_the_prefix_keeps_requests_until_its_queue_outweighs_what_it_saves() -> None:
    # r0 holds the prompt's 4 blocks (of 4.375): it saves 4 blocks of prefill against r1.
    policy = _policy({"r0": EXT, "r1": [], "r2": []})
    assert policy.pick("m", EPS, key=KEY, load={"r0": 3})[0].replica_id == "r0"  # type: ignore[union-attr]
    chosen, lacking = policy.pick("m", EPS, key=KEY, load={"r0": 5})  # 5 decoding there cost more than 4 blocks
    assert chosen is not None and chosen.replica_id != "r0" and lacking == 4
    # Prefill this router sent r0 and not yet done counts as its queue: a held prefix no longer piles requests.
    token = policy.cache.charge("r0", 6)
    assert policy.pick("m", EPS, key=KEY)[0].replica_id != "r0"  # type: ignore[union-attr]
    policy.cache.settle(token)
    assert policy.pick("m", EPS, key=KEY)[0].replica_id == "r0"  # type: ignore[union-attr]


def test_a_lower_queue_weight_keeps_a_chat_on_its_replica_longer() -> None:
    """``queue_weight`` (a variant ``kv_vllm_bench.py`` measures as ``llmgw:kv_aware@W``) scales the queue against
    the 4 blocks r0's cache saves: 5 decoding there move the request at 1, not at 0.5 (2.5 blocks' worth)."""
    policy = _policy({"r0": EXT, "r1": [], "r2": []})
    assert policy.pick("m", EPS, key=KEY, load={"r0": 5})[0].replica_id != "r0"  # type: ignore[union-attr]
    policy.queue_weight = 0.5
    assert policy.pick("m", EPS, key=KEY, load={"r0": 5})[0].replica_id == "r0"  # type: ignore[union-attr]
    policy.cache.charge("r0", 10)  # 10 blocks of prefill queued there weigh 5: more than it saves
    assert policy.pick("m", EPS, key=KEY)[0].replica_id != "r0"  # type: ignore[union-attr]


def test_a_replica_publishing_nothing_or_a_text_prompt_falls_back_to_prefix_cache() -> None:
    for holds, key in (({"r0": EXT, "r1": EXT}, KEY), ({"r0": EXT, "r1": EXT, "r2": EXT},
                                                       pick.RequestKey(blocks=(11, 12)))):
        policy = _policy(holds)
        assert len(policy.cache.index.holders(11 ^ hash("m"))) == 0
        policy.pick("m", EPS, key=key)
        assert len(policy.cache.index.holders(11 ^ hash("m"))) == 1  # prefix_cache chose and recorded it


def test_matching_hashes_only_the_matched_prefix_and_groups_by_hashing() -> None:
    held = ReplicaCache(frozenset(EXT[:2]), 16)
    seeded = ReplicaCache(frozenset(EXT), 16, pythonhashseed="0")  # another NONE_HASH: nothing matches
    assert kvview.matched_blocks(TOKENS, [held, seeded, ReplicaCache(frozenset(EXT), 16)]) == [2, 0, 4]
    assert kvview.matched_blocks(TOKENS[:20], [held]) == [1]
    memo: kvview.Memo = {}
    assert kvview.matched_blocks(TOKENS, [held], memo) == [2] and len(memo) == 3  # 2 matched + the first miss
    assert kvview.matched_blocks(TOKENS, [held], memo) == [2] and len(memo) == 3  # looked up, not re-hashed
    assert kvview.matched_blocks(TOKENS, [seeded], memo) == [0] and len(memo) == 4  # another seed, its own entry


def test_a_completion_given_as_token_ids_carries_them_in_its_key_for_kv_aware_only() -> None:
    assert prefix.request_key({"prompt": [1, 2, 3]}, tokens=True).tokens == (1, 2, 3)
    assert prefix.request_key({"prompt": [[4, 5], [6]]}, tokens=True).tokens == (4, 5)
    assert prefix.request_key({"prompt": "text"}, tokens=True).tokens == ()
    assert prefix.request_key({"messages": [{"role": "user", "content": "hi"}]}, tokens=True).tokens == ()
    assert prefix.request_key({"prompt": [1, 2, 3]}).tokens == ()  # prefix_cache's key: not copied out
    assert policies.TOKENED == {"kv_aware"}
