"""A hung engine, stepped with plain data: out of routing at the first failed probe, replaced past its grace.

The pure part (``decide`` with ``liveness``) is asserted on its decisions; the
last tests run the control plane's loop on a real SQLite store and a stepped
clock, to read back what a person sees: the endpoints document, the events and
the conditions.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from test_reconcile_data import GROUP_SPEC as GROUP
from test_reconcile_data import group, ib_node

from llmgw.control import conditions as cond
from llmgw.control import events as ev
from llmgw.control.cluster import Cluster
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.routerreports import RouterEvents
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.control.store.store import Store, StoredNode
from llmgw.core import specs
from llmgw.core.inventory import Inventory
from llmgw.core.shards import ShardState, ShardStatus
from llmgw.core.specs import ModelSpec, Rollout
from llmgw.testing import stepped

CFG = decide.Config(node_grace_s=30, resend_s=10, backoff_base_s=2, crash_loop_after=3, unhealthy_grace_s=30,
                    corroborated_grace_s=5)
INV = Inventory(cpu_count=64, memory_total_bytes=64 << 30, memory_available_bytes=60 << 30, engines=(("sim", "1"),))
S = ShardState
PROBE = "health probe failed 3/3: no answer within 2s"


def spec(replicas: int = 2, *, surge: str = "1", unavailable: str = "0") -> ModelSpec:
    return ModelSpec(engine="sim", served_name="m", replicas=replicas,
                     rollout=Rollout(max_surge=surge, max_unavailable=unavailable))


def shard(sid: str, state: ShardState = S.READY, *, failures: int = 0, message: str = "") -> ShardStatus:
    return ShardStatus(sid, sid.rsplit("-", 1)[0], state, endpoint=f"http://h/{sid}", probe_failures=failures,
                       message=message, last_output=("CUDA error: an illegal memory access",)
                       if state is S.UNHEALTHY else ())


def ready(rid: str, *, node: str = "n1", phase: Phase = Phase.READY, **kw: Any) -> ReplicaRecord:
    base = ReplicaRecord(rid, "m", spec().fingerprint(), phase, "k", node_id=node, shard_id=f"{rid}-1", attempt=1,
                         endpoint=f"http://h/{rid}-1", message=f"serving on node {node}", created_at=1.0)
    return dataclasses.replace(base, **kw)


def world(*shards: ShardStatus, since: dict[str, float] | None = None) -> dict[str, NodeView]:
    n1 = NodeView("n1", INV, connected=True, reported=True, shards={s.shard_id: s for s in shards},
                  unhealthy_since=dict(since or {}))
    n2 = NodeView("n2", INV, connected=True, reported=True)
    return {"n1": n1, "n2": n2}


def run(replicas: list[ReplicaRecord], nodes: dict[str, NodeView], *, now: float = 1000.0,
        model: ModelSpec | None = None, ejected: dict[str, str] | None = None) -> list[d.Decision]:
    return decide.reconcile({"m": model or spec()}, replicas, nodes, now=now, cfg=CFG, ejected=ejected)


def updates(out: list[d.Decision]) -> dict[str, ReplicaRecord]:
    return {x.record.id: x.record for x in out if isinstance(x, d.UpdateReplica)}


def of(kind: type, out: list[d.Decision]) -> list[Any]:
    return [x for x in out if isinstance(x, kind)]


def test_first_failed_probe_takes_the_replica_out_of_routing_and_replaces_nothing() -> None:
    """READY with probe_failures 1: phase Unhealthy (not routed) at once; nothing is created or stopped."""
    nodes = world(shard("a-1"), shard("b-1", failures=1, message="health probe failed 1/3: timed out"))
    out = run([ready("a"), ready("b")], nodes)
    got = updates(out)["b"]
    assert got.phase is Phase.UNHEALTHY and "health probe failed 1/3: timed out" in got.message
    assert "a" not in updates(out)
    assert not of(d.CreateReplica, out) and not of(d.StopShard, out) and not of(d.DrainShard, out)


def test_unhealthy_within_its_grace_waits_and_says_so() -> None:
    """An Unhealthy shard inside its grace: the replica says why and when it is replaced; nothing else happens."""
    nodes = world(shard("a-1"), shard("b-1", S.UNHEALTHY, message=PROBE), since={"b-1": 990.0})
    out = run([ready("a"), ready("b", phase=Phase.UNHEALTHY)], nodes, now=1000.0)
    got = updates(out)["b"]
    assert got.message == f"unhealthy on node n1: {PROBE}; replaced unless it recovers within 30s"
    assert got.last_output == ("CUDA error: an illegal memory access",)
    assert not of(d.CreateReplica, out) and not of(d.StopShard, out)


def test_past_its_grace_a_replacement_starts_first_and_the_hung_one_stays_until_it_is_ready() -> None:
    """Past the grace with max_surge 1: CreateReplica and a Replacing event, no StopShard; then StopShard once Ready."""
    hung = ready("b", phase=Phase.UNHEALTHY)
    nodes = world(shard("a-1"), shard("b-1", S.UNHEALTHY, message=PROBE), since={"b-1": 960.0})
    out = run([ready("a"), hung], nodes, now=1000.0)
    assert of(d.CreateReplica, out) == [d.CreateReplica("m", spec().fingerprint())]
    assert not of(d.StopShard, out) and not of(d.DrainShard, out)
    (note,) = of(d.RecordEvent, out)
    assert note.event.reason == "Replacing" and note.event.object == "replica/b"
    assert "replacing unhealthy replica b (unhealthy on node n1 past its 30s grace" in note.event.message

    # The replacement is placed and Starting: still no stop, and no second replacement.
    hung = updates(out).get("b", hung)
    starting = ready("c", node="n2", phase=Phase.STARTING, shard_id="c-1", started_at=1000.0, sent_at=1000.0)
    nodes["n2"].shards["c-1"] = shard("c-1", S.STARTING)
    out = run([ready("a"), hung, starting], nodes, now=1001.0)
    assert not of(d.CreateReplica, out) and not of(d.StopShard, out)

    # Ready: the hung one is stopped (never drained: it would never finish), and is Terminating.
    nodes["n2"].shards["c-1"] = shard("c-1")
    out = run([ready("a"), hung, dataclasses.replace(starting, phase=Phase.READY)], nodes, now=1002.0)
    (stop,) = of(d.StopShard, out)
    assert (stop.node_id, stop.shard_id) == ("n1", "b-1") and "its replacement is Ready" in stop.reason
    assert not of(d.DrainShard, out) and not of(d.CreateReplica, out)
    assert updates(out)["b"].phase is Phase.TERMINATING


def test_with_no_surge_the_hung_one_is_stopped_first_and_replaced_once_gone() -> None:
    """max_surge 0 leaves no room beside it: StopShard at once, no replacement until its shard is gone."""
    model = spec(surge="0", unavailable="1")
    nodes = world(shard("a-1"), shard("b-1", S.UNHEALTHY, message=PROBE), since={"b-1": 960.0})
    out = run([ready("a"), ready("b", phase=Phase.UNHEALTHY)], nodes, model=model)
    (stop,) = of(d.StopShard, out)
    assert stop.shard_id == "b-1" and "max_surge 0" in stop.reason
    assert not of(d.CreateReplica, out)
    nodes["n1"].shards["b-1"] = shard("b-1", S.STOPPED)
    out = run([ready("a"), updates(out)["b"]], nodes, model=model, now=1001.0)
    assert of(d.DeleteReplica, out) == [d.DeleteReplica("b")] and len(of(d.CreateReplica, out)) == 1


def test_a_probe_that_passes_again_makes_it_ready_and_cancels_a_replacement_still_starting() -> None:
    """Unhealthy then READY/0: Ready again; the replacement created meanwhile is the extra one, and goes."""
    nodes = world(shard("a-1"), shard("b-1"))
    nodes["n2"].shards["c-1"] = shard("c-1", S.STARTING)
    starting = ready("c", node="n2", phase=Phase.STARTING, shard_id="c-1", started_at=999.0, sent_at=999.0,
                     created_at=999.0)
    out = run([ready("a"), ready("b", phase=Phase.UNHEALTHY, message="unhealthy"), starting], nodes)
    got = updates(out)
    assert got["b"].phase is Phase.READY and got["b"].message == "serving on node n1"
    assert got["c"].phase is Phase.TERMINATING
    assert [s.shard_id for s in of(d.StopShard, out)] == ["c-1"]


def test_a_router_ejection_shortens_the_grace_of_an_unhealthy_replica() -> None:
    """Unhealthy for 6s: within the 30s grace alone, past the 5s one when a router has also ejected it."""
    nodes = world(shard("a-1"), shard("b-1", S.UNHEALTHY, message=PROBE), since={"b-1": 994.0})
    hung = [ready("a"), ready("b", phase=Phase.UNHEALTHY)]
    assert not of(d.CreateReplica, run(hung, nodes))
    said = "ejected by router r1 for 2s: 3 consecutive failures (last: HTTP 503)"
    out = run(hung, nodes, ejected={"b": said})
    assert len(of(d.CreateReplica, out)) == 1
    assert "past its 5s grace" in of(d.RecordEvent, out)[0].event.message


def test_a_router_ejection_alone_changes_nothing_but_an_event() -> None:
    """READY with probes passing and a router's ejection: no update, no command, one EjectedByRouter event."""
    nodes = world(shard("a-1"), shard("b-1"))
    said = "ejected by router r1 for 2s: 3 consecutive failures (last: connect refused)"
    out = run([ready("a"), ready("b")], nodes, ejected={"b": said})
    (note,) = out
    assert isinstance(note, d.RecordEvent) and note.event.reason == "EjectedByRouter"
    assert note.event.message.startswith(said) and "health probe passes" in note.event.message
    # Probes failing (not yet past the agent's threshold) and an ejection: out of routing, nothing replaced.
    nodes["n1"].shards["b-1"] = shard("b-1", failures=2)
    out = run([ready("a"), ready("b")], nodes, ejected={"b": said})
    assert updates(out)["b"].phase is Phase.UNHEALTHY and not of(d.CreateReplica, out)


