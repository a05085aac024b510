"""Prefix-cache-aware routing on plain data: prompt extraction, block hashes, the index and the policy."""

from __future__ import annotations

from llmgw.router import prefix
from llmgw.router.pick import RequestKey
from llmgw.router.table import Endpoint

EPS = tuple(Endpoint(f"r{i}", f"http://127.0.0.1:{9000 + i}") for i in range(3))
SYSTEM_A = "You are a careful assistant for the accounts team. " * 40  # ~2 KB
SYSTEM_B = "Tu es un assistant qui répond en français, brièvement. " * 40


def chat(system: str, user: str) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def key(doc: dict[str, object]) -> RequestKey:
    return prefix.request_key(doc)


# --- prompt text and blocks -------------------------------------------------------------------


def test_chat_and_completion_prompt_text() -> None:
    """Chat gives role and content in order; content parts keep their text; a completion gives its prompt."""
    text = prefix.prompt_text(chat("sys", "hi"))
    assert text.index("system") < text.index("sys", 6) < text.index("user") < text.index("hi")
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "look"},
                                                       {"type": "image_url", "image_url": {"url": "x"}},
                                                       {"type": "text", "text": "here"}]}]}
    assert "lookhere" in prefix.prompt_text(parts)
    assert prefix.prompt_text({"prompt": "once upon"}) == "once upon"
    assert prefix.prompt_text({"prompt": ["first", "second"]}) == "first"
    assert prefix.prompt_text({"prompt": [1, 2, 3]}) == "" and prefix.prompt_text({}) == ""


def test_role_and_content_boundaries_matter() -> None:
    """Moving text between messages changes the prompt, so it cannot match a different conversation."""
    a = {"messages": [{"role": "user", "content": "ab"}, {"role": "user", "content": "c"}]}
    b = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "bc"}]}
    assert prefix.prompt_text(a) != prefix.prompt_text(b)


def test_blocks_are_chained_and_only_whole() -> None:
    """Shared leading blocks give equal hashes; a change in block 0 changes every later hash."""
    base = "x" * 1000
    h1 = prefix.block_hashes(base + "tail one", block_chars=256)
    h2 = prefix.block_hashes(base + "and a different tail", block_chars=256)
    assert len(h1) == len(h2) == 3  # 1008 and 1020 characters: three whole blocks of 256
    assert h1 == h2
    changed = prefix.block_hashes("y" + base[1:], block_chars=256)
    assert all(a != b for a, b in zip(changed, h1, strict=True))
    assert prefix.block_hashes("short") == ()


def test_a_prompt_of_token_ids_is_keyed_by_blocks_of_ids() -> None:
    """A completion given as token ids has no text; its blocks are BLOCK_TOKENS ids each, chained."""
    turn1 = list(range(1000, 1000 + 200))
    turn2 = turn1 + list(range(5000, 5100))
    k1, k2 = key({"model": "m", "prompt": turn1}), key({"model": "m", "prompt": turn2})
    assert len(k1.blocks) == 200 // prefix.BLOCK_TOKENS and len(k2.blocks) == 300 // prefix.BLOCK_TOKENS
    assert k2.blocks[:len(k1.blocks)] == k1.blocks and k1.tokens == ()  # ids only for the policy reading them
    assert key({"model": "m", "prompt": [7] + turn1[1:]}).blocks[0] != k1.blocks[0]
    assert prefix.request_key({"model": "m", "prompt": turn1}, tokens=True).tokens == tuple(turn1)
    assert key({"model": "m", "prompt": turn1[:10]}).blocks == ()  # no whole block
    # So prefix_cache keeps a chat of token-id turns on its replica (it had no key and went by load alone).
    policy = prefix.PrefixCache()
    first = policy.pick("m", EPS, key=k1)
    assert first is not None
    assert policy.pick("m", EPS, key=k2, load={first.replica_id: 1}) == first


def test_session_key_comes_from_header_or_user() -> None:
    """The header wins over the body's user field; neither gives an empty session."""
    assert prefix.request_key({"user": "u1"}).session == "u1"
    assert prefix.request_key({"user": "u1"}, session_header="h").session == "h"
    assert prefix.request_key({"user": 5}).session == ""


def test_a_20kb_prompt_is_keyed_by_every_whole_block() -> None:
    """A 20 KB chat gives one hash per whole block, the same each time; an edit mid-way changes the blocks from it on.

    What it costs is measured in bench/prefix_hash.py (bench/README.md), not asserted here.
    """
    doc = chat(SYSTEM_A * 5, "question " * 1200)
    text = prefix.prompt_text(doc)
    assert len(text) > 20_000
    k = prefix.request_key(doc)
    assert len(k.blocks) == len(text) // prefix.BLOCK_CHARS and k == prefix.request_key(doc)
    edited = prefix.request_key(chat(SYSTEM_A * 5, "question " * 600 + "ANSWERED " + "question " * 599))
    same = sum(1 for a, b in zip(k.blocks, edited.blocks, strict=True) if a == b)
    assert 0 < same < len(k.blocks) - 1 and k.blocks[:same] == edited.blocks[:same]  # chained: all after differ


