"""The sim engine's simulated KV cache: whole blocks held LRU up to a capacity, and vLLM's KV events for it.

With ``--kv-events-config`` (vLLM's flag and JSON) the sim keeps, for each completion whose prompt
is given as token ids, the prompt's full blocks hashed exactly as vLLM hashes them
(``core.kvhash``: ``sha256``, NONE_HASH from ``PYTHONHASHSEED`` or vLLM's default seed, 16-token
blocks as vLLM on GPU; ``--block-size`` to change), evicts the least recently used past
``--kv-cache-blocks``, and publishes what changed as vLLM does (``kvpublish``): one
``BlockStored`` for the new blocks of a request (``parent_block_hash`` the block before them),
one ``BlockRemoved`` for those evicted. A hit (leading blocks held) skips their prefill, as
prefix caching does. Each request's blocks turn most recent tail first, so its tail is evicted before
its head, as vLLM's free order does. What it does not mimic: vLLM's reference counts (a block in use is
never evicted there), and that vLLM orders blocks when a request ends, not when it is admitted.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Sequence

from llmgw.core import kvevents, kvhash

from .kvpublish import KvPublisher


class SimKvCache:
    def __init__(self, publisher: KvPublisher | None, *, capacity_blocks: int, block_size: int = 16) -> None:
        self.publisher = publisher
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.seed = os.environ.get("PYTHONHASHSEED")
        self.held: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.hits = 0
        self.queries = 0

    async def admit(self, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens`` already cached (leading whole blocks); its blocks are then held and published."""
        hashes = [int(kvhash.external(h)) for h in
                  kvhash.block_hashes(tokens, self.block_size, pythonhashseed=self.seed)]
        hit = 0
        while hit < len(hashes) and hashes[hit] in self.held:
            hit += 1
        self.queries += len(hashes)
        self.hits += hit
        new = hashes[hit:]
        # Most recent last, the prompt's tail before its head: vLLM frees a request's blocks in reverse "so
        # that the tail blocks are evicted first" (vllm/v1/core/single_type_kv_cache_manager.py, 0.32), so
        # what eviction leaves of a chat is a prefix, still worth routing to; plain LRU cut its head first.
        for h in reversed(hashes):
            self.held[h] = None
            self.held.move_to_end(h)
        evicted: list[int] = []
        while len(self.held) > self.capacity:
            evicted.append(self.held.popitem(last=False)[0])
        if self.publisher is not None and (new or evicted):
            events: list[kvevents.Event] = []
            if new:
                start = hit * self.block_size
                events.append(kvevents.Stored(tuple(new), hashes[hit - 1] if hit else None,
                                              tuple(tokens[start:start + len(new) * self.block_size]),
                                              self.block_size, extra_keys=(None,) * len(new), group_idx=0,
                                              spec_kind="full_attention"))  # as a real engine sends them
            if evicted:
                events.append(kvevents.Removed(tuple(evicted)))
            await self.publisher.publish(kvevents.Batch(time.time(), tuple(events), 0))
        return hit * self.block_size
