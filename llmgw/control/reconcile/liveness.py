"""Liveness: when a replica whose engine stops answering leaves routing, and when it is replaced (pure).

A Ready engine can stop answering while its process lives (a deadlock, a wedged
GPU, ``kill -STOP``); waiting for its pid to exit waits for ever. Two witnesses
can say so, and they are not worth the same:

* **its agent's health probe** (the engine's cheap health endpoint, on the node,
  every ``probe_period_s``). One failed probe (``probe_failures`` >= 1, the shard
  still Ready) takes the replica out of routing at once (phase Unhealthy): sending a
  request there costs its client the whole wait. The agent calls the shard
  Unhealthy once ``probe_failure_threshold`` probes failed in a row; from then the
  grace (``unhealthy_grace_s``) runs, and past it the replica is replaced. A probe
  that passes again ends it all: Ready, routed, nothing replaced.
* **a router's ejection** (real requests to it failed, ``llmgw.control.routerreports``).
  It never acts alone: one router may be cut off from an engine that serves every
  other router well (a partition, a full conntrack table on the router's host),
  and replacing it would reload the weights for nothing. With probes passing it
  changes nothing but an event, so a person sees the two disagree. With the agent
  also calling the shard Unhealthy it shortens the grace to ``corroborated_grace_s``:
  two witnesses on two paths agree, and the stall is failing clients now.
"""

from __future__ import annotations

from llmgw.core.shards import ShardState, ShardStatus

#: How long a shard its agent calls Unhealthy stays so before it is replaced (it is out of routing from
#: its first failed probe all the same). The agent already waited out its probe threshold; this grace is
#: for the stall that passes (an engine swapping under a memory spike, a long GC pause), which costs
#: nothing to wait out, when a replacement costs a weight load (minutes for a big model) and a wedged one
#: costs only its share of capacity. The one default: ``decide.Config`` and ``llmgw server
#: --unhealthy-grace`` take it from here.
UNHEALTHY_GRACE_S = 30.0


def probe_failing(st: ShardStatus) -> bool:
    """Its agent says the engine's health probe fails now (a first failure, or past the threshold)."""
    return st.state is ShardState.UNHEALTHY or (st.state is ShardState.READY and st.probe_failures > 0)


def grace_s(unhealthy_grace_s: float, corroborated_grace_s: float, *, ejected: bool) -> float:
    """How long an Unhealthy shard may stay so before it is replaced: shorter when a router also ejected it."""
    return min(unhealthy_grace_s, corroborated_grace_s) if ejected else unhealthy_grace_s


def reason(st: ShardStatus) -> str:
    """What its agent said is wrong, in a phrase."""
    # The agent's Unhealthy message may start by saying so; the sentences around it already do.
    said = st.message.removeprefix("unhealthy: ")
    return said or f"its health probe failed {st.probe_failures} times in a row"