# --- the index ----------------------------------------------------------------------------------


def test_index_is_bounded_lru() -> None:
    """The index never holds more than its bound, and the least recently recorded entries go first."""
    index = prefix.PrefixIndex(max_entries=100)
    index.record(range(80), "r0")
    index.record(range(1000, 1050), "r1")
    assert len(index) == 100
    assert index.get(0) is None and index.get(29) is None and index.get(30) == "r0"
    index.record([30], "r2")  # touched: now the newest
    index.record(range(2000, 2069), "r1")
    assert len(index) == 100 and index.get(30) == "r2" and index.get(31) is None


# --- the policy ---------------------------------------------------------------------------------


def test_longest_prefix_wins() -> None:
    """Of two replicas holding part of a prompt, the one holding the longer prefix is chosen."""
    policy = prefix.PrefixCache()
    # r0 is sent p*512 then a*768; r1 then p*1280: they share two blocks, and those two
    # now name r1 (the index keeps the replica a block was last sent to).
    assert policy.pick("m", EPS[:1], key=key({"prompt": "p" * 512 + "a" * 768})) == EPS[0]
    assert policy.pick("m", EPS[1:2], key=key({"prompt": "p" * 1280})) == EPS[1]
    assert policy.pick("m", EPS, key=key({"prompt": "p" * 1300 + "new"})) == EPS[1]  # 5 blocks on r1
    assert policy.pick("m", EPS, key=key({"prompt": "p" * 512 + "a" * 800})) == EPS[0]  # 5 on r0, 2 on r1
    # The deepest block's replica excluded (a retry): the longest prefix on one still allowed.
    assert policy.pick("m", EPS, key=key({"prompt": "p" * 512 + "a" * 800}), exclude={"r0"}) == EPS[1]


def test_groups_stick_to_their_replica() -> None:
    """Requests sharing a system prompt keep landing on the replica that first served it."""
    policy = prefix.PrefixCache()
    first_a = policy.pick("m", EPS, key=key(chat(SYSTEM_A, "q0")))
    first_b = policy.pick("m", EPS, key=key(chat(SYSTEM_B, "q0")))
    assert first_a is not None and first_b is not None and first_a != first_b
    for i in range(1, 20):
        assert policy.pick("m", EPS, key=key(chat(SYSTEM_A, f"q{i}"))) == first_a
        assert policy.pick("m", EPS, key=key(chat(SYSTEM_B, f"other {i}"))) == first_b


def test_index_keeps_every_recent_holder_of_a_block() -> None:
    """A block sent to several replicas names each (latest last), up to HOLDERS; get() is the latest."""
    index = prefix.PrefixIndex()
    for r in ("r0", "r1", "r0", "r2", "r3", "r4"):
        index.record([7], r)
    assert index.holders(7) == ("r1", "r0", "r2", "r3", "r4")[-prefix.HOLDERS:]
    assert index.get(7) == "r4" and index.holders(8) == ()


def test_the_cached_replica_keeps_a_conversation_until_its_queue_outweighs_the_miss() -> None:
    """Cost = blocks lacking + prefill queued + a block per request in flight; the least wins.

    A conversation of ~12 blocks on r0 stays there with r0 busier than the others (moving it
    would mean evaluating all 12 again), and goes elsewhere only once r0's queue costs more.
    """
    policy = prefix.PrefixCache()
    doc = chat(SYSTEM_A, "q")  # 8 whole blocks
    n = len(key(doc).blocks)
    assert policy.choose("m", EPS, key=key(doc)) == (EPS[0], n)  # nothing cached anywhere: all lack n
    # The old rule (load <= 1.5 x least + 2) moved it at 3 in flight against 0; the cost keeps it.
    assert policy.choose("m", EPS, key=key(doc), load={"r0": 5, "r1": 0, "r2": 0}) == (EPS[0], 0)
    token = policy.charge("r0", n - 2)  # a long prompt is prefilling on r0 now
    assert policy.pending == {"r0": n - 2}
    assert policy.choose("m", EPS, key=key(doc), load={"r0": 3}) == (EPS[1], n)  # 3 + n-2 > n
    policy.settle(token)
    assert policy.pending == {}
    # Both now hold the prompt: the less loaded of the two, and never r2, which lacks it.
    assert policy.pick("m", EPS, key=key(doc), load={"r0": 2, "r1": 1}) == EPS[1]
    assert policy.pick("m", EPS, key=key(doc), load={"r0": 1, "r1": 2}) == EPS[0]


