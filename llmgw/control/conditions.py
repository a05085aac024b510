"""Conditions of replicas and models: what holds, why, and since when (pure).

A phase says where a replica is in the plan; conditions say what is true of
it, each with a CamelCase reason and one sentence a person can act on:
``Placed``, ``WeightsPresent`` (``FetchStalled`` when a download stops making
progress), ``Ready`` and ``Degraded`` (crash loop, failing,
unhealthy, fewer Ready than wanted); a model also has ``Progressing`` while a roll or a
node drain replaces its replicas. ``last_transition`` changes only when the
status does, so "Ready False since 09:12" means the replica has not served
since then, however often its message was refreshed; the caller keeps the
previous conditions (the store persists them) and passes them back in.

Messages hold no running clock ("for 12s"): a message that changed every pass
would be written every pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from llmgw.control import status
from llmgw.control.placement import explain
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.core import sources
from llmgw.core.shards import ShardState
from llmgw.core.specs import ModelSpec
from llmgw.core.units import format_bytes

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"
#: Sources the agent fetches before launching (``llmgw.core.sources``).
REMOTE_PREFIXES = ("hf://", "http://", "https://", "mirror://")
#: Engine output lines a crash-loop condition carries.
LAST_OUTPUT_LINES = 5
#: For each condition type, the status that is bad news: a change to it is a Warning event.
BAD_STATUS = {"Placed": FALSE, "WeightsPresent": FALSE, "Ready": FALSE, "Degraded": TRUE, "Progressing": "",
              "Autoscaling": FALSE}


@dataclasses.dataclass(frozen=True, slots=True)
class Condition:
    type: str
    #: "True", "False" or "Unknown".
    status: str
    #: CamelCase, for machines and for grep.
    reason: str
    #: One sentence for a person.
    message: str
    #: When ``status`` last changed (epoch seconds).
    last_transition: float = 0.0

    def to_doc(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Condition:
        return cls(type=str(doc["type"]), status=str(doc["status"]), reason=str(doc.get("reason", "")),
                   message=str(doc.get("message", "")), last_transition=float(doc.get("last_transition", 0.0)))


def carry_times(new: Iterable[Condition], previous: Iterable[Condition], *, now: float) -> tuple[Condition, ...]:
    """``new`` with each transition time kept from ``previous`` where the status did not change."""
    before = {c.type: c for c in previous}
    out = []
    for c in new:
        old = before.get(c.type)
        when = old.last_transition if old is not None and old.status == c.status else now
        out.append(dataclasses.replace(c, last_transition=when))
    return tuple(out)


def transitions(new: Iterable[Condition], previous: Iterable[Condition]) -> list[Condition]:
    """Conditions whose status changed (a type seen for the first time is not a change)."""
    before = {c.type: c for c in previous}
    return [c for c in new if c.type in before and before[c.type].status != c.status]


# -- replicas -----------------------------------------------------------------------
def _placed(r: ReplicaRecord, now: float) -> Condition:
    if r.phase in Phase.placed() and r.node_id:
        gpus = f" on GPU {', '.join(map(str, r.gpus))}" if r.gpus else ""
        estimated = (f"; memory estimated from weights: {format_bytes(r.memory_bytes)}"
                     f"{' per GPU' if r.gpus else ''}" if r.memory_estimated else "")
        ranks = (f" (leader of {len(r.members)} ranks: "
                 f"{', '.join(f'{m.node_id} as shard {m.shard_id}' for m in r.members)})" if r.members else "")
        return Condition("Placed", TRUE, "Scheduled",
                         f"on node {r.node_id}{gpus} as shard {r.shard_id}{estimated}{ranks}")
    if r.failures and r.next_attempt_at > now:
        return Condition("Placed", FALSE, "BackOff", r.message or "waiting before the next attempt")
    return Condition("Placed", FALSE, explain.reason_of(r.message) if r.message else "Waiting",
                     r.message or "waiting to be placed")


def _fetched_names(source: str, spec: ModelSpec) -> set[str]:
    """The cache names and source texts a node's fetched copy of ``source`` may be listed under."""
    try:
        src = sources.parse(source)
        if spec.source_file:
            src = sources.with_file(src, spec.source_file)
    except sources.SourceError:
        return {source}
    return {source, src.text, src.cache_name()}


