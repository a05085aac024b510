"""The control plane's autoscaling with a real SQLite store, a stepped clock and routers' reports given by hand.

Each pass is run by hand (``reconcile_once``) as in ``test_cluster_events.py``; the routers'
load arrives through ``RouterSignals.record`` exactly as the in-process router's callback
delivers it, and what the pass decided is read back from the store: the autoscaler's state,
the replicas, the events and the router's table.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.control import loadreports
from llmgw.control.auth import Auth
from llmgw.control.cluster import Cluster
from llmgw.control.http.api import create_api
from llmgw.control.reconcile import decide
from llmgw.control.state import Phase
from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store, StoredAutoscale, StoredNode
from llmgw.core import specs
from llmgw.core.inventory import Inventory, WeightFile
from llmgw.core.shards import ShardState, ShardStatus
from llmgw.testing import stepped

INV = Inventory(cpu_count=8, memory_total_bytes=16 << 30, memory_available_bytes=12 << 30, engines=(("sim", "1"),))


def model(name: str = "m", **auto: Any) -> specs.Model:
    spec: dict[str, Any] = {"engine": "sim", "autoscale": {"min_replicas": 1, "max_replicas": 4,
                                                           "inflight_per_replica": 2, "scale_up_after": "10s",
                                                           "scale_down_after": "20s", **auto}}
    return specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name},
                                 "spec": spec})


class World:
    """One control plane on a SQLite store, one agent link per node, a stepped clock and a router's reports."""

    def __init__(self, tmp_path: Path, *, nodes: dict[str, Inventory] | None = None) -> None:
        self.store, self.clock = Store.open(tmp_path), stepped.Clock()
        self.signals = loadreports.RouterSignals(clock=self.clock, stale_after_s=1e9)
        self.c = Cluster(self.store, clock=self.clock, cfg=decide.Config(node_grace_s=30), heartbeat_timeout_s=1e9,
                         signals=self.signals)
        self.links: dict[str, stepped.Link] = {}
        for node_id, inv in (nodes or {"n1": INV}).items():
            self.links[node_id] = stepped.Link()
            self.c.node_registered(StoredNode(node_id, node_id, "127.0.0.1", "0", inv, {}, 0.0, self.clock()), [],
                                   self.links[node_id])

    def report(self, name: str = "m", **kw: Any) -> None:
        self.signals.record({"router": "r1", "interval_s": 2.0, "models": [{"model": name, **kw}]})

    def step(self, seconds: float = 1.0, **load: Any) -> None:
        """Moves the clock, reports ``load`` for m (when given), runs passes until none asks for another."""
        self.clock.now += seconds
        if load:
            self.report(**load)
        while self.c.reconcile_once():
            pass

    def ready_all(self) -> None:
        """Every Starting replica's shard says Ready, then a pass takes it in."""
        for r in self.store.list_replicas():
            if r.phase is Phase.STARTING and r.node_id and r.shard_id:
                self.c.shard_reported(r.node_id, ShardStatus(r.shard_id, r.id, ShardState.READY,
                                                             endpoint=f"http://{r.id}"))
        self.step(0.1)

    def live(self, name: str = "m") -> list[str]:
        return [r.id for r in self.store.list_replicas() if r.model == name and r.phase is not Phase.TERMINATING]

    def autoscaled(self, name: str = "m") -> list[str]:
        return [e.message for e in self.store.list_events(model=name) if e.reason == "Autoscaled"]

    def condition(self, type_: str, name: str = "m") -> tuple[str, str, str]:
        c = {x.type: x for x in self.c.conditions_of(f"model/{name}")}[type_]
        return c.status, c.reason, c.message

    def table(self, name: str = "m") -> dict[str, Any]:
        return next(m for m in self.c.endpoints_doc().to_doc()["models"] if m["name"] == name)


def test_a_sustained_load_scales_up_after_the_window_with_the_reason_as_event(tmp_path: Path) -> None:
    """In flight 6 at target 2 held for 10 s: 1 → 3 at once, stored, told as an Autoscaled event; not before."""
    w = World(tmp_path)
    w.store.put_model(model())
    w.step()
    w.ready_all()
    assert len(w.live()) == 1
    for _ in range(10):  # asked for 0..9 s: inside the window, nothing moves
        w.step(1.0, in_flight=6)
    assert len(w.live()) == 1 and w.autoscaled() == []
    w.step(1.0, in_flight=6)
    assert w.autoscaled() == ["1 → 3: in flight 6.0 per replica > target 2 for 10s"]
    assert len(w.live()) == 3 and w.store.autoscale_states()["m"].replicas == 3
    assert w.store.autoscale_states()["m"].last_reason == "1 → 3: in flight 6.0 per replica > target 2 for 10s"
    assert w.condition("Autoscaling")[:2] == ("True", "WithinBounds")
    w.ready_all()
    assert w.table()["state"] == "Ready" and w.table()["message"] == "3 of 3 replicas Ready"
    assert w.table()["autoscale"] == {"min_replicas": 1, "max_replicas": 4, "cold_start_timeout_s": 60.0}
    # A restarted control plane keeps the count in force instead of falling back to min_replicas.
    again = Cluster(w.store, clock=w.clock, cfg=decide.Config(node_grace_s=30), heartbeat_timeout_s=1e9)
    assert again.autoscaled("m") is not None and again.autoscaled("m").replicas == 3  # type: ignore[union-attr]


