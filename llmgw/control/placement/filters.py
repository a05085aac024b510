"""Why a node cannot take a replica: one check per requirement, each returning its reason.

The checks run in a fixed order, and a node's *stage* is how far down it got:
the explanation of a refusal names the nodes that got furthest, because "node05
has 1 free GPU" helps the person reading it and "node99 is not connected" for
the other 9,999 nodes does not.

Static checks (connected, cordon, engine, CPU features, labels) do not change within a pass,
so the placer runs them once per kind of model; the resource checks read the
node's state as the pass has left it so far.
"""

from __future__ import annotations

import dataclasses
from itertools import islice

from llmgw.control.placement import gpus as gpus_mod
from llmgw.control.placement.needs import Need
from llmgw.control.state import NodeView
from llmgw.core import engines
from llmgw.core.inventory import Gpu, Inventory, ModelDir
from llmgw.core.provision import EngineInstall, InstallState
from llmgw.core.shards import ShardState
from llmgw.core.units import format_bytes

#: INSTALLING: the node would do but for an engine llmgw is installing there (or failed to, or cannot):
#: nearer than any node that lacks the engine outright, so its install's sentence leads the message.
CONNECTED, CORDON, ENGINE, VERSION, CPU, POOL, SELECTOR, INSTALLING, GPUS, MEMORY, THREADS, DISK, FABRIC = range(13)
#: How many of a node's unusable GPUs a reason names.
_GPUS_NAMED = 3


@dataclasses.dataclass(frozen=True, slots=True)
class Reason:
    #: How far the node got (one of the constants above): higher is nearer to fitting.
    stage: int
    #: The sentence on its own, after the node's id: "lacks engine llamacpp (has: sim)".
    text: str
    #: Within a stage, higher is nearer (free GPUs that qualify, free memory, ...).
    nearness: int = 0
    #: The short form used after a headline that says what is needed: "has 1 (GPU 3 has 75 GiB used)".
    short: str = ""


@dataclasses.dataclass(slots=True)
class NodeState:
    """A node's free resources as this pass has left them."""

    view: NodeView
    #: Position in the id-sorted node list: the final tie-break.
    idx: int
    free_memory: int
    free_threads: int
    #: GPU index -> replica holding it.
    held: dict[int, str]
    #: Disk that remote weights sent here in this pass will take in its weights directory.
    disk_taken: int = 0

    @property
    def unheld_gpus(self) -> int:
        return len(self.view.inventory.gpus) - sum(1 for g in self.view.inventory.gpus if g.index in self.held)


version_matches = engines.version_matches


def _install_of(need: Need, node: NodeView) -> EngineInstall | None:
    """The node's install of the engine ``need`` wants that is not Ready (installing, failed, unsupported), if any."""
    for i in node.inventory.installs:
        if i.engine == need.engine and i.state is not InstallState.Ready \
                and (not need.engine_version or version_matches(i.version, need.engine_version)):
            return i
    return None


def static_reason(need: Need, node: NodeView) -> Reason | None:
    """The first check that does not depend on free resources and fails, or None."""
    if not node.connected:
        return Reason(CONNECTED, "is not connected")
    if node.leaving:
        return Reason(CONNECTED, f"is leaving ({node.leaving})")
    if node.cordoned:
        return Reason(CORDON, "is cordoned")
    missing = _engine_reason(need, node)
    rest = _label_reason(need, node)
    if missing is not None:
        install = _install_of(need, node) if rest is None else None
        # The install's own words ("Installing vllm 0.32.0 on node05: downloading 1.2/3.4 GB"): without
        # them a replica waiting for an install read "lacks engine vllm" for the minutes it took.
        return Reason(INSTALLING, install.sentence(node.id)) if install is not None else missing
    return rest


def _engine_reason(need: Need, node: NodeView) -> Reason | None:
    versions = [v for name, v in node.inventory.engines if name == need.engine]
    if not versions:
        installed = ", ".join(sorted(node.inventory.engine_names())) or "none"
        return Reason(ENGINE, f"lacks engine {need.engine} (has: {installed})")
    if need.engine_version and not any(version_matches(v, need.engine_version) for v in versions):
        return Reason(VERSION, f"lacks {need.engine} {need.engine_version} (has {', '.join(sorted(versions))})")
    return None


def _label_reason(need: Need, node: NodeView) -> Reason | None:
    if need.cpu_flags_any:
        # A node that does not list its CPU's flags is not refused on a guess.
        flags = node.inventory.host.cpu_flags
        if flags and not any(x in flags for x in need.cpu_flags_any):
            return Reason(CPU, f"has a CPU without {' or '.join(need.cpu_flags_any)}")
    if need.pool:
        pool = node.labels.get("pool")
        if pool != need.pool:
            where = f"is in pool {pool}" if pool else "is in no pool"
            return Reason(POOL, f"{where}, not {need.pool}")
    for key, want in need.selector:
        have = node.labels.get(key)
        if have != want:
            what = f"has {key}={have}" if have is not None else f"has no label {key}"
            return Reason(SELECTOR, f"{what}, wants {key}={want}")
    return None