def _remote_weights(r: ReplicaRecord, spec: ModelSpec, nodes: Mapping[str, NodeView]) -> Condition:
    """Remote weights: being fetched (FetchStalled when no byte comes), held by the node, or not there yet."""
    source = spec.source
    node = nodes.get(r.node_id or "")
    if node is None or r.phase not in Phase.placed():
        return Condition("WeightsPresent", UNKNOWN, "NotPlaced", "not on a node yet")
    st = node.shards.get(r.shard_id or "")
    if st is not None and st.state is ShardState.FETCHING:
        if st.fetch is not None and st.fetch.state == "stalled":
            why = f": {st.fetch.message}" if st.fetch.message else ""
            return Condition("WeightsPresent", FALSE, "FetchStalled",
                             f"the fetch of {source} onto node {node.id} has stalled{why}; it is retried with "
                             "backoff (check the node's route to the hub or mirror)")
        return Condition("WeightsPresent", UNKNOWN, "Fetching", f"node {node.id} is fetching {source}")
    names = _fetched_names(source, spec)
    held = next((w for w in node.inventory.weights if w.fetched_by_llmgw and (w.source in names or
                                                                             w.cache_name in names)), None)
    if held is not None:
        return Condition("WeightsPresent", TRUE, "Fetched", f"node {node.id} holds {source} (fetched by llmgw "
                                                            f"as {held.cache_name})")
    return Condition("WeightsPresent", UNKNOWN, "NotFetched",
                     f"node {node.id} does not hold {source} yet; its agent fetches it before the engine starts")


def _weights(r: ReplicaRecord, spec: ModelSpec | None, nodes: Mapping[str, NodeView]) -> Condition:
    source = spec.source if spec is not None else ""
    if spec is not None and source.startswith(REMOTE_PREFIXES):
        return _remote_weights(r, spec, nodes)
    if not source or source.startswith("pkg:"):
        return Condition("WeightsPresent", UNKNOWN, "NotTracked",
                         f"{'an installed package' if source else 'no source'}: weights are not tracked")
    if not source.startswith("file://"):
        return Condition("WeightsPresent", UNKNOWN, "FetchedByEngine", f"the engine fetches {source} itself")
    node = nodes.get(r.node_id or "")
    if node is None or r.phase not in Phase.placed():
        return Condition("WeightsPresent", UNKNOWN, "NotPlaced", "not on a node yet")
    path = source[len("file://"):].rstrip("/")
    inv = node.inventory
    if any(w.path.rstrip("/") == path for w in inv.weights):
        return Condition("WeightsPresent", TRUE, "Found", f"node {node.id} holds {path}")
    if any(path.startswith(d.path.rstrip("/") + "/") for d in inv.model_dirs):
        return Condition("WeightsPresent", FALSE, "NotFound",
                         f"node {node.id} does not list {path} in its model directories; copy it there "
                         "or point spec.source at a file the node has")
    return Condition("WeightsPresent", UNKNOWN, "OutsideModelDirs",
                     f"{path} is outside node {node.id}'s model directories, so the node does not report it")


def _ready(r: ReplicaRecord) -> Condition:
    if r.phase is Phase.READY:
        return Condition("Ready", TRUE, "Serving", f"serving on node {r.node_id} at {r.endpoint}")
    if r.phase is Phase.STARTING:
        return Condition("Ready", FALSE, "Starting", f"starting on node {r.node_id}")
    if r.phase is Phase.TERMINATING:
        return Condition("Ready", FALSE, "Terminating", r.message or "being stopped")
    if r.phase is Phase.UNHEALTHY:
        return Condition("Ready", FALSE, "Unhealthy", r.message or f"its health probe fails on node {r.node_id}")
    return Condition("Ready", FALSE, "NotPlaced", "not on a node")


