"""Which replica takes a LoRA adapter's request, and which adapter an engine evicts at its limit (pure).

How adapters beyond an engine's limit are served (the decision, and why): every replica of the base
*registers* every adapter of its model (the agent fetches each one onto the node and loads it through
vLLM's ``/v1/load_lora_adapter``, ``agent/supervisor/loras.py``), so any replica can answer any adapter
and no request fails because its adapter "is not loaded". What an engine *holds* is bounded by the
engine itself: vLLM 0.32 keeps at most ``--max-cpu-loras`` adapters' weights in its worker's cache
(``vllm/lora/worker_manager.py``, ``LRUCacheWorkerLoRAManager.add_adapter``), loads a registered adapter
that is not there from its path when a request needs it (on demand, inside that request: the request
is held by the engine while it loads, never refused), and evicts the least recently used one when the
cache is full (``remove_oldest_adapter``). ``touch`` is that rule, shared by the sim engine (which
mimics it) and the router (which models each replica's cache from the requests it sends).

So the engine triggers the on-demand load, not the router nor the control plane: it is the one place
that knows its cache, it loads within the request (no round trip router -> control plane -> agent ->
engine on the request path, no table change to wait for), and it works the same behind a standalone
router or a standby control plane. vLLM's resolver plugins (``VLLM_PLUGINS=lora_filesystem_resolver``)
were not used: its filesystem resolver loads an adapter only when its ``adapter_config.json`` names the
exact path the engine was started with as ``base_model_name_or_path``, which an adapter fetched from a
hub never does (``vllm/plugins/lora_resolvers/filesystem_resolver.py``), and registering is all it adds.

The router's part is affinity (``candidates``): an adapter's request goes to a replica whose cache
holds it (the router's model of it), the least loaded first; when none holds it, or every holder is
*busy* (``BUSY_SPREAD`` more requests in flight than the least loaded replica of the base), it goes to
the least loaded replica, whose engine then loads it and evicts its least recently used adapter.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T", bound=Hashable)

#: A holder is busy when it has this many more requests in flight than the least loaded replica: the
#: request then goes to that one and its engine loads the adapter (a load costs about one short request).
BUSY_SPREAD = 4


def touch(held: Sequence[T], name: T, capacity: int) -> tuple[tuple[T, ...], tuple[T, ...]]:
    """``held`` (least recently used first) after ``name`` is used, and the adapters evicted for it.

    vLLM's rule (``LRUCacheWorkerLoRAManager.add_adapter``): a held adapter moves to the most recent end;
    one not held is loaded, and when the cache is at ``capacity`` the least recently used one goes first.
    ``capacity`` below 1 holds nothing back: nothing is evicted.
    """
    if name in held:
        if held[-1] == name:
            return tuple(held), ()
        return (*(n for n in held if n != name), name), ()
    order = (*held, name)
    if capacity < 1 or len(order) <= capacity:
        return order, ()
    cut = len(order) - capacity
    return order[cut:], order[:cut]


def candidates(name: str, replicas: Sequence[str], held: Mapping[str, Sequence[str]],
               in_flight: Mapping[str, int], *, exclude: Collection[str] = (),
               spread: int = BUSY_SPREAD) -> tuple[tuple[str, ...], bool]:
    """The replicas ``name``'s request may go to, and whether their engine must load it first.

    ``held``: each replica's cache as the router models it; ``in_flight``: its requests now; ``exclude``:
    replicas not to use (tried, ejected, at their limit). The holders that are not busy, when any (the
    model's policy picks among them); else the least loaded replicas, those with the fewest adapters held
    among them (a free slot evicts nothing), and True: the one picked loads the adapter. Empty when
    every replica is excluded.
    """
    left = [r for r in replicas if r not in exclude]
    if not left:
        return (), False
    least = min(in_flight.get(r, 0) for r in left)
    holders = tuple(r for r in left if name in held.get(r, ()) and in_flight.get(r, 0) - least < spread)
    if holders:
        return holders, False
    idle = [r for r in left if in_flight.get(r, 0) == least]
    fewest = min(len(held.get(r, ())) for r in idle)
    return tuple(r for r in idle if len(held.get(r, ())) == fewest), True
