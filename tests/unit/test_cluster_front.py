"""The Cluster as a front over its managers: what serve.py sets on it reaches them, and leadership moves them all.

The lease's callbacks are set on the Cluster (``cluster.may_act = lease.valid``) but read by the managers
(the executor before it sends, the links before they announce the control planes): these tests pin that
the two stay one, and that a step-down and a takeover reset every manager's part of the picture.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from llmgw.control import events as ev
from llmgw.control.cluster import Cluster
from llmgw.control.reconcile import decide
from llmgw.control.store.store import Store, StoredNode
from llmgw.core import specs
from llmgw.core.inventory import Inventory
from llmgw.testing import stepped

INV = Inventory(cpu_count=8, memory_total_bytes=16 << 30, memory_available_bytes=12 << 30, engines=(("sim", "1"),))
MODEL = specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"},
                              "spec": {"engine": "sim", "replicas": 1}})


class Link(stepped.Link):
    def __init__(self) -> None:
        super().__init__()
        self.peers: list[tuple[str, ...]] = []
        self.closed: list[str] = []

    def controlplanes(self, addrs: tuple[str, ...]) -> None:
        self.peers.append(addrs)

    def close(self, reason: str) -> None:
        self.closed.append(reason)


def cluster(store: Store, clock: stepped.Clock, **kw: object) -> Cluster:
    return Cluster(store, clock=clock, cfg=decide.Config(node_grace_s=30), heartbeat_timeout_s=1e9, **kw)  # type: ignore[arg-type]


def register(c: Cluster, node_id: str, link: Link) -> None:
    c.node_registered(StoredNode(node_id, node_id, "127.0.0.1", "0", INV, {}, 0.0, c.clock()), [], link)


def test_a_lease_not_fresh_set_on_the_cluster_keeps_the_pass_commands_home(tmp_path: Path) -> None:
    store, clock, link = Store.open(tmp_path), stepped.Clock(), Link()
    store.put_model(MODEL)
    c = cluster(store, clock)
    register(c, "n1", link)
    fresh = [False]
    c.may_act = lambda: fresh[0]
    c.reconcile_once()
    c.reconcile_once()
    (replica,) = store.list_replicas()
    assert replica.node_id == "n1" and link.sent == []  # written under the fence, never sent
    fresh[0] = True
    clock.now += 11  # past the resend of a StartShard not yet answered
    c.reconcile_once()
    assert ("start", replica.shard_id) in link.sent
    store.close()


def test_the_control_planes_set_as_a_hint_are_announced_once_to_each_agent(tmp_path: Path) -> None:
    store, clock, a, b = Store.open(tmp_path), stepped.Clock(), Link(), Link()
    c = cluster(store, clock)
    register(c, "a", a)
    register(c, "b", b)
    c.hint = lambda: ("", ("cp1:7000", "cp2:7000"))
    assert c.hint()[1] == ("cp1:7000", "cp2:7000")
    c.links.announce_peers()
    c.links.announce_peers()
    assert a.peers == b.peers == [("cp1:7000", "cp2:7000")]
    store.close()


def test_a_step_down_closes_every_stream_forgets_the_nodes_and_records_nothing(tmp_path: Path) -> None:
    store, clock, link = Store.open(tmp_path), stepped.Clock(), Link()
    c = cluster(store, clock)
    register(c, "n1", link)
    c.step_down("lease lost")
    assert not c.leading and c.nodes == {} and not c.connected("n1")
    assert link.closed == ["this control plane no longer leads (lease lost)"]
    c.record(ev.Event(clock(), ev.NORMAL, "Anything", "node/n1", "not this one's to write"))
    c.flush_events()
    assert "Anything" not in [e.reason for e in store.list_events()]
    # A takeover reads the store afresh: the node is known again, not connected, and the term is the new one.
    asyncio.run(c.take_over(7))
    assert c.leading and c.term == 7 and set(c.nodes) == {"n1"} and not c.nodes["n1"].connected
    c.flush_events()
    assert "LeaderElected" in [e.reason for e in store.list_events()]
    store.close()


def test_the_table_long_poll_answers_a_change_and_a_close_at_once(tmp_path: Path) -> None:
    store, clock = Store.open(tmp_path), stepped.Clock()
    c = cluster(store, clock)

    async def main() -> None:
        await c.table.publish()
        first = await c.wait_table(after=None, timeout=1)
        assert first.version == 1 and first.models == () and first == c.endpoints_doc().with_version(1)
        waiting = asyncio.create_task(c.wait_table(after=1, timeout=30))
        await asyncio.sleep(0)
        store.put_model(MODEL)
        await c.table.publish()
        changed = await asyncio.wait_for(waiting, 5)
        assert changed.version == 2 and [m.name for m in changed.models] == ["m"]
        await c.table.publish()  # nothing changed: the same version
        held = asyncio.create_task(c.wait_table(after=2, timeout=30))
        await asyncio.sleep(0)
        await c.close()
        assert (await asyncio.wait_for(held, 5)).version == 2

    asyncio.run(main())
    store.close()