def test_conditions_and_events_tell_unhealthy_and_recovered() -> None:
    """Ready False (Unhealthy) with the agent's reason, Degraded with its last output; events on each step."""
    r = ready("b", phase=Phase.UNHEALTHY, message=f"unhealthy on node n1: {PROBE}",
              last_output=("CUDA error: an illegal memory access",))
    cs = {c.type: c for c in cond.replica_conditions(r, spec(), {}, now=1000.0, crash_loop_after=3)}
    assert (cs["Ready"].status, cs["Ready"].reason) == ("False", "Unhealthy") and PROBE in cs["Ready"].message
    assert cs["Degraded"].reason == "Unhealthy" and "illegal memory access" in cs["Degraded"].message
    model = {c.type: c for c in cond.model_conditions(spec(), [ready("a"), r], {"b": tuple(cs.values())}, {})}
    assert model["Degraded"].reason == "ReplicaUnhealthy"
    (went,) = ev.replica_events(ready("b"), r, now=1.0, crash_loop_after=3)
    assert (went.kind, went.reason) == ("Warning", "Unhealthy")
    assert went.message == f"replica b unhealthy on node n1: {PROBE}"
    (back,) = ev.replica_events(r, ready("b"), now=2.0, crash_loop_after=3)
    assert back.reason == "Recovered" and "passes again" in back.message


