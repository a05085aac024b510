"""The sentence a refused replica carries: what no node has, and what the nearest nodes have instead.

    no node can run a replica of big: no node has 2 free GPUs with >= 40.0 GiB;
    node05 has 1 (GPU 3 used by pid 1234 (python3, 75.0 GiB)); node07 lacks llamacpp 0.11 (has 0.10.2)

A GPU's processes are named when its agent listed them; otherwise it reads
"GPU 3 has 75.0 GiB used".

The headline comes from the requirement the nearest node failed, and the nodes
named are the ones that got furthest through the checks, so on a cluster of
10,000 nodes the message names the three worth looking at, not the first three
by name.

A model its engine would refuse whatever the node (tensor_parallel 3 over 32
attention heads) is not walked over the nodes at all: its sentence is the
engine check's, and its reason EngineRefused, not Unschedulable, because no
node will do until the model file (or its weights) changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from llmgw.control.placement import filters as f
from llmgw.control.placement.needs import Need
from llmgw.core.units import format_bytes

#: How many refused nodes a message names before it summarises the rest.
NAMED_IN_MESSAGE = 3
#: What a cluster with no node at all is told. Agents join (issue 13): a bare `llmgw agent --server` is
#: refused by a secure control plane, so the old advice sent users into a certificate error.
NO_NODES = ("no node is registered; add one: run `llmgw token create` (as an admin) and, on the node, the "
            "`llmgw agent join --server ... --token ... --ca-hash ...` command it prints (against `llmgw server "
            "--insecure`, on loopback only: `llmgw agent --insecure --server HOST:8081`)")


#: Placed's reason for a replica no node can take now.
UNSCHEDULABLE = "Unschedulable"
#: Placed's reason for a replica its engine would refuse on any node (the engine check,
#: ``llmgw.core.enginecheck``): no node will ever do until the model file changes.
ENGINE_REFUSED = "EngineRefused"
#: How such a refusal's message opens. The replica's row keeps only its message, so the
#: reason is read back from these words (``reason_of``) on every later pass and restart.
_ENGINE_REFUSED_OPENING = "refused before launch"


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    #: One sentence a person can act on.
    message: str
    #: node id -> why that node cannot take the replica.
    reasons: Mapping[str, str]
    #: The Placed condition's CamelCase reason (``reason_of`` reads it back from the message).
    reason: str = UNSCHEDULABLE


#: Placed's reason for a remote model waiting for its metadata (size, config.json) to be read.
READING_METADATA = "ReadingMetadata"
_METADATA_OPENING = "waiting for the metadata of"


def metadata_pending(source: str) -> Refused:
    """The wait of a model whose remote source's metadata is being read (``llmgw.control.remotemeta``)."""
    return Refused(f"{_METADATA_OPENING} {source} (its size, config.json or GGUF header) to estimate its "
                   "memory and disk; it is placed as soon as that read answers or fails", {}, READING_METADATA)


def engine_refusal(model: str, engine: str, problems: list[str]) -> Refused:
    """The Refused of a model its engine would not run on any node, each problem saying what to change."""
    return Refused(f"{_ENGINE_REFUSED_OPENING}: {engine} would fail to run {model} on any node: "
                   + "; ".join(problems), {}, ENGINE_REFUSED)


def reason_of(message: str) -> str:
    """The Placed reason of a replica refused with ``message``: ReadingMetadata, EngineRefused or Unschedulable."""
    if message.startswith(_METADATA_OPENING):
        return READING_METADATA
    return ENGINE_REFUSED if message.startswith(_ENGINE_REFUSED_OPENING) else UNSCHEDULABLE


def _headline(need: Need, stage: int) -> str:
    if stage == f.DISK:
        return (f"no node has {format_bytes(need.disk_bytes)} free disk for the weights: free space in a "
                "node's weights directory, or let `llmgw get weights` show what can go")
    if stage == f.FABRIC:
        return f"no declared fabric has {need.nnodes} nodes that fit, each with usable adapters"
    if stage == f.GPUS:
        why = (f" ({need.capability_for} needs compute capability {'{}.{}'.format(*need.compute_capability)} or "
               "later: use float16, or nodes with newer GPUs)" if need.capability_for and need.compute_capability
               else "")
        return f"no node has {f.gpus_wanted(need)}{why}"
    if stage == f.MEMORY:
        estimated = " (estimated from its weights)" if need.memory_estimated else ""
        return f"no node has {format_bytes(need.memory_bytes)} free memory{estimated}"
    if stage == f.THREADS:
        return f"no node has {need.threads} CPU threads unclaimed"
    if stage in (f.POOL, f.SELECTOR):
        wanted = ([f"pool={need.pool}"] if need.pool else []) + [f"{k}={v}" for k, v in need.selector]
        return f"no node matches {', '.join(wanted)}"
    if stage == f.CPU:
        return (f"no node's CPU has {' or '.join(need.cpu_flags_any)}, which {need.engine} needs to run without "
                f"a GPU: give the model GPUs, or serve it with llamacpp")
    if stage == f.INSTALLING:
        what = " ".join(x for x in (need.engine, need.engine_version) if x)
        return f"no node has {what} installed yet"
    if stage == f.VERSION:
        return f"no node has {need.engine} {need.engine_version}"
    if stage == f.ENGINE:
        return f"no node has engine {need.engine}"
    return "no node is connected and uncordoned"


def refusal(need: Need, reasons: Mapping[str, f.Reason], *, what: str = "a replica") -> Refused:
    """The Refused for ``need`` given each node's reason."""
    if not reasons:
        return Refused(NO_NODES, {})
    nearest = sorted(reasons.items(), key=lambda kv: (-kv[1].stage, -kv[1].nearness, kv[0]))
    top = nearest[0][1].stage
    parts = [_headline(need, top)]
    for node_id, r in nearest[:NAMED_IN_MESSAGE]:
        if r.stage == f.INSTALLING:  # an install's sentence names its node itself
            parts.append(r.text)
        else:
            parts.append(f"{node_id} {r.short if r.stage == top and r.short else r.text}")
    if len(nearest) > NAMED_IN_MESSAGE:
        parts.append(f"and {len(nearest) - NAMED_IN_MESSAGE} more nodes cannot either")
    return Refused(f"no node can run {what} of {need.model}: " + "; ".join(parts),
                   {node_id: r.text for node_id, r in reasons.items()})
