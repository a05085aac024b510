"""What each replica's engine holds in its KV cache, as its agent reports it from the engine's events.

One ``ReplicaCache`` per replica: the external block hashes (``core.kvhash.external``) its
engine's accelerator cache holds, and how that engine hashes (block size, algorithm, NONE_HASH
seed), which ``kv_aware`` needs to hash a request the same way. A replica absent here publishes
nothing (not vLLM, events off, or not heard from yet): ``kv_aware`` falls back for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from llmgw.core import kvhash


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaCache:
    #: The external hashes it holds; relayed (``kvfeed``): a live set of sampled 64-bit keys (``core.kvdigest``).
    blocks: AbstractSet[int | bytes]
    block_size: int
    algo: str = "sha256"
    pythonhashseed: str | None = None
    int_hashes: bool = True
    #: Only blocks whose key is a multiple of this are in ``blocks`` (``kvdigest.sampled``); 1: every block.
    sample: int = 1

    @property
    def hashing(self) -> tuple[int, str, str | None, bool, int]:
        return (self.block_size, self.algo, self.pythonhashseed, self.int_hashes, self.sample)


#: Block hashes remembered across requests (a chat's later turns re-hash its earlier ones): about 200 B each.
MEMO_ENTRIES = 65_536

Memo = dict[tuple[Any, ...], tuple[bytes, int | bytes]]


class KvView:
    """Replica id -> its ``ReplicaCache``; replaced whole per replica as reports come."""

    def __init__(self) -> None:
        self._caches: dict[str, ReplicaCache] = {}
        #: (hashing, parent digest, block token ids) -> (digest, external hash), for ``matched_blocks``.
        self.memo: Memo = {}

    def update(self, replica_id: str, cache: ReplicaCache | None) -> None:
        if cache is None:
            self._caches.pop(replica_id, None)
        else:
            self._caches[replica_id] = cache

    def get(self, replica_id: str) -> ReplicaCache | None:
        return self._caches.get(replica_id)

    def replicas(self) -> Iterable[str]:
        return self._caches.keys()


def matched_blocks(tokens: Sequence[int], caches: Sequence[ReplicaCache], memo: Memo | None = None) -> list[int]:
    """For each cache, how many leading blocks of ``tokens`` it holds (vLLM's hashing, chained).

    Hashes are computed lazily and stop at the first block no cache holds, so a request pays for
    its matched prefix plus one block, not its whole prompt. A sampled cache (``sample`` > 1: relayed,
    ``core.kvdigest``) is checked on its sampled blocks only: its depth is the deepest sampled block it
    holds (the chain makes that block's hash its whole prefix's), and hashing stops one sampled block past
    the longest match; with ``memo`` a block hashed for an
    earlier request (the same prefix) is looked up instead (cleared whole past ``MEMO_ENTRIES``).
    """
    if memo is None:
        memo = {}
    elif len(memo) > MEMO_ENTRIES:
        memo.clear()
    depth = [0] * len(caches)
    groups: dict[tuple[int, str, str | None, bool, int], list[int]] = {}
    for i, cache in enumerate(caches):
        groups.setdefault(cache.hashing, []).append(i)
    for (block_size, algo, seed, int_hashes, sample), members in groups.items():
        parent = kvhash.none_hash(algo, seed)
        live = list(members)
        for b in range(len(tokens) // block_size):
            block = tuple(tokens[b * block_size:(b + 1) * block_size])
            mkey = (algo, seed, int_hashes, parent, block)
            known = memo.get(mkey)
            if known is None:
                digest = kvhash.digest(algo, (parent, block, None))
                known = memo[mkey] = (digest, kvhash.external(digest, int_hashes=int_hashes))
            parent, ext = known
            if sample > 1 and ext % sample:  # type: ignore[operator]  # sampled sets hold 64-bit int keys
                continue  # not a sampled block: the next sampled one says whether this prefix is held
            live = [i for i in live if ext in caches[i].blocks]
            if not live:
                break
            for i in live:
                depth[i] = b + 1
    return depth
