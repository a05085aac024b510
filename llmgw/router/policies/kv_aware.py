"""``kv_aware``: the replica whose engine holds the longest prefix of the prompt's KV blocks, as its events say.

The agents follow each vLLM engine's KV cache events (``core.kvevents``) and the router holds,
per replica, the block hashes its cache holds (``kvview.KvView``). For a request whose token ids
the router has (``RequestKey.tokens``: a completion's prompt given as token ids; the router has no
tokenizer), this policy hashes the prompt's blocks exactly as the engine does (``core.kvhash``)
and scores each replica by the leading blocks it holds:

* only replicas within ``Options.kv_imbalance`` requests in flight of the least loaded are
  candidates (a cap on imbalance: a hot prefix must not pile every request onto one replica);
* among those, the least cost wins, ``prefix_cache``'s cost on the engine's truth: the blocks the
  replica's engine lacks of this prompt, plus the blocks this router sent it still in their prefill,
  plus one block per request in flight there. A replica holding a chat keeps it until the prefill
  queued on it outweighs what its cache saves; the longest match alone piled every chat whose system
  prompt one replica held onto it, with the other idle (``bench/kv_vllm_bench.py --per-turn``, run 3);
  ties go to the least loaded, then round robin.

Where token ids come from (the router has no tokenizer): from the request only, for now. The
engine's ``/tokenize`` would cost a round trip to a replica before every pick (and a live replica to
ask); a router-side tokenizer needs the model's tokenizer files on every router and vLLM's exact
chat-template rendering to hash a chat the same way; the events' own ``token_ids`` do not help, since
the request's ids are what must be matched. A router-side tokenizer, used when the model's files are
at hand, is the next step for chats.

It falls back to ``prefix_cache`` (the router's own guess) for a request without token ids, or
when any candidate replica publishes nothing; ``routed``/``wait``/``done`` are ``prefix_cache``'s
either way (the prefill charge and the wait for a prefix in its prefill apply to any replica).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from llmgw.router import kvview
from llmgw.router.pick import NO_KEY, E, LeastOutstanding, RequestKey
from llmgw.router.policies.base import NO_LOAD, Options
from llmgw.router.policies.prefix_cache import PrefixCache


class KvAware(PrefixCache):
    name = "kv_aware"
    keyed = True
    reads_tokens = True
    #: What the queue (pending prefill and requests in flight) weighs against the blocks a replica's cache saves:
    #: 1, both count as blocks to prefill; below 1 a chat stays on its history's replica longer (fewer copies of a
    #: chat in two caches under eviction, more queueing). ``bench/kv_vllm_bench.py`` tries others as
    #: ``llmgw:kv_aware@W``.
    queue_weight: float = 1.0

    def __init__(self, options: Options = Options()) -> None:
        super().__init__(options)
        self.view = options.kv_view if options.kv_view is not None else kvview.KvView()
        self._least = LeastOutstanding()

    def pick(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = NO_LOAD,
             key: RequestKey = NO_KEY, exclude: Collection[str] = ()) -> tuple[E | None, int]:
        live = [e for e in endpoints if e.replica_id not in exclude]
        if not live:
            return None, 0
        least = min(load.get(e.replica_id, 0.0) for e in live)
        cap = least + self.options.kv_imbalance
        candidates = [e for e in live if load.get(e.replica_id, 0.0) <= cap]
        caches = [self.view.get(e.replica_id) for e in candidates]
        if not key.tokens or any(c is None for c in caches):
            return super().pick(model, endpoints, load=load, key=key, exclude=exclude)
        depth = kvview.matched_blocks(key.tokens, [c for c in caches if c is not None], self.view.memo)
        size = max(c.block_size for c in caches if c is not None)
        n = len(key.tokens) / size
        pending, weight = self.cache.pending, self.cache.decode_weight
        lacking = {e.replica_id: max(0.0, n - d * c.block_size / size)
                   for e, d, c in zip(candidates, depth, caches, strict=True) if c is not None}
        q = self.queue_weight
        cost = {r: miss + q * (pending.get(r, 0.0) + weight * load.get(r, 0.0)) for r, miss in lacking.items()}
        best = min(cost.values())
        tied = {r for r, c in cost.items() if c <= best + 1e-9}
        chosen = self._least.pick(model, endpoints, load=load,
                                  exclude=[e.replica_id for e in endpoints if e.replica_id not in tied])
        assert chosen is not None  # tied is non-empty and within the endpoints
        return chosen, int(lacking[chosen.replica_id])
