"""Which of a node's GPUs a replica may have, and which of them it gets.

Free means two things at once: no llmgw replica holds the GPU (the ledger),
and the node reports enough of its memory free, because a training job or a
forgotten notebook holds memory that llmgw never placed. When the model states
no GPU memory, a GPU counts as free only while it is nearly idle (90% of its
memory free): otherwise a GPU another process fills would be handed out.
When memory blocks a GPU, the reason names the processes the node reported on
it ("GPU 3 used by pid 1234 (python3, 75.0 GiB)"), leaving out pids of llmgw's
own shards, so the person reading it knows whose job to ask about.

For more than one GPU, a set that NVLink connects all pairs of is preferred,
then GPUs under one PCIe switch, then any: tensor parallel all-reduces every
layer, and over PCIe through the CPU it is several times slower.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from llmgw.control.placement.needs import Need, parse_capability
from llmgw.core.inventory import Gpu, GpuProcess
from llmgw.core.units import format_bytes

#: Share of a GPU's memory that must be free when the model states none.
IDLE_SHARE = 0.9
#: How many of a GPU's processes a reason names, largest first.
_PIDS_NAMED = 2
_CAPABILITY: dict[str, tuple[int, int] | None] = {}


def _capability(text: str) -> tuple[int, int] | None:
    try:
        return _CAPABILITY[text]
    except KeyError:
        found = _CAPABILITY[text] = parse_capability(text)
        return found


def _process(p: GpuProcess) -> str:
    facts = [p.name] if p.name else []
    if p.used_memory_bytes:
        facts.append(format_bytes(p.used_memory_bytes))
    return f"pid {p.pid}" + (f" ({', '.join(facts)})" if facts else "")


def _used(g: Gpu, own_pids: Collection[int]) -> str:
    """"GPU 3 used by pid 1234 (python3, 75.0 GiB)"; "GPU 3 has 75.0 GiB used" where no other process is listed.

    An agent in its own pid namespace, an older agent or the nvidia-smi of some
    containers lists no processes: the memory figure is all there is then.
    """
    foreign = sorted((p for p in g.processes if p.pid not in own_pids),
                     key=lambda p: (-p.used_memory_bytes, p.pid))
    if not foreign:
        return f"GPU {g.index} has {format_bytes(g.memory_used_bytes)} used"
    named = ", ".join(_process(p) for p in foreign[:_PIDS_NAMED])
    more = f" and {len(foreign) - _PIDS_NAMED} more" if len(foreign) > _PIDS_NAMED else ""
    return f"GPU {g.index} used by {named}{more}"


def why_unusable(g: Gpu, held: Mapping[int, str], need: Need, own_pids: Collection[int] = ()) -> str | None:
    """Why ``g`` cannot go to a replica of ``need``, or None when it can.

    ``own_pids`` are the node's llmgw shard processes: not "someone else" when
    the GPU's processes are named.
    """
    holder = held.get(g.index)
    if holder is not None:
        return f"GPU {g.index} is given to replica {holder}" if holder else f"GPU {g.index} is given to a replica"
    free = g.memory_total_bytes - g.memory_used_bytes
    want = need.gpu_memory_bytes
    if (want and free < want) or (not want and g.memory_total_bytes and free < g.memory_total_bytes * IDLE_SHARE):
        return _used(g, own_pids)
    if need.compute_capability is not None:
        have = _capability(g.compute_capability)
        if have is None:
            return f"GPU {g.index} does not report its compute capability"
        if have < need.compute_capability:
            return f"GPU {g.index} has compute capability {g.compute_capability}"
    return None


def _ok(g: Gpu, held: Mapping[int, str], need: Need) -> bool:
    """``why_unusable(...) is None`` without building the sentence: this runs for every GPU a pass looks at."""
    if g.index in held:
        return False
    free = g.memory_total_bytes - g.memory_used_bytes
    want = need.gpu_memory_bytes
    if (want and free < want) or (not want and g.memory_total_bytes and free < g.memory_total_bytes * IDLE_SHARE):
        return False
    if need.compute_capability is not None:
        have = _capability(g.compute_capability)
        return have is not None and have >= need.compute_capability
    return True


def usable(gpus: Sequence[Gpu], held: Mapping[int, str], need: Need) -> list[Gpu]:
    return [g for g in gpus if _ok(g, held, need)]


def _switch(g: Gpu) -> str:
    """GPUs whose bus numbers share the upper hex digit sit under one PCIe switch on common boards."""
    parts = g.pci_bus_id.split(":")
    return f"{parts[0]}:{parts[1][:1]}".lower() if len(parts) >= 2 and parts[1] else ""


def choose(free: Sequence[Gpu], count: int) -> tuple[int, ...]:
    """``count`` GPU indices from ``free``: NVLink-connected first, then one PCIe switch, then the lowest."""
    ordered = sorted(free, key=lambda g: g.index)
    if count <= 1 or len(ordered) <= count:
        return tuple(g.index for g in ordered[:count])
    for start in ordered:
        clique = [start]
        for g in ordered:
            # A link counts if either end reports it (one side's list can be short after a driver hiccup).
            if g is not start and all(g.index in c.nvlink_peers or c.index in g.nvlink_peers for c in clique):
                clique.append(g)
                if len(clique) == count:
                    return tuple(sorted(c.index for c in clique))
    by_switch: dict[str, list[int]] = {}
    for g in ordered:
        key = _switch(g)
        if key:
            by_switch.setdefault(key, []).append(g.index)
    for members in by_switch.values():  # in order of each switch's lowest index
        if len(members) >= count:
            return tuple(members[:count])
    return tuple(g.index for g in ordered[:count])