def test_a_group_whose_rank_stops_answering_leaves_routing_and_is_replaced_whole() -> None:
    """Rank 1 Unhealthy: the group is Unhealthy; past the grace a new group starts, then every old rank is stopped."""
    ranks = {"r1-1-0": S.READY}
    n1, n2 = ib_node("n1", shards=ranks), ib_node("n2", shards={"r1-1-1": S.READY})
    n3, n4 = ib_node("n3"), ib_node("n4")
    n2.shards["r1-1-1"] = shard("r1-1-1", S.UNHEALTHY, message=PROBE)
    n2.unhealthy_since["r1-1-1"] = 995.0
    nodes = {n.id: n for n in (n1, n2, n3, n4)}
    models = {"m": GROUP}
    out = decide.reconcile(models, [group(Phase.READY)], nodes, now=1000.0, cfg=CFG)
    got = updates(out)["r1"]
    assert got.phase is Phase.UNHEALTHY and "rank 1 on node n2" in got.message and PROBE in got.message
    assert not of(d.CreateReplica, out) and not of(d.StopShard, out)
    out = decide.reconcile(models, [got], nodes, now=1030.0, cfg=CFG)
    assert len(of(d.CreateReplica, out)) == 1 and not of(d.StopShard, out)
    assert "unhealthy on node n2 past its 30s grace" in of(d.RecordEvent, out)[0].event.message
    new = dataclasses.replace(group(Phase.READY), id="r2", members=(), node_id="n3", shard_id="r2-1")
    n3.shards["r2-1"] = shard("r2-1")
    out = decide.reconcile(models, [got, new], nodes, now=1031.0, cfg=CFG)
    assert sorted(x.shard_id for x in of(d.StopShard, out)) == ["r1-1-0", "r1-1-1"]
    assert not of(d.DrainShard, out)


