"""Conditions and events of replicas and models, from plain records."""

from __future__ import annotations

import dataclasses

from llmgw.control import conditions as cond
from llmgw.control import events as ev
from llmgw.control.reconcile import decide
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core.inventory import Inventory, ModelDir, WeightFile
from llmgw.core.shards import ShardState, ShardStatus
from llmgw.core.specs import ModelSpec

SPEC = ModelSpec(engine="sim", served_name="m", replicas=2)
GGUF = ModelSpec(engine="llamacpp", served_name="m", source="file:///models/a.gguf")


def node(nid: str = "n1", *, weights: tuple[str, ...] = ()) -> NodeView:
    inv = Inventory(cpu_count=4, memory_total_bytes=8 << 30, memory_available_bytes=4 << 30,
                    engines=(("sim", "1"), ("llamacpp", "1")),
                    model_dirs=(ModelDir("/models", 1 << 40, 1 << 39),),
                    weights=tuple(WeightFile(w, 1 << 20, "gguf") for w in weights))
    return NodeView(nid, inv, connected=True, reported=True)


def rep(phase: Phase = Phase.READY, rid: str = "r1", **kw: object) -> ReplicaRecord:
    placed = phase in Phase.placed()
    base = ReplicaRecord(id=rid, model="m", fingerprint=SPEC.fingerprint(), phase=phase, api_key="k",
                         node_id="n1" if placed else None, shard_id=f"{rid}-1" if placed else None,
                         endpoint="http://h:1" if phase is Phase.READY else "")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def by_type(cs: tuple[cond.Condition, ...]) -> dict[str, cond.Condition]:
    return {c.type: c for c in cs}


def conds(r: ReplicaRecord, spec: ModelSpec = SPEC, nodes: dict[str, NodeView] | None = None,
          now: float = 100.0) -> dict[str, cond.Condition]:
    return by_type(cond.replica_conditions(r, spec, nodes if nodes is not None else {"n1": node()}, now=now,
                                           crash_loop_after=3))


def test_ready_replica_is_placed_ready_and_not_degraded() -> None:
    """A serving replica: Placed, Ready, not Degraded; a sim source's weights are not tracked."""
    c = conds(rep())
    assert (c["Placed"].status, c["Placed"].reason) == ("True", "Scheduled")
    assert (c["Ready"].status, c["Ready"].message) == ("True", "serving on node n1 at http://h:1")
    assert (c["Degraded"].status, c["WeightsPresent"].status, c["WeightsPresent"].reason) == (
        "False", "Unknown", "NotTracked")


def test_unplaceable_replica_carries_the_refusal() -> None:
    """A Pending replica's Placed condition is False with the placement refusal as its message."""
    c = conds(rep(Phase.PENDING, message="no node can run a replica of m: n1 lacks engine vllm"))
    assert (c["Placed"].status, c["Placed"].reason) == ("False", "Unschedulable")
    assert "lacks engine vllm" in c["Placed"].message and c["Ready"].status == "False"


def test_weights_present_from_the_nodes_inventory() -> None:
    """A file source is True where the node lists it, False where its model dir lacks it."""
    r = rep(Phase.STARTING)
    assert conds(r, GGUF, {"n1": node(weights=("/models/a.gguf",))})["WeightsPresent"].status == "True"
    missing = conds(r, GGUF, {"n1": node()})["WeightsPresent"]
    assert (missing.status, missing.reason) == ("False", "NotFound") and "/models/a.gguf" in missing.message
    elsewhere = dataclasses.replace(GGUF, source="file:///tmp/a.gguf")
    assert conds(r, elsewhere, {"n1": node()})["WeightsPresent"].status == "Unknown"


def test_crash_loop_after_n_failures_shows_the_last_output() -> None:
    """Failures below N are Failing; at N the reason is CrashLoop and the message has the engine's last lines."""
    one = conds(rep(Phase.PENDING, failures=1, message="engine exited with code 1", next_attempt_at=200))
    assert (one["Degraded"].status, one["Degraded"].reason, one["Placed"].reason) == ("True", "Failing", "BackOff")
    out = tuple(f"line {i}" for i in range(10)) + ("", "error: bad flag --x")
    loop = conds(rep(Phase.PENDING, failures=3, message="crash loop: failed 3 times in a row", last_output=out))
    d = loop["Degraded"]
    assert d.reason == "CrashLoop" and "error: bad flag --x" in d.message and "line 6" in d.message
    assert "line 5" not in d.message  # only the last few lines


def test_reconciler_crash_loop_condition_end_to_end() -> None:
    """Three failed shards in a row, as the reconciler records them, make the CrashLoop condition."""
    cfg = decide.Config(crash_loop_after=3, backoff_base_s=1)
    r = rep(Phase.STARTING, failures=2, started_at=90, sent_at=90)
    n = node()
    n.shards["r1-1"] = ShardStatus("r1-1", "r1", ShardState.FAILED, exit_code=2, last_output=("boom: no such file",))
    out = decide.reconcile({"m": SPEC}, [r], {"n1": n}, now=100, cfg=cfg)
    failed = next(x.record for x in out if hasattr(x, "record"))
    assert failed.failures == 3 and failed.next_attempt_at == 104  # backoff 1, 2, 4 s
    c = by_type(cond.replica_conditions(failed, SPEC, {"n1": n}, now=100, crash_loop_after=3))
    assert c["Degraded"].reason == "CrashLoop" and "boom: no such file" in c["Degraded"].message
    (e,) = ev.replica_events(r, failed, now=100, crash_loop_after=3)
    assert (e.kind, e.reason, e.node) == ("Warning", "CrashLoop", "n1") and "boom: no such file" in e.message


