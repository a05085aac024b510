"""One pass's placement: an index over the nodes, so each replica costs a lookup, not a scan.

Scanning every node for every pending replica took 63 s for 10,000 replicas on
10,000 nodes. Instead, for each kind of model (engine, version, selector and
pool: what decides whether a node can *ever* take it) the static checks run
once, and the nodes that pass are kept in lists sorted by their free resources
(free GPUs then free memory for GPU models, free memory then threads for CPU
ones). A replica then looks at the right end of a list:

* binpack: bisect to the first node with enough of the first resource and walk
  up to the first one that fits: the fullest node that still takes it;
* spread: walk down from the most free node, skipping nodes that already hold
  this model; only when every node holds one do those count, fewest first.

Either way nodes holding the weights come first: the same lists are kept for
the nodes that hold a model's file. For spread the replica count comes before
the weights: spread exists so that one node lost does not take the model down,
and putting every replica where the file happens to be would undo it.

A remote source (hf://, http(s)://, mirror://) is matched by its text: weights
llmgw fetched report it, and a node with a FETCHING shard of it counts as
holding it, so a second replica joins the download already under way. Before
any node has it, the metadata the control plane read remotely
(``llmgw.control.remotemeta``, passed in as ``remote``; never fetched here)
gives the memory estimate, the engine check's shape and the disk a node must
have free in its weights directory (``filters.disk_reason``).

Placing a replica changes one node, which moves in each list it is in: a
bisect and a list insert, fast for 10,000 entries. A model refused once in a
pass is refused for the rest of it (resources only shrink within a pass), so a
thousand pending replicas that fit nowhere cost one explanation, not a thousand
scans. What a walk still pays for is nodes with enough of the first resource
but not of the rest (GPUs too small or too old, threads short): on a cluster
made mostly of such nodes a walk is long, though never longer than one scan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping

from llmgw.control.placement import filters as f
from llmgw.control.placement import gpus as gpus_mod
from llmgw.control.placement import order
from llmgw.control.placement.explain import Refused, engine_refusal, metadata_pending, refusal
from llmgw.control.placement.ledger import Ledger
from llmgw.control.placement.needs import Need, RemoteWeights, context_tokens, fetched_source, need_for, weights_key
from llmgw.control.state import NodeView
from llmgw.core import enginecheck, engines, sources
from llmgw.core import estimate as estimate_mod
from llmgw.core.inventory import Gpu, WeightFile
from llmgw.core.shards import ShardState
from llmgw.core.specs import ModelSpec

#: (weights, context tokens, ranks, on a GPU) -> bytes one rank needs, or None when the metadata is not enough.
Estimator = Callable[[WeightFile, int, int, bool], "int | None"]


def estimate_memory(weight: WeightFile, ctx_tokens: int, ranks: int, gpu: bool) -> int | None:
    """The estimator a pass uses unless given another: ``llmgw.core.estimate``."""
    return estimate_mod.memory_bytes(weight, ctx_tokens, tensor_parallel=ranks, gpu=gpu)


@dataclasses.dataclass(frozen=True, slots=True)
class Placed:
    node_id: str
    #: GPU indices on the node, in order; empty for a CPU replica.
    gpus: tuple[int, ...] = ()
    #: Memory it was placed with (per GPU for a GPU replica); 0 when none was stated or estimated.
    memory_bytes: int = 0
    memory_estimated: bool = False
    #: Why the memory could not be estimated from a remote source's metadata ("" when it was, or not asked).
    metadata_problem: str = ""


#: The first resource of a node that lacks the threads an order is for: below anything a need asks.
class Placer:
    """Places replicas one at a time within a pass, keeping what each placement took."""

    def __init__(self, nodes: Iterable[NodeView], ledger: Ledger | None = None, *,
                 estimate: Estimator | None = estimate_memory,
                 remote: Mapping[str, RemoteWeights] | None = None) -> None:
        """``remote``: what was read of remote sources' metadata (``llmgw.control.remotemeta``), by the
        fetched source's text. None: nothing reads it here (tests, ``place``), so a remote model is placed
        at once; a mapping without the source: its read has not answered yet, and the model waits for it."""
        ledger = ledger if ledger is not None else Ledger()
        self.states: list[f.NodeState] = []
        for i, v in enumerate(sorted(nodes, key=lambda v: v.id)):
            self.states.append(f.NodeState(
                v, i, free_memory=v.inventory.memory_available_bytes - ledger.loading_memory.get(v.id, 0),
                free_threads=v.inventory.cpu_count - ledger.threads.get(v.id, 0),
                held=dict(ledger.gpus.get(v.id, {}))))
        self._pos = {st.view.id: st.idx for st in self.states}
        self._occupied: dict[str, dict[int, int]] = {}
        for (node_id, model), n in ledger.per_model.items():
            if node_id in self._pos:
                self._occupied.setdefault(model, {})[self._pos[node_id]] = n
        self._estimate = estimate
        self._remote = remote
        self._needs: dict[str, Need] = {}
        self._refused: dict[str, Refused] = {}
        self._engine_checked: dict[str, Refused | None] = {}
        #: static key -> (member positions, member set, reason of each non-member)
        self._classes: dict[tuple[object, ...], tuple[list[int], set[int], dict[int, f.Reason]]] = {}
        self._weights: dict[str, list[int]] | None = None
        self._holding: dict[str, set[int]] = {}
        self._orders: dict[tuple[object, ...], order.Order] = {}
        self._in_orders: list[list[order.Order]] = [[] for _ in self.states]
        #: position -> rendezvous ports given to group leaders there in this pass.
        self.leader_ports: dict[int, set[int]] = {}

    def replicas_of(self, model: str) -> dict[int, int]:
        """Node position -> replicas of ``model`` there, this pass's included."""
        return self._occupied.get(model, {})

    # -- what a model needs, and which nodes could ever take it ---------------------
    def need(self, model: str, spec: ModelSpec) -> Need:
        found = self._needs.get(model)
        if found is None:
            remote = self._remote_of(spec)
            disk = remote.weight.size_bytes if remote is not None and remote.weight is not None else 0
            found = self._needs[model] = need_for(model, spec, estimate=self._estimate_for(spec), disk_bytes=disk)
        return found

    def _remote_of(self, spec: ModelSpec) -> RemoteWeights | None:
        """What was read of ``spec``'s remote source; None for a local one, or one not read (yet)."""
        if self._remote is None:
            return None
        fetched = fetched_source(spec)
        return self._remote.get(fetched.text) if fetched is not None else None

    def metadata_problem(self, spec: ModelSpec) -> str:
        """Why a remote source's metadata could not be read, when its replica's memory needed it; else ""."""
        remote = self._remote_of(spec)
        if remote is None or remote.weight is not None:
            return ""
        return f"cannot read the metadata of {spec.source}: {remote.problem}"

    def _estimate_for(self, spec: ModelSpec) -> int | None:
        res = spec.resources
        unstated = res.gpus.memory_bytes == 0 if res.gpus.count else res.memory_bytes == 0
        if self._estimate is None or not unstated:
            return None
        ranks = res.gpus.count * res.nnodes
        ctx = spec.context_length or context_tokens(spec.engine, spec.engine_args)
        # A CPU replica's engine may cost more than the estimate's generic process overhead
        # (vLLM: three processes each holding torch); a GPU one's host memory is not what is placed.
        found = engines.record(spec.engine)
        extra = found.cpu_process_overhead_bytes if found is not None and not ranks else 0
        for w in self._weight_files(spec):
            est = self._estimate(w, ctx, max(ranks, 1), ranks > 0)
            if est:
                return est + extra
        return None

    def _weight_files(self, spec: ModelSpec) -> Iterator[WeightFile]:
        """What the nodes holding ``spec``'s weights report of them, node by node, then what was read remotely.

        The same path is taken to be the same file on every node (a shared
        filesystem, or one copy made everywhere): the first that says decides.
        A remote source's weights fetched onto a node are matched by their
        source; before any node has them, the metadata read from the mirror or
        hub stands for them.
        """
        path = weights_key(spec)
        for idx in self.weights().get(path, ()) if path else ():
            for w in self.states[idx].view.inventory.weights:
                if w.path.rstrip("/") == path or w.source == path:
                    yield w
        remote = self._remote_of(spec)
        if remote is not None and remote.weight is not None:
            yield remote.weight

    def engine_refusal(self, model: str, spec: ModelSpec) -> Refused | None:
        """Why ``spec``'s engine would fail whatever the node (once per model and pass), or None.

        The checks that need a node's facts run per node as filters instead
        (a dtype's compute capability, GPU memory: ``needs``, ``gpus``): asking
        the engine check of each of 10,000 nodes would cost a pass seconds.
        """
        if model not in self._engine_checked:
            # Metadata read from the header or config.json (heads, context) says more than a
            # file whose metadata could not be read: that one is skipped, never guessed from.
            weight = next((w for w in self._weight_files(spec) if w.heads or w.context_length or w.head_dim), None)
            found = enginecheck.problems(enginecheck.Profile.of_model(spec), None, weight)
            self._engine_checked[model] = engine_refusal(model, spec.engine, found) if found else None
        return self._engine_checked[model]

    def weights(self) -> dict[str, list[int]]:
        """Weights key (``needs.weights_key``) -> positions of the nodes that hold those weights or fetch them now.

        A node fetching the weights counts as holding them: a second replica sent
        there waits for the download already under way, where any other node
        would start one of its own.
        """
        if self._weights is None:
            self._weights = {}
            for st in self.states:
                keys = {w.path.rstrip("/") for w in st.view.inventory.weights}
                keys.update(w.source for w in st.view.inventory.weights if w.source)
                for shard in st.view.shards.values():
                    if shard.state is ShardState.FETCHING and shard.spec is not None and shard.spec.source:
                        keys.add(_fetched_text(shard.spec.source, shard.spec.source_file))
                for key in keys:
                    self._weights.setdefault(key, []).append(st.idx)
        return self._weights

    def holds(self, need: Need) -> set[int]:
        """Positions of the nodes holding (or fetching) ``need``'s weights."""
        found = self._holding.get(need.weights_path)
        if found is None:
            found = self._holding[need.weights_path] = set(self.weights().get(need.weights_path, ()))
        return found

    def fits(self, need: Need, st: f.NodeState) -> list[Gpu] | None:
        """``filters.fits``, and room on the node's weights disk for a remote source's weights."""
        free = f.fits(need, st)
        if free is None or not need.disk_bytes or f.disk_reason(need, st, st.idx in self.holds(need)) is None:
            return free
        return None

    def members(self, need: Need) -> tuple[list[int], set[int], dict[int, f.Reason]]:
        found = self._classes.get(need.static_key)
        if found is None:
            members: list[int] = []
            out: dict[int, f.Reason] = {}
            for st in self.states:
                why = f.static_reason(need, st.view)
                if why is None:
                    members.append(st.idx)
                else:
                    out[st.idx] = why
            found = self._classes[need.static_key] = (members, set(members), out)
        return found

    def _order(self, need: Need, path: str) -> order.Order:
        gpu = need.gpu_count > 0
        key = (need.static_key, path, gpu, need.threads)
        found = self._orders.get(key)
        if found is None:
            members, member_set, _ = self.members(need)
            chosen = [i for i in self.weights().get(path, ()) if i in member_set] if path else members
            found = self._orders[key] = order.Order((self.states[i] for i in chosen), order.measure(gpu, need.threads))
            for i in chosen:
                self._in_orders[i].append(found)
        return found

    # -- one replica --------------------------------------------------------------------
    def place(self, model: str, spec: ModelSpec, *, replica_id: str = "") -> Placed | Refused:
        """Picks the node (and GPUs) for one more replica of ``model``, and takes them; or says why not."""
        need = self.need(model, spec)
        if need.nnodes > 1:
            return Refused(f"a replica of {model} spans {need.nnodes} nodes: it is placed as a group "
                           "(place_group), not one node at a time", {})
        refused = self._refused.get(model) or self.pending_metadata(spec) or self.engine_refusal(model, spec)
        if refused is not None:
            return refused
        found = self._pick(need)
        if found is None:
            refused = self._refused[model] = self.explain(need)
            return refused
        st, free = found
        placed = self.take(st, need, free, replica_id=replica_id)
        problem = self.metadata_problem(spec)
        return dataclasses.replace(placed, metadata_problem=problem) if problem else placed

    def pending_metadata(self, spec: ModelSpec) -> Refused | None:
        """The wait of a remote model whose metadata is being read: its disk and memory are not known yet.

        The read answers within its timeout, a failure included (``remotemeta``), so this
        never holds a replica longer than that: a failed read places it without an estimate.
        """
        if self._remote is None:
            return None
        fetched = fetched_source(spec)
        if fetched is None or fetched.text in self._remote:
            return None
        return metadata_pending(spec.source)

    def _pick(self, need: Need) -> tuple[f.NodeState, list[Gpu]] | None:
        # The least a node must have of the list's first resource. Without a
        # memory need that is nothing at all: a node whose loading replicas put
        # its free memory below zero still takes a replica that states none.
        first: float = need.gpu_count or need.memory_bytes or (order.SHORT + 1 if need.threads else -math.inf)
        if need.policy == "binpack":
            for o in self._tiers(need):
                for idx in o.ascending(first):
                    st = self.states[idx]
                    free = self.fits(need, st)
                    if free is not None:
                        return st, free
            return None
        held = self.replicas_of(need.model)
        for o in self._tiers(need):
            for idx in o.descending(first):
                if idx in held:
                    continue
                st = self.states[idx]
                free = self.fits(need, st)
                if free is not None:
                    return st, free
        # Every node that fits holds one already: the fewest, then weights, then most free.
        base = self._order(need, "")
        present = self.holds(need) if need.weights_path else set()
        for _, _, _, idx in sorted((n, i not in present, tuple(-x for x in base.key_of[i][:2]), i)
                                   for i, n in held.items() if i in base.key_of):
            free = self.fits(need, self.states[idx])
            if free is not None:
                return self.states[idx], free
        return None

    def _tiers(self, need: Need) -> list[order.Order]:
        tiers = [self._order(need, "")]
        if need.weights_path and need.weights_path in self.weights():
            tiers.insert(0, self._order(need, need.weights_path))
        return tiers

    def take(self, st: f.NodeState, need: Need, free: list[Gpu], *, replica_id: str = "") -> Placed:
        """Records one replica of ``need`` on ``st`` with GPUs from ``free``; every list it is in moves."""
        chosen = gpus_mod.choose(free, need.gpu_count) if need.gpu_count else ()
        st.free_memory -= need.memory_bytes
        st.free_threads -= need.threads
        if need.disk_bytes and st.idx not in self.holds(need):
            # The next replica of this model here shares this download; another model's needs more disk.
            st.disk_taken += need.disk_bytes
            self.holds(need).add(st.idx)
        for i in chosen:
            st.held[i] = replica_id
        counts = self._occupied.setdefault(need.model, {})
        counts[st.idx] = counts.get(st.idx, 0) + 1
        for o in self._in_orders[st.idx]:
            o.update(st)
        return Placed(st.view.id, chosen, need.placed_memory, need.memory_estimated)

    def reasons(self, need: Need) -> dict[str, f.Reason]:
        """Why each node cannot take ``need`` now."""
        _, _, static = self.members(need)
        out: dict[str, f.Reason] = {}
        for st in self.states:
            why = static.get(st.idx) or f.resource_reason(need, st)
            if why is None and need.disk_bytes:
                why = f.disk_reason(need, st, st.idx in self.holds(need))
            if why is not None:
                out[st.view.id] = why
        return out

    def explain(self, need: Need) -> Refused:
        return refusal(need, self.reasons(need))


def place(model: str, spec: ModelSpec, nodes: Iterable[NodeView], ledger: Ledger | None = None, *,
          estimate: Estimator | None = estimate_memory, replica_id: str = "",
          remote: Mapping[str, RemoteWeights] | None = None) -> Placed | Refused:
    """One replica on its own (tests, one-off questions); a pass uses one Placer for all of its replicas."""
    return Placer(nodes, ledger, estimate=estimate, remote=remote).place(model, spec, replica_id=replica_id)


def _fetched_text(source: str, source_file: str) -> str:
    """The fetched source's text of a shard's spec (``needs.fetched_source`` for a ShardSpec)."""
    if not source_file:
        return source
    try:
        return sources.with_file(sources.parse(source), source_file).text
    except ValueError:
        return source
