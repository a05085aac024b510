"""The KV link's fan-out, measured on its real code: agents' digests into the leader's relay, routers' answers out.

    .venv/bin/python bench/kv_fanout.py [--replicas 1000] [--routers 10] [--seconds 5]

Synthetic digests at the rate bench/README.md's arithmetic assumes for a busy replica (an H100 with an 8B
model: ~19k blocks of 16 tokens held, 625 stored and 625 evicted a second) go through exactly what runs in
production, in one process, no sockets:

* **agent**: ``kvdigest.Sampler.next`` over the engine's whole block set every 250 ms (what ``agent/kvlink``
  pays per replica), the digest encoded as the stream's protobuf (``AgentMessage.kv_digest``);
* **leader**: each digest decoded from its protobuf bytes (``convert.digest_from_pb``), taken by
  ``control.kvrelay.KvRelay.take`` (node check, set update, log), then one long-poll answer built as JSON
  (``wait_json``: built once per version, every router at that version gets the same bytes);
* **router**: the answer parsed (``json.loads`` + ``KvDoc.from_doc``) and applied to its view
  (``router.kvfeed.apply``), once per router (they are identical: measured once, counted ``--routers`` times).

Also the first snapshot a router (re)connecting takes, and ``kv_aware``'s pick over views of the sizes this
gives (each replica ~2.4k sampled keys).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from llmgw.api import convert, kvdocs, routemodels, routing
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.control.kvrelay import KvRelay
from llmgw.core import kvdigest, kvhash
from llmgw.router import kvfeed, policies
from llmgw.router.kvview import KvView
from llmgw.router.pick import RequestKey
from llmgw.router.table import Endpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--routers", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=5.0, help="simulated seconds of traffic")
    ap.add_argument("--held", type=int, default=19_000, help="blocks each engine holds")
    ap.add_argument("--churn", type=int, default=625, help="blocks stored (and as many evicted) a second per replica")
    a = ap.parse_args()
    asyncio.run(run(a))


async def run(a: argparse.Namespace) -> None:
    rng = random.Random(1)
    rids = [f"m-{i:06x}" for i in range(a.replicas)]
    relay = KvRelay(coalesce_s=0.0, log_size=1 << 20)
    eps = tuple(routemodels.EndpointDoc(r, f"http://10.0.{i // 250}.{i % 250}:8000", node=f"n{i}")
                for i, r in enumerate(rids))
    relay.table_changed(routing.EndpointsDoc(version=1, models=(routemodels.ModelEntry("m", endpoints=eps),)))
    engines = [set(rng.getrandbits(64) for _ in range(a.held)) for _ in rids]
    samplers = [kvdigest.Sampler(r, 1) for r in rids]
    h16 = kvdigest.Hashing(16)
    view = KvView()
    # The first whole sets (after every agent's Register), and a router's first snapshot.
    for i, (s, blocks) in enumerate(zip(samplers, engines, strict=True)):
        d = s.next(blocks, h16)
        assert d is not None
        relay.take(f"n{i}", d)
    t0 = time.process_time()
    snap = await relay.wait_json(after=-1, origin="", timeout=0)
    t_snap_leader = time.process_time() - t0
    t0 = time.process_time()
    doc = kvdocs.KvDoc.from_doc(json.loads(snap))
    kvfeed.apply(view, doc)
    t_snap_router = time.process_time() - t0
    keys = sum(len(c.added) for c in doc.changes)
    print(f"snapshot: {a.replicas} replicas, {keys:,} sampled keys ({keys / a.replicas:.0f} a replica), "
          f"{len(snap) / 1e6:.2f} MB; leader builds it in {t_snap_leader * 1e3:.0f} ms CPU, "
          f"a router applies it in {t_snap_router * 1e3:.0f} ms CPU")

    ticks = int(a.seconds / kvdigest.INTERVAL_S)
    per_tick = max(1, round(a.churn * kvdigest.INTERVAL_S))
    agent_cpu = leader_cpu = router_cpu = 0.0
    pb_bytes = out_bytes = digests = 0
    version, origin = doc.version, doc.origin
    for _ in range(ticks):
        for i, (s, blocks) in enumerate(zip(samplers, engines, strict=True)):
            for _ in range(per_tick):  # the engine's churn (not measured: the engine's own work)
                blocks.pop()
                blocks.add(rng.getrandbits(64))
            t0 = time.process_time()
            d = s.next(blocks, h16)
            wire = convert.digest_to_pb(d).SerializeToString() if d is not None else b""
            agent_cpu += time.process_time() - t0
            if d is None:
                continue
            pb_bytes += len(wire)
            digests += 1
            t0 = time.process_time()
            msg = pb.KvDigest()
            msg.ParseFromString(wire)
            relay.take(f"n{i}", convert.digest_from_pb(msg))
            leader_cpu += time.process_time() - t0
        t0 = time.process_time()
        body = await relay.wait_json(after=version, origin=origin, timeout=0)
        leader_cpu += time.process_time() - t0
        out_bytes += len(body)
        t0 = time.process_time()
        got = kvdocs.KvDoc.from_doc(json.loads(body))
        kvfeed.apply(view, got)
        router_cpu += time.process_time() - t0
        version = got.version
    secs = ticks * kvdigest.INTERVAL_S
    print(f"{secs:.0f} simulated s, {a.replicas} replicas each storing and evicting {a.churn} blocks/s, "
          f"{digests / secs:,.0f} digests/s")
    print(f"agents -> leader: {pb_bytes / secs / 1e6:.2f} MB/s in all ({pb_bytes / secs / a.replicas / 1e3:.1f} KB/s a "
          f"replica); agent CPU {agent_cpu / secs / a.replicas * 1e3:.2f} ms/s a replica (sampling a {a.held:,}-block "
          "set every 250 ms)")
    print(f"leader: {leader_cpu / secs:.3f} CPU s/s (decode + take {digests / secs:,.0f} digests/s, one answer "
          f"per 250 ms); out {out_bytes / secs / 1e6:.2f} MB/s per router = {out_bytes / secs * a.routers / 1e6:.1f} "
          f"MB/s to {a.routers} routers")
    print(f"router: in {out_bytes / secs / 1e6:.2f} MB/s, {router_cpu / secs:.3f} CPU s/s to parse and apply")
    # kv_aware's pick with views this size: 2 and 32 candidate replicas, a 2,048-token prompt half held by one.
    tokens = tuple((i * 7919) % 32000 for i in range(2048))
    ext = [int(kvhash.external(h)) for h in kvhash.block_hashes(tokens, 16)]
    for n in (2, 32):
        pview = KvView()
        cands = tuple(Endpoint(r, "http://127.0.0.1:1") for r in rids[:n])
        for i, e in enumerate(cands):
            cur = view.get(e.replica_id)
            assert cur is not None
            held = {k for k in ext[: 64 if i == 0 else 16] if kvdigest.sampled(k, 8)}
            pview.update(e.replica_id, cur.__class__(set(cur.blocks) | held, 16, sample=8))
        policy = policies.create(policies.Options(kv_view=pview))["kv_aware"]
        key = RequestKey(tokens=tokens)
        policy.pick("m", cands, key=key)
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(200):
                policy.pick("m", cands, key=key)
            runs.append((time.perf_counter() - t0) / 200 * 1e6)
        runs.sort()
        print(f"kv_aware pick, {n} replicas with ~{len(cur.blocks):,} sampled keys each, 2,048 token ids "
              f"(memoised): best {runs[0]:.0f} µs, median {runs[2]:.0f} µs")


if __name__ == "__main__":
    main()
