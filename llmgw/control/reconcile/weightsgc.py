"""Which fetched weights to remove from nodes short of disk (pure): a list of RemoveWeights, with events.

Only weights llmgw fetched are ever candidates (``WeightFile.fetched_by_llmgw``
with a cache name; the agent refuses anything else whatever is asked), and of
those only weights nothing wants: no model's source maps to them (a model with
no replica running still asks for its weights: scaling it up must not pay a
download again), and no shard on the node uses them, a replica whose model was
deleted but whose engine still runs included.

A node is collected only while the free share of its weights directory is
below ``free_below_pct``; then its unwanted weights go least recently used
first (``last_used_unix``; never used counts as oldest) until the share would
be back above it. Removals already asked for and not yet gone from the
node's report count as done, so a pass neither asks twice nor removes a
second set of weights for the room the first is about to free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llmgw.control import events as ev
from llmgw.control.placement import filters, needs
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView
from llmgw.core import sources
from llmgw.core.inventory import WeightFile
from llmgw.core.shards import ShardState
from llmgw.core.specs import ModelSpec
from llmgw.core.units import format_bytes

#: The reason of the event each removal records.
REMOVED_REASON = "WeightsRemoved"


def wanted(models: Mapping[str, ModelSpec]) -> dict[str, list[str]]:
    """Fetched source text and cache name -> the models whose source maps to them."""
    out: dict[str, list[str]] = {}
    for name, spec in sorted(models.items()):
        src = needs.fetched_source(spec)
        if src is not None:
            for key in (src.text, src.cache_name()):
                out.setdefault(key, []).append(name)
    return out


def in_use(node: NodeView) -> set[str]:
    """Sources (as fetched) of the shards on ``node`` that may still run or start."""
    used = set()
    for s in node.shards.values():
        if s.state not in ShardState.terminal() and s.spec is not None and s.spec.source:
            used.add(s.spec.source)
            if s.spec.source_file:
                used.add(_folded(s.spec.source, s.spec.source_file))
    return used


def _folded(source: str, source_file: str) -> str:
    try:
        src = sources.with_file(sources.parse(source), source_file)
    except ValueError:
        return source
    return src.text


def collect(models: Mapping[str, ModelSpec], nodes: Iterable[NodeView], *, free_below_pct: float, now: float,
            pending_sources: Iterable[str] = (),
            removing: frozenset[tuple[str, str]] = frozenset()) -> list[d.Decision]:
    """RemoveWeights (and its event) for each fetched weight to go, node by node; [] when none is short.

    ``pending_sources``: the fetched sources of replicas not on a node yet (their model's, in
    practice; passed so that a replica of a model being replaced keeps its weights).
    ``removing``: (node id, cache name) asked already and still reported.
    """
    if free_below_pct <= 0:
        return []
    asked_for = wanted(models)
    pending = set(pending_sources)
    out: list[d.Decision] = []
    for node in sorted(nodes, key=lambda n: n.id):
        if not (node.connected and node.reported):
            continue  # never act on what a node has not told this control plane yet
        disk = filters.weights_dir(node.inventory)
        if disk is None or disk.total_bytes <= 0:
            continue
        going = [w for w in node.inventory.weights if (node.id, w.cache_name) in removing]
        free = disk.free_bytes + sum(w.size_bytes for w in going)
        floor = disk.total_bytes * free_below_pct / 100
        if free >= floor:
            continue
        used = in_use(node) | pending
        candidates = [w for w in node.inventory.weights
                      if _removable(w) and (node.id, w.cache_name) not in removing
                      and w.source not in asked_for and w.cache_name not in asked_for and w.source not in used]
        for w in sorted(candidates, key=lambda w: (w.last_used_unix, w.cache_name)):
            if free >= floor:
                break
            free += w.size_bytes
            share = 100 * disk.free_bytes / disk.total_bytes
            when = f"last used {_ago(now - w.last_used_unix)} ago" if w.last_used_unix else "never used"
            reason = (f"{disk.path} on node {node.id} has {share:.1f}% free, below {free_below_pct:g}%: "
                      f"removing {w.cache_name} ({format_bytes(w.size_bytes)}, from {w.source or 'unknown'}), "
                      f"which no model asks for and no replica uses, {when}")
            out.append(d.RemoveWeights(node.id, w.cache_name, reason))
            out.append(d.RecordEvent(ev.Event(now, ev.NORMAL, REMOVED_REASON, f"node/{node.id}", reason,
                                              node=node.id)))
    return out


def _removable(w: WeightFile) -> bool:
    return w.fetched_by_llmgw and bool(w.cache_name)


def _ago(seconds: float) -> str:
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"