def gpus_wanted(need: Need) -> str:
    """"2 free GPUs with >= 40.0 GiB and compute capability >= 8.0"."""
    text = f"{need.gpu_count} free GPU{'s' if need.gpu_count != 1 else ''}"
    quals = []
    if need.gpu_memory_bytes:
        quals.append(f">= {format_bytes(need.gpu_memory_bytes)}")
    if need.compute_capability is not None:
        quals.append("compute capability >= {}.{}".format(*need.compute_capability))
    return text + (" with " + " and ".join(quals) if quals else "")


def _gpu_reason(need: Need, gpus: tuple[Gpu, ...], held: dict[int, str], free: int,
                own_pids: frozenset[int] = frozenset()) -> Reason:
    if not gpus:
        return Reason(GPUS, "has no GPUs", 0, "has no GPUs")
    # islice: only the GPUs named get their sentence built, not all eight of every refused node.
    notes = list(islice((why for g in gpus if (why := gpus_mod.why_unusable(g, held, need, own_pids)) is not None),
                        _GPUS_NAMED))
    detail = f" ({'; '.join(notes)})" if notes else ""
    return Reason(GPUS, f"has {free} of the {gpus_wanted(need)} needed{detail}", free, f"has {free}{detail}")


def resource_reason(need: Need, st: NodeState) -> Reason | None:
    """The first resource check that fails on the node as the pass has left it, or None."""
    inv = st.view.inventory
    if need.gpu_count:
        free = len(gpus_mod.usable(inv.gpus, st.held, need))
        if free < need.gpu_count:
            # The shards' own pids, so that a GPU an llmgw engine fills is not blamed on "someone else".
            # Built only where a GPU lists processes: a refusal asks every node of the cluster.
            own = (frozenset(s.pid for s in st.view.shards.values() if s.pid)
                   if any(g.processes for g in inv.gpus) else frozenset())
            return _gpu_reason(need, inv.gpus, st.held, free, own)
    if need.memory_bytes and st.free_memory < need.memory_bytes:
        estimated = " (estimated from its weights)" if need.memory_estimated and not need.gpu_count else ""
        have = format_bytes(max(st.free_memory, 0))
        return Reason(MEMORY, f"has {have} free memory, needs {format_bytes(need.memory_bytes)}{estimated}",
                      st.free_memory, f"has {have}")
    if need.threads and st.free_threads < need.threads:
        left = max(st.free_threads, 0)
        return Reason(THREADS, f"has {left} of {inv.cpu_count} CPU threads unclaimed, needs {need.threads}",
                      left, f"has {left} of {inv.cpu_count}")
    return None


def fits(need: Need, st: NodeState) -> list[Gpu] | None:
    """The usable GPUs when the node's free resources take one more replica (empty for a CPU one), else None.

    The hot path of a pass: no Reason is built here.
    """
    if need.memory_bytes and st.free_memory < need.memory_bytes:
        return None
    if need.threads and st.free_threads < need.threads:
        return None
    if not need.gpu_count:
        return []
    free = gpus_mod.usable(st.view.inventory.gpus, st.held, need)
    return free if len(free) >= need.gpu_count else None


def weights_dir(inv: Inventory) -> ModelDir | None:
    """The model directory fetched weights land in: the one holding weights llmgw fetched, else the roomiest.

    The inventory does not mark the agent's weights cache among its model
    directories; the roomiest stands in until a fetch shows which it is, so a
    node is refused only when no directory of it could take the weights.
    """
    if not inv.model_dirs:
        return None
    fetched = [w.path for w in inv.weights if w.fetched_by_llmgw]
    for d in inv.model_dirs:
        root = d.path.rstrip("/") + "/"
        if any(p.startswith(root) for p in fetched):
            return d
    return max(inv.model_dirs, key=lambda d: (d.free_bytes, d.path))


def fetching_bytes(st: NodeState) -> int:
    """Bytes the fetches under way on the node have still to write (each source once)."""
    left: dict[tuple[str, str], int] = {}
    for s in st.view.shards.values():
        if s.state is ShardState.FETCHING and s.fetch is not None and s.spec is not None:
            left[(s.spec.source, s.spec.source_file)] = max(s.fetch.total_bytes - s.fetch.done_bytes, 0)
    return sum(left.values())


def disk_reason(need: Need, st: NodeState, holds: bool) -> Reason | None:
    """Why the node's weights directory cannot take ``need``'s remote weights, or None.

    ``holds``: the node has the weights, or fetches them now (their room is already
    taken). A node that reports no model directory is not refused on a guess.
    """
    if not need.disk_bytes or holds:
        return None
    d = weights_dir(st.view.inventory)
    if d is None:
        return None
    free = d.free_bytes - st.disk_taken - fetching_bytes(st)
    if free >= need.disk_bytes:
        return None
    have = format_bytes(max(free, 0))
    return Reason(DISK, f"needs {format_bytes(need.disk_bytes)} for the weights, has {have} free on {d.path}",
                  free, f"has {have} free on {d.path}")