def test_a_load_past_max_replicas_holds_there_and_says_so(tmp_path: Path) -> None:
    """The load asks for 10; the model stops at max 4 and its Autoscaling condition is False AtMaxReplicas."""
    w = World(tmp_path)
    w.store.put_model(model())
    w.step()
    w.ready_all()
    for _ in range(11):
        w.step(1.0, in_flight=20)
    assert len(w.live()) == 4
    status, reason, message = w.condition("Autoscaling")
    assert (status, reason) == ("False", "AtMaxReplicas") and "raise spec.autoscale.max_replicas" in message


def test_scale_down_drains_the_least_loaded_replica(tmp_path: Path) -> None:
    """Down from 3 to 2: the Ready replica with the fewest requests in flight is drained, though it is the oldest."""
    w = World(tmp_path)
    w.store.put_model(model(inflight_per_replica=4))
    w.step()
    w.ready_all()
    (oldest,) = w.live()
    for _ in range(11):
        w.step(1.0, in_flight=12)
    w.ready_all()
    assert len(w.live()) == 3
    newer = [rid for rid in w.live() if rid != oldest]
    loads = {oldest: {"in_flight": 0}, newer[0]: {"in_flight": 2}, newer[1]: {"in_flight": 3}}
    for _ in range(21):
        w.step(1.0, in_flight=5, replicas=loads)
    assert w.autoscaled()[-1] == "3 → 2: in flight 1.7 per replica < target 4 for 20s"
    gone = {r.id: r for r in w.store.list_replicas()}[oldest]
    assert gone.phase is Phase.TERMINATING
    assert ("drain", gone.shard_id) in w.links["n1"].sent
    assert sorted(w.live()) == sorted(newer)


def test_an_idle_model_goes_to_zero_reads_cold_and_wakes_on_a_held_request(tmp_path: Path) -> None:
    """min 0: idle for scale_to_zero_after → 0 and Cold; a held request kicks a pass and starts a replica at once."""
    w = World(tmp_path)
    w.store.put_model(model(min_replicas=0, scale_to_zero_after="30s", cold_start_timeout="45s"))
    w.step(1.0, arrived=1, in_flight=1, last_request_at=w.clock.now + 1)  # a first request wakes it
    assert w.autoscaled() == ["0 → 1: a request is waiting for a model at zero"]
    w.ready_all()
    for _ in range(29):
        w.step(1.0, last_request_at=1001.0)
    assert len(w.live()) == 1
    w.step(1.0, last_request_at=1001.0)
    assert w.autoscaled()[-1] == "1 → 0: no request for 30s"
    assert w.live() == [] and w.store.autoscale_states()["m"].replicas == 0
    cold = w.table()
    assert (cold["state"], cold["endpoints"]) == ("Cold", [])
    assert cold["message"] == ("no replica: scaled to zero after 30s idle; the next request starts one "
                               "(cold start, up to 45s)")
    assert w.condition("Ready")[:2] == ("True", "Cold")

    w.c._wake.clear()
    w.clock.now += 100
    w.report(held=1, waiting=1, last_request_at=w.clock.now)
    assert w.c._wake.is_set()  # the report kicked a pass: no wait for the next tick
    w.step(0.0)
    assert w.autoscaled()[-1] == "0 → 1: a request is waiting for a model at zero"
    assert len(w.live()) == 1 and any(verb == "start" for verb, _ in w.links["n1"].sent[-2:])


def test_a_replica_started_from_zero_goes_where_the_weights_and_the_engine_are(tmp_path: Path) -> None:
    """Woken from zero, the replica is placed on the node holding the weights with the engine installed."""
    weights = (WeightFile("/m/a.gguf", 1 << 30, "gguf"),)
    no_engine = Inventory(cpu_count=8, memory_total_bytes=16 << 30, memory_available_bytes=12 << 30, weights=weights)
    w = World(tmp_path, nodes={"a-empty": INV, "b-no-engine": no_engine,
                               "c-ready": Inventory(cpu_count=8, memory_total_bytes=16 << 30,
                                                    memory_available_bytes=12 << 30, engines=(("sim", "1"),),
                                                    weights=weights),
                               "d-empty": INV})
    m = model(min_replicas=0)
    w.store.put_model(specs.Model(m.name, specs.dataclasses.replace(m.spec, source="file:///m/a.gguf")))
    w.step()
    assert w.live() == []
    w.step(1.0, held=1, waiting=1)
    (r,) = [r for r in w.store.list_replicas() if r.model == "m"]
    assert r.node_id == "c-ready"