def _degraded(r: ReplicaRecord, crash_loop_after: int) -> Condition:
    if r.failures >= crash_loop_after:
        tail = [line for line in r.last_output if line.strip()][-LAST_OUTPUT_LINES:]
        out = f"; last output: {' | '.join(tail)}" if tail else ""
        return Condition("Degraded", TRUE, "CrashLoop",
                         f"failed {r.failures} times in a row: {r.message}{out}")
    if r.phase is Phase.UNHEALTHY:
        # Its process lives and does not answer: the engine's last lines often say why (a CUDA error).
        tail = [line for line in r.last_output if line.strip()][-LAST_OUTPUT_LINES:]
        out = f"; last output: {' | '.join(tail)}" if tail else ""
        return Condition("Degraded", TRUE, "Unhealthy", f"{r.message}{out}")
    if r.failures:
        return Condition("Degraded", TRUE, "Failing", r.message or f"failed {r.failures} times in a row")
    return Condition("Degraded", FALSE, "AsExpected", "no failure since it was last Ready")


def replica_conditions(r: ReplicaRecord, spec: ModelSpec | None, nodes: Mapping[str, NodeView], *,
                       now: float, crash_loop_after: int) -> tuple[Condition, ...]:
    """The replica's conditions, transition times not yet set (see ``carry_times``)."""
    return (_placed(r, now), _weights(r, spec, nodes), _ready(r), _degraded(r, crash_loop_after))