def test_charges_add_up_per_replica_and_settle_once() -> None:
    policy = prefix.PrefixCache()
    a, b, c = policy.charge("r0", 3), policy.charge("r0", 2), policy.charge("r1", 1)
    assert policy.charge("r1", 0) is None  # nothing to prefill: nothing to settle
    assert policy.pending == {"r0": 5, "r1": 1}
    policy.settle(a)
    policy.settle(a)  # a second settle of the same request changes nothing
    policy.settle(None)
    assert policy.pending == {"r0": 2, "r1": 1}
    policy.settle(b)
    policy.settle(c)
    assert policy.pending == {}


def test_no_blocks_is_least_loaded_and_models_are_apart() -> None:
    """A short prompt goes least loaded; the same prompt to another model does not follow the first's entries."""
    policy = prefix.PrefixCache()
    assert policy.pick("m", EPS, key=key({"prompt": "hi"}), load={"r0": 1, "r1": 0, "r2": 1}) == EPS[1]
    doc = chat(SYSTEM_A, "q")
    assert policy.pick("m", EPS, key=key(doc), load={"r0": 1, "r1": 1, "r2": 0}) == EPS[2]
    assert policy.pick("other", EPS, key=key(doc), load={"r0": 0, "r1": 1, "r2": 1}) == EPS[0]
    assert policy.pick("m", EPS, key=key(doc), exclude={"r0", "r1", "r2"}) is None


# -- Prefilling: who is computing a prefix right now -------------------------------------

def test_prefilling_finds_the_leader_on_the_same_replica_only() -> None:
    p = prefix.Prefilling(min_blocks=2)
    blocks = prefix.block_hashes("s" * 256 * 5)
    token = p.begin("m", "r1", blocks)
    longer = prefix.block_hashes("s" * 256 * 5 + "q" * 256)
    assert p.leader("m", "r1", longer) == token
    assert p.leader("m", "r2", longer) is None
    assert p.leader("other-model", "r1", longer) is None


def test_prefilling_needs_min_blocks_of_shared_prefix() -> None:
    p = prefix.Prefilling(min_blocks=3)
    p.begin("m", "r1", prefix.block_hashes("a" * 256 * 2 + "b" * 256 * 3))
    # Shares only the first two blocks: computing those twice is cheaper than waiting.
    assert p.leader("m", "r1", prefix.block_hashes("a" * 256 * 2 + "c" * 256 * 3)) is None
    assert p.leader("m", "r1", prefix.block_hashes("a" * 256 * 2 + "b" * 256)) is not None
    # Too short to register at all.
    assert p.begin("m", "r1", prefix.block_hashes("a" * 256)) is None


def test_prefilling_end_frees_followers_and_keeps_a_later_leader() -> None:
    p = prefix.Prefilling(min_blocks=1)
    blocks = prefix.block_hashes("x" * 256 * 4)
    first = p.begin("m", "r1", blocks)
    second = p.begin("m", "r1", blocks)
    assert p.leader("m", "r1", blocks) == second
    p.end(second)
    assert p.leader("m", "r1", blocks) == first  # still computing the same prefix
    p.end(first)
    assert p.leader("m", "r1", blocks) is None
    p.end(first)  # idempotent
    p.end(None)
    assert len(p) == 0
    third = p.begin("m", "r1", blocks)
    p.end(p.begin("m", "r1", blocks[:2]))
    assert p.leader("m", "r1", blocks) == third


def test_a_follower_cancelled_while_waiting_leaves_no_charge() -> None:
    """A request waiting on another's prefill whose client leaves takes its queued prefill back with it."""
    import asyncio

    from llmgw.router import policies, upstream
    from llmgw.router.table import ModelRoute

    async def run() -> None:
        forwarder = upstream.Forwarder()
        await forwarder.start()
        try:
            route = ModelRoute(name="m", served_name="m", endpoints=EPS[:1], routing="prefix_cache")
            doc = chat(SYSTEM_A, "first")
            # A leader is prefilling this system prompt on r0: the next request waits for it.
            policy = forwarder.policies["prefix_cache"]
            assert isinstance(policy, policies.PrefixCache)
            policy.lead("m", "r0", key(doc).blocks)
            cache = policy.cache
            cache.index.record([b ^ hash("m") for b in key(doc).blocks], "r0")
            task = asyncio.ensure_future(forwarder.open(route, "/v1/chat/completions", b"{}",
                                                        key=key(chat(SYSTEM_A, "a longer second question " * 12)),
                                                        stream=True))
            for _ in range(100):
                await asyncio.sleep(0.001)
                if cache.pending:
                    break
            assert cache.pending == {"r0": 1}  # its one new block, charged while it waits
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert cache.pending == {}
        finally:
            await forwarder.close()

    asyncio.run(run())