def test_transition_time_changes_only_with_status() -> None:
    """A new message keeps the time; a new status takes ``now``."""
    old = (cond.Condition("Ready", "False", "Starting", "starting on node n1", 10.0),)
    same = cond.carry_times((cond.Condition("Ready", "False", "NotPlaced", "other words"),), old, now=50)
    assert same[0].last_transition == 10.0
    flipped = cond.carry_times((cond.Condition("Ready", "True", "Serving", "serving"),), old, now=50)
    assert flipped[0].last_transition == 50 and cond.transitions(flipped, old) == [flipped[0]]
    assert cond.transitions(flipped, ()) == []  # first sight is not a transition


def test_model_conditions_degraded_and_progressing() -> None:
    """One of two Ready: not Ready, Degraded; an outdated replica makes it Progressing (a roll)."""
    a, b = rep(rid="a"), rep(Phase.STARTING, rid="b")
    nodes = {"n1": node()}
    rc = {r.id: cond.replica_conditions(r, SPEC, nodes, now=1, crash_loop_after=3) for r in (a, b)}
    m = by_type(cond.model_conditions(SPEC, [a, b], rc, nodes))
    assert (m["Ready"].status, m["Ready"].message) == ("False", "1 of 2 replicas Ready")
    assert (m["Degraded"].status, m["Degraded"].reason) == ("True", "ReplicasUnavailable")
    assert (m["Placed"].status, m["Progressing"].status) == ("True", "False")
    old = dataclasses.replace(b, fingerprint="stale", phase=Phase.READY)
    rc["b"] = cond.replica_conditions(old, SPEC, nodes, now=1, crash_loop_after=3)
    m = by_type(cond.model_conditions(SPEC, [a, old], rc, nodes))
    assert (m["Ready"].status, m["Progressing"].reason) == ("True", "RollingUpdate")
    assert m["Progressing"].message.startswith("1 of 2 replicas run the current spec")


def test_model_crash_loop_is_named_on_the_model() -> None:
    """A replica in a crash loop makes the model Degraded with reason CrashLoop and the replica's message."""
    a = rep(rid="a")
    b = rep(Phase.PENDING, rid="b", failures=5, message="crash loop: failed 5 times", last_output=("oops",))
    nodes = {"n1": node()}
    rc = {r.id: cond.replica_conditions(r, SPEC, nodes, now=1, crash_loop_after=3) for r in (a, b)}
    m = by_type(cond.model_conditions(SPEC, [a, b], rc, nodes))
    assert m["Degraded"].reason == "CrashLoop" and "oops" in m["Degraded"].message


def test_replica_events_tell_each_move_once() -> None:
    """Created, Scheduled, Ready, Terminating, Deleted; a pass that changed nothing says nothing."""
    pending = rep(Phase.PENDING)
    starting = rep(Phase.STARTING)
    ready = rep()
    term = dataclasses.replace(ready, phase=Phase.TERMINATING, message="scaled down to 1 replicas")
    steps = [(None, pending), (pending, starting), (starting, ready), (ready, ready), (ready, term), (term, None)]
    reasons = [[e.reason for e in ev.replica_events(b, a, now=1, crash_loop_after=3)] for b, a in steps]
    assert reasons == [["Created"], ["Scheduled"], ["Ready"], [], ["Terminating"], ["Deleted"]]
    lost = dataclasses.replace(pending, message="node n1 lost for 40s; placing elsewhere")
    (e,) = ev.replica_events(ready, lost, now=1, crash_loop_after=3)
    assert (e.kind, e.reason, e.node) == ("Warning", "Rescheduled", "n1")


def test_condition_events_warn_on_the_bad_side() -> None:
    """Ready turning False is a Warning; turning True again is Normal."""
    up = (cond.Condition("Ready", "True", "ReplicasReady", "2 of 2"),)
    down = (cond.Condition("Ready", "False", "ReplicasNotReady", "1 of 2"),)
    (w,) = ev.condition_events("model/m", "m", down, up, now=5)
    (n,) = ev.condition_events("model/m", "m", up, down, now=6)
    assert (w.kind, w.reason, n.kind) == ("Warning", "ReplicasNotReady", "Normal")
    assert ev.condition_events("model/m", "m", up, up, now=7) == []


def test_model_placed_counts_refusals_only() -> None:
    """A just-created or backing-off replica does not make the model unplaced; a refusal does, with its words."""
    nodes = {"n1": node()}
    fresh = rep(Phase.PENDING, rid="a")
    backing = rep(Phase.PENDING, rid="b", failures=1, next_attempt_at=1e9, message="engine exited")
    refused = rep(Phase.PENDING, rid="c", message="no node can run a replica of m: n1 is cordoned")

    def placed(*rs: ReplicaRecord) -> cond.Condition:
        rc = {r.id: cond.replica_conditions(r, SPEC, nodes, now=1, crash_loop_after=3) for r in rs}
        return by_type(cond.model_conditions(SPEC, list(rs), rc, nodes))["Placed"]

    assert placed(fresh, backing).status == "True"
    got = placed(fresh, refused)
    assert (got.status, got.reason) == ("False", "Unschedulable") and "is cordoned" in got.message
