"""What ``kv_aware`` costs: a pick per request, and keeping/relaying the replicas' block sets (issue 31 part 2).

    .venv/bin/python bench/kv_aware_cost.py

In-process, no sockets. Three figures, best and median over ``--repeats`` runs:

* ``pick``: ``KvAware.pick`` (repeated: the later turns of a chat, whose prefix blocks are memoised;
  and first time, memo emptied) for a prompt of ``--tokens`` token ids over ``--replicas`` replicas
  whose views hold the prompt's first half (vLLM's sha256 hashing, 16-token blocks): the router's
  whole added cost for a request of a ``kv_aware`` model (hashing stops one block past the longest
  match, so a cold prompt costs one block);
* ``apply``: the agent applying one batch of ``--delta`` stored + ``--delta`` removed hashes
  (decode + set update), what a follower pays per engine batch;
* ``encode``: encoding such a delta (hashes as 64-bit ints) with ``core.msgpackmini``, and its size:
  what a relay sends per replica per batch (the fan-out arithmetic in bench/README.md uses it).
"""

from __future__ import annotations

import argparse
import statistics
import time

from llmgw.core import kvevents, kvhash, msgpackmini
from llmgw.router import policies
from llmgw.router.kvview import KvView, ReplicaCache
from llmgw.router.pick import RequestKey
from llmgw.router.table import Endpoint


def timed(fn, calls: int, repeats: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return min(runs), statistics.median(runs)


def fmt(figures: tuple[float, float]) -> str:
    return f"best {figures[0]:.1f} µs, median {figures[1]:.1f} µs"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--delta", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    tokens = tuple((i * 7919) % 32000 for i in range(a.tokens))
    hashes = [int(kvhash.external(h)) for h in kvhash.block_hashes(tokens, 16)]
    view = KvView()
    eps = tuple(Endpoint(f"r{i}", f"http://127.0.0.1:{9000 + i}") for i in range(a.replicas))
    for i, e in enumerate(eps):
        held = hashes[: len(hashes) // 2] if i == 0 else hashes[: len(hashes) // 4]
        view.update(e.replica_id, ReplicaCache(frozenset(held) | frozenset(range(10**6, 10**6 + 20000)), 16))
    policy = policies.create(policies.Options(kv_view=view))["kv_aware"]
    key = RequestKey(tokens=tokens)
    cold = RequestKey(tokens=tuple(t + 1 for t in tokens))
    print(f"pick, {a.tokens} tokens ({len(hashes)} blocks), {a.replicas} replicas, half held: "
          + fmt(timed(lambda: policy.pick("m", eps, key=key), a.calls, a.repeats)))
    def first_time() -> None:
        view.memo.clear()
        policy.pick("m", eps, key=key)

    print("pick, the same prompt never hashed before (memo emptied each call): "
          + fmt(timed(first_time, a.calls, a.repeats)))
    print("pick, a cold prompt (no replica holds block 0): "
          + fmt(timed(lambda: policy.pick("m", eps, key=cold), a.calls, a.repeats)))
    stored = kvevents.Stored(tuple(range(a.delta)), None, tuple(range(16 * a.delta)), 16)
    removed = kvevents.Removed(tuple(range(a.delta)))
    payload = kvevents.encode_batch(kvevents.Batch(1.0, (stored, removed), 0))
    blocks = kvevents.ReplicaBlocks()
    print(f"apply, a batch of {a.delta} stored + {a.delta} removed ({len(payload)} B as vLLM sends it): "
          + fmt(timed(lambda: blocks.apply_batch(kvevents.decode_batch(payload)), a.calls, a.repeats)))
    big = [h | (1 << 63) for h in range(2 * a.delta)]  # full-width 64-bit hashes: 9 bytes each in msgpack
    delta = msgpackmini.encode([big[: a.delta], big[a.delta:]])
    print(f"encode, a delta of {a.delta}+{a.delta} hashes: {len(delta)} B, "
          + fmt(timed(lambda: msgpackmini.encode([big[: a.delta], big[a.delta:]]), a.calls, a.repeats)))


if __name__ == "__main__":
    main()
