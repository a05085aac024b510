"""The reconcile pass off the loop: store calls on the store's thread, the pure part on a snapshot of the nodes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from llmgw.control.cluster import Cluster
from llmgw.control.reconcile import decide
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store, StoredNode
from llmgw.core import specs
from llmgw.core.inventory import Inventory
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

INV = Inventory(cpu_count=8, memory_total_bytes=16 << 30, memory_available_bytes=12 << 30, engines=(("sim", "1"),))
MODEL = specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"},
                              "spec": {"engine": "sim", "replicas": 1}})


class Link:
    def __init__(self) -> None:
        self.started: list[ShardSpec] = []

    def start_shard(self, spec: ShardSpec) -> None:
        self.started.append(spec)

    def stop_shard(self, shard_id: str, *, reason: str) -> None: ...
    def drain_shard(self, shard_id: str, *, timeout_s: int) -> None: ...
    def close(self, reason: str) -> None: ...

    def request_logs(self, shard_id: str, *, lines: int, follow: bool) -> tuple[str, asyncio.Queue[Any]]:
        raise NotImplementedError

    def cancel_logs(self, request_id: str) -> None: ...


def test_a_pass_with_the_store_thread_runs_no_sql_on_the_loop_and_starts_the_replica(tmp_path: Path) -> None:
    """Two awaited passes create then place the replica, write it, send StartShard, with no SQL on the loop thread."""
    store = Store.open(tmp_path)
    db = StoreThread(store)
    try:
        store.put_model(MODEL)
        link = Link()

        async def main() -> tuple[bool, bool, int]:
            c = Cluster(store, cfg=decide.Config(node_grace_s=30), heartbeat_timeout_s=1e9, db=db)
            db.watch_loop()
            c.node_registered(StoredNode("n1", "n1", "127.0.0.1", "0", INV, {}, 0.0, 0.0), [], link)
            created = await c.reconcile_pass()
            placed_again = await c.reconcile_pass()
            await db.barrier()  # the registration's upsert and the events, queued
            return created, placed_again, db.statements_on_loop

        created, placed_again, on_loop = asyncio.run(main())
        (replica,) = store.list_replicas()
        assert created and not placed_again
        assert [s.replica_id for s in link.started] == [replica.id] and replica.node_id == "n1"
        assert [n.id for n in store.list_nodes()] == ["n1"]
        assert on_loop == 0
    finally:
        db.close()
        store.close()


def test_a_snapshot_of_the_nodes_keeps_what_it_held(tmp_path: Path) -> None:
    """A shard report, a disconnect and a cordon put new views in place, so a pass's dict(nodes) copy is unchanged."""
    store = Store.open(tmp_path)
    try:
        c = Cluster(store, cfg=decide.Config(node_grace_s=30), heartbeat_timeout_s=1e9)
        link = Link()
        c.node_registered(StoredNode("n1", "n1", "127.0.0.1", "0", INV, {}, 0.0, 0.0), [], link)
        seen = []
        for change in (lambda: c.shard_reported("n1", ShardStatus("m-1-1", "m-1", ShardState.READY)),
                       lambda: c.set_scheduling("n1", cordoned=True, draining=False),
                       lambda: c.node_disconnected("n1", link)):
            held = dict(c.nodes)["n1"]  # what a pass starting now reads in its thread
            before = (list(held.shards), held.connected, held.cordoned)
            change()
            seen.append((list(held.shards), held.connected, held.cordoned) == before)
        now = c.nodes["n1"]
        assert seen == [True, True, True]
        assert (list(now.shards), now.connected, now.cordoned) == (["m-1-1"], False, True)
    finally:
        store.close()