# -- the control plane's loop, with a real store ----------------------------------------------
def test_the_control_plane_tells_the_whole_story(tmp_path: Path) -> None:
    """Probe fails: out of the endpoints doc, listed unhealthy; past the grace: replaced, stopped, told in events."""
    store, clock, link = Store.open(tmp_path), stepped.Clock(), stepped.Link()
    store.put_model(specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"},
                                          "spec": {"engine": "sim", "replicas": 2}}))
    reports = RouterEvents(clock=clock)
    c = Cluster(store, clock=clock, cfg=CFG, heartbeat_timeout_s=1e9, ejections=reports.current)
    c.node_registered(StoredNode("n1", "n1", "127.0.0.1", "0", INV, {}, 0.0, clock()), [], link)
    c.reconcile_once()
    c.reconcile_once()
    for _, sid in list(link.sent):
        c.shard_reported("n1", ShardStatus(sid, sid.rsplit("-", 1)[0], S.READY, endpoint=f"http://h/{sid}"))
    clock.now += 1
    c.reconcile_once()
    a, b = sorted(store.list_replicas(), key=lambda r: r.id)

    def doc() -> dict[str, Any]:
        (m,) = c.endpoints_doc().to_doc()["models"]
        return m

    assert {e["replica_id"] for e in doc()["endpoints"]} == {a.id, b.id} and doc()["unhealthy"] == []
    c.shard_reported("n1", ShardStatus(b.shard_id or "", b.id, S.READY, endpoint="x", probe_failures=1,
                                       message="health probe failed 1/3: timed out"))
    clock.now += 1
    c.reconcile_once()
    assert [e["replica_id"] for e in doc()["endpoints"]] == [a.id]
    assert [u["replica_id"] for u in doc()["unhealthy"]] == [b.id]

    c.shard_reported("n1", ShardStatus(b.shard_id or "", b.id, S.UNHEALTHY, endpoint="x", probe_failures=3,
                                       message=PROBE))
    clock.now += 1
    c.reconcile_once()
    assert not [x for x in link.sent if x[0] == "stop"]
    clock.now += 31  # past the grace, counted from the Unhealthy report
    c.reconcile_once()
    c.reconcile_once()  # places the replacement
    new = [r for r in store.list_replicas() if r.id not in (a.id, b.id)]
    assert len(new) == 1 and new[0].phase is Phase.STARTING
    c.shard_reported("n1", ShardStatus(new[0].shard_id or "", new[0].id, S.READY, endpoint="http://h/new"))
    clock.now += 1
    c.reconcile_once()
    assert ("stop", b.shard_id) in link.sent and ("drain", b.shard_id) not in link.sent
    events = [(e.reason, e.message) for e in store.list_events(obj=f"replica/{b.id}")]
    told = [r for r, _ in events]
    assert told[:2] == ["Created", "Scheduled"] and "Unhealthy" in told and "Replacing" in told
    assert told[-1] == "Terminating"
    assert f"replica {b.id} unhealthy on node n1: {PROBE}" in [m.split(";")[0] for _, m in events]
    assert {x["replica_id"] for x in doc()["endpoints"]} == {a.id, new[0].id}