# -- models -------------------------------------------------------------------------
def model_conditions(spec: ModelSpec, replicas: Iterable[ReplicaRecord],
                     replica_conds: Mapping[str, tuple[Condition, ...]],
                     nodes: Mapping[str, NodeView]) -> tuple[Condition, ...]:
    """The model's conditions from its replicas' (Terminating replicas are on their way out and not counted)."""
    all_mine = list(replicas)
    mine = [r for r in all_mine if r.phase is not Phase.TERMINATING]
    desired, ready = spec.replicas, sum(1 for r in mine if r.phase is Phase.READY)
    by_type: dict[str, list[Condition]] = {}
    for r in mine:
        for c in replica_conds.get(r.id, ()):
            by_type.setdefault(c.type, []).append(c)

    placed = by_type.get("Placed", [])
    # Only a refusal counts against the model: a replica created this pass and
    # not yet tried, or one waiting out a failure's backoff (Degraded tells
    # that), would make the condition flap on every roll step and every retry.
    waiting = [c for c in placed if c.status != TRUE and c.reason not in ("Waiting", "BackOff")]
    if waiting:
        placed_c = Condition("Placed", FALSE, waiting[0].reason,
                             f"{len(placed) - len(waiting)} of {len(placed)} replicas placed; {waiting[0].message}")
    else:
        placed_c = Condition("Placed", TRUE, "NoRefusal", "no replica was refused a node")

    weights = by_type.get("WeightsPresent", [])
    missing = [c for c in weights if c.status == FALSE]
    if missing:
        weights_c = Condition("WeightsPresent", FALSE, missing[0].reason, missing[0].message)
    elif weights and all(c.status == TRUE for c in weights):
        weights_c = Condition("WeightsPresent", TRUE, "Found", "every placed replica's node holds the weights")
    else:
        first = next((c for c in weights if c.status == UNKNOWN), None)
        weights_c = Condition("WeightsPresent", UNKNOWN, first.reason if first else "NotPlaced",
                              first.message if first else "no replica is on a node")

    head = f"{ready} of {desired} replicas Ready"
    if desired == 0 and spec.autoscale is not None:
        ready_c = Condition("Ready", TRUE, "Cold", status.cold_message(spec))
    elif desired == 0:
        ready_c = Condition("Ready", TRUE, "ScaledToZero", "replicas is 0; set spec.replicas to serve it")
    elif ready >= desired:
        ready_c = Condition("Ready", TRUE, "ReplicasReady", head)
    else:
        ready_c = Condition("Ready", FALSE, "ReplicasNotReady", head)

    looping = [c for c in by_type.get("Degraded", []) if c.reason == "CrashLoop"]
    failing = [c for c in by_type.get("Degraded", []) if c.reason == "Failing"]
    hung = [c for c in by_type.get("Degraded", []) if c.reason == "Unhealthy"]
    if looping:
        degraded_c = Condition("Degraded", TRUE, "CrashLoop", f"{head}; a replica {looping[0].message}")
    elif hung:
        degraded_c = Condition("Degraded", TRUE, "ReplicaUnhealthy", f"{head}; a replica is {hung[0].message}")
    elif failing:
        degraded_c = Condition("Degraded", TRUE, "ReplicaFailing", f"{head}; a replica failed: {failing[0].message}")
    elif ready < desired and ready and status.scaling_up(spec, (r for r in mine if r.phase is not Phase.READY)):
        degraded_c = Condition("Degraded", FALSE, "ScalingUp", f"{head}; the autoscaler raised the count and the "
                                                               "new replicas are starting")
    elif ready < desired:
        degraded_c = Condition("Degraded", TRUE, "ReplicasUnavailable", head)
    else:
        degraded_c = Condition("Degraded", FALSE, "AsExpected", head)

    fp = spec.fingerprint()

    def on_draining(r: ReplicaRecord) -> bool:
        # Looked up per replica, not a set of every draining node built per model: that scanned all
        # 10,000 nodes for each of 100 models, 28 ms a pass holding the GIL the event loop waits for.
        node = nodes.get(r.node_id) if r.node_id else None
        return node is not None and node.draining

    stale = [r for r in all_mine if r.fingerprint != fp]
    moving = [r for r in all_mine if r.fingerprint == fp and on_draining(r)]
    updated = sum(1 for r in mine if r.fingerprint == fp and not on_draining(r))
    if stale:
        prog = Condition("Progressing", TRUE, "RollingUpdate",
                         f"{updated} of {desired} replicas run the current spec; {len(stale)} old ones left")
    elif moving:
        prog = Condition("Progressing", TRUE, "NodeDraining",
                         f"{len(moving)} replicas are moving off draining nodes")
    else:
        prog = Condition("Progressing", FALSE, "UpToDate", "every replica runs the current spec")
    return (placed_c, weights_c, ready_c, degraded_c, prog)


def autoscaling(spec: ModelSpec, *, replicas: int, limited: str, unplaceable: bool) -> Condition:
    """An autoscaled model's ``Autoscaling`` condition: False when the load asks for more than it may have.

    ``limited`` is the autoscaler's sentence (``core.autoscale.Decision.limited``); ``unplaceable`` says it
    came from a replica that waits for a node (NoCapacity) rather than from ``max_replicas`` (AtMaxReplicas).
    """
    auto = spec.autoscale
    assert auto is not None
    count = f"{replicas} replica{'' if replicas == 1 else 's'}"
    if limited and unplaceable:
        return Condition("Autoscaling", FALSE, "NoCapacity", f"held at {count}: a replica waits for a node "
                         f"({limited}); add a node or free one, or lower spec.autoscale.max_replicas")
    if limited:
        # The autoscaler's sentence names the cap already ("at max_replicas 4: the load asks for 6 ..."):
        # "held at 4 replicas, at max_replicas 4: ..." said it twice.
        held = f"held {limited}" if limited.startswith("at max_replicas") else f"held at {count}, {limited}"
        return Condition("Autoscaling", FALSE, "AtMaxReplicas",
                         f"{held}; raise spec.autoscale.max_replicas to follow it")
    return Condition("Autoscaling", TRUE, "WithinBounds",
                     f"{count}, between min {auto.min_replicas} and max {auto.max_replicas}")