def test_manual_scale_of_an_autoscaled_model_is_refused_with_its_bounds(tmp_path: Path) -> None:
    """POST /models/m/scale answers 409 with the sentence naming the bounds to change; a fixed model is scaled."""
    w = World(tmp_path)
    w.store.put_model(model(min_replicas=0))
    w.store.put_model(specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "f"},
                                            "spec": {"engine": "sim", "replicas": 1}}))
    db = StoreThread(w.store)
    app = create_api(db, w.c, auth=Auth.insecure())

    async def drive() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return (await c.post("/api/v1/models/m/scale", json={"replicas": 3}),
                    await c.post("/api/v1/models/f/scale", json={"replicas": 2}),
                    await c.post("/api/v1/models/f/scale", json={"replicas": -1}))

    try:
        refused, done, bad = asyncio.run(drive())
    finally:
        db.close()
    assert refused.status_code == 409
    assert refused.json()["error"]["message"] == ("model m is autoscaled (min 0, max 4); change "
                                                  "spec.autoscale.min_replicas/max_replicas instead")
    assert done.status_code == 200 and w.store.get_model("f").model.spec.replicas == 2  # type: ignore[union-attr]
    assert bad.status_code == 422 and "replicas: expected a whole number >= 0" in bad.json()["error"]["message"]
    assert w.store.get_model("m").model.spec.autoscale is not None  # type: ignore[union-attr]


def test_no_count_change_while_a_rollout_is_in_flight(tmp_path: Path) -> None:
    """A spec change rolls the replica: load held past the window changes no count until the old one is gone."""
    w = World(tmp_path)
    w.store.put_model(model())
    w.step()
    w.ready_all()
    m = model()
    w.store.put_model(specs.Model("m", specs.dataclasses.replace(m.spec, engine_args=("--x",))))
    w.step()  # the new replica starts beside the old one; it is left Starting, so the roll stays in flight
    for _ in range(30):
        w.step(1.0, in_flight=6)
    assert w.autoscaled() == [] and w.store.autoscale_states()["m"].replicas == 1
    w.ready_all()  # the new one Ready: the old one is drained, and once it is gone the windows start afresh
    old = [r for r in w.store.list_replicas() if r.phase is Phase.TERMINATING]
    for r in old:
        w.c.shard_reported(r.node_id or "", ShardStatus(r.shard_id or "", r.id, ShardState.STOPPED))
    w.step(0.1)
    for _ in range(10):
        w.step(1.0, in_flight=6)
    assert w.autoscaled() == []  # the window restarted after the roll
    w.step(1.0, in_flight=6)
    assert w.autoscaled() == ["1 → 3: in flight 6.0 per replica > target 2 for 10s"]


def test_an_unplaceable_replica_holds_the_count_with_a_condition_and_no_loop(tmp_path: Path) -> None:
    """A model no node can take: load asks for 4, the count stays 1, Autoscaling is False NoCapacity, no new rows."""
    w = World(tmp_path)
    m = model()
    w.store.put_model(specs.Model("m", specs.dataclasses.replace(
        m.spec, resources=specs.dataclasses.replace(m.spec.resources, memory_bytes=64 << 30))))
    w.step()
    for _ in range(40):
        w.step(1.0, in_flight=8)
    assert w.autoscaled() == [] and len(w.store.list_replicas()) == 1
    status, reason, message = w.condition("Autoscaling")
    assert (status, reason) == ("False", "NoCapacity") and "waits for a node" in message


def test_the_autoscale_state_round_trips_and_a_standby_cannot_write_it(tmp_path: Path) -> None:
    """Stored states read back equal, a delete removes one, and a fenced store (a standby) writes nothing."""
    store = Store.open(tmp_path)
    a = StoredAutoscale("m", 3, above_since=1.5, below_since=None, idle_since=2.0, last_scale_up_at=4.0,
                        last_change_at=4.0, last_reason="1 → 3: queue 9.2 per replica > target 2 for 30s")
    store.write_autoscale(upserts=[a, StoredAutoscale("x", 0)])
    assert store.autoscale_states() == {"m": a, "x": StoredAutoscale("x", 0)}
    store.write_autoscale(deletes=["x"])
    assert list(store.autoscale_states()) == ["m"]
    store.fence = store_mod.STANDBY
    with pytest.raises(store_mod.Fenced):
        store.write_autoscale(upserts=[StoredAutoscale("m", 1)])
    assert store.autoscale_states()["m"].replicas == 3
    store.close()
