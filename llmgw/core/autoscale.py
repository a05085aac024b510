"""Autoscaling: how many replicas a model's load asks for, decided as a pure function.

``decide(spec, signals, state, now=...)`` takes what the routers saw of one model
(merged over every live router by the control plane), the autoscaler's own
state and the time, and returns the next state and, when the count changes, the
sentence that says why. It reads no clock and touches nothing: the control
plane stores the state and hands ``state.replicas`` to the reconcile pass, so
every rule below is tested with plain data and a fake clock.

The rules, in the order they are tried:

- no router has reported (``signals is None``): hold. Acting on the absence of
  reports would take a busy model to its minimum every time the control plane
  restarts, before the routers' first reports arrive.
- wake: a model at zero with a request waiting goes to 1 at once, with no
  window and even while a rollout runs: a held request waits on it.
- while a rollout is in flight nothing else changes, and the windows restart
  afterwards: a rollout's surge and drain move the load per replica, and a
  decision taken on that would fight the rollout.
- up: the load asked for more replicas for ``scale_up_after_s`` and no scale-up
  happened within that window; the count jumps to what the load asks (not one
  step), never past ``max_replicas`` and never while a replica of the model
  waits for a node (placement said no: asking again would only queue more
  replicas that cannot be placed; ``limited`` carries the refusal instead).
- down: the load asked for fewer for the longer ``scale_down_after_s``; never
  below ``min_replicas`` nor below 1 (only the idle rule goes to zero).
- to zero: with ``min_replicas`` 0, one replica and no request for
  ``scale_to_zero_after_s``.

Signals are counts and rates from other processes: a NaN, an infinity or a
negative number reads as 0 here, so one bad report can neither raise an
exception inside the control plane's pass nor scale a model to its maximum.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

#: Upper bounds (ms) of the time-to-first-token histogram the routers keep; a last
#: +inf bucket is implied, so a counts list has len(TTFT_BUCKETS_MS) + 1 entries.
TTFT_BUCKETS_MS: tuple[float, ...] = (25, 50, 100, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000,
                                      30000, 60000)

#: A ratio beyond any cluster: keeps ceil() of a huge signal from overflowing.
_MAX_RATIO = 1e9


@dataclasses.dataclass(frozen=True, slots=True)
class Autoscale:
    """``spec.autoscale``: the bounds, the targets (0: not set) and the windows, in seconds."""

    min_replicas: int
    max_replicas: int
    #: Requests waiting in the routers' admission queues, per replica.
    queue_per_replica: float = 0
    #: Time to first token, p90 over the routers' recent window.
    ttft_p90_ms: float = 0
    #: Requests at the engines, per replica.
    inflight_per_replica: float = 0
    #: Output tokens per second, per replica.
    tokens_per_s_per_replica: float = 0
    #: How long the load must ask for more before the count goes up (and the least time between two scale-ups).
    scale_up_after_s: float = 15.0
    #: How long the load must ask for fewer before the count goes down.
    scale_down_after_s: float = 120.0
    #: Time without a request before 1 -> 0 (only with min_replicas 0).
    scale_to_zero_after_s: float = 300.0
    #: How long a router holds a request for a model at zero before it answers 503.
    cold_start_timeout_s: float = 60.0


@dataclasses.dataclass(frozen=True, slots=True)
class Signals:
    """One model's load, merged over every live router, at ``now``."""

    #: Requests arriving per second over the recent window.
    arrived_per_s: float
    #: Requests waiting in admission queues now (held cold-start requests included).
    waiting: float
    #: Requests at engines now.
    in_flight: float
    #: p90 of time to first token over the window; None when none was seen.
    ttft_p90_ms: float | None
    #: Output tokens per second, all replicas together.
    tokens_per_s: float
    #: Newest request arrival any router saw (unix time; 0.0: none seen).
    last_request_at: float
    #: A router holds a request for this model while it has no replica (wake now).
    wanted: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class State:
    """The autoscaler's memory of one model, kept (and persisted) by the control plane."""

    #: The count in force.
    replicas: int
    #: Since when the load has asked for more replicas; None: it does not.
    above_since: float | None = None
    #: Since when it has asked for fewer; None: it does not.
    below_since: float | None = None
    #: Since when no request came (used when the routers know of no request: last_request_at 0).
    idle_since: float | None = None
    last_scale_up_at: float = 0.0
    last_change_at: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """The next state (``state.replicas`` is the count to run) and why it changed."""

    state: State
    #: "" when the count is unchanged; else the event sentence ("3 → 5: queue 9.2 per replica > target 2 for 30s").
    reason: str
    #: Why the count holds below what the load asks (at max_replicas; no room to place), for a condition; "" if not.
    limited: str = ""


def initial(spec: Autoscale) -> State:
    """The first state of a newly autoscaled model: its minimum."""
    return State(replicas=max(0, spec.min_replicas))


def decide(spec: Autoscale, signals: Signals | None, state: State, *, now: float,
           rolling: bool = False, unplaceable: str = "") -> Decision:
    """The next state for one model; see the module docstring for the rules."""
    if signals is None:
        return Decision(state=state, reason="")
    sig = _clean(signals)
    current = max(0, state.replicas)
    lo = max(spec.min_replicas, 0)
    hi = max(spec.max_replicas, lo, 1)
    arriving = sig.wanted or sig.waiting > 0 or sig.arrived_per_s > 0
    busy = arriving or sig.in_flight > 0
    idle_since = None if busy else (state.idle_since if state.idle_since is not None else now)
    # An arrival wakes a model at zero only if it came after the count last changed: the routers'
    # window still counts the requests before the scale to zero, and waking on them flipped the
    # model between 0 and 1 every pass (seen with scale_to_zero_after shorter than the window).
    # A request that comes while it is at zero is held at the router, so it wakes it as ``wanted``.
    woken = sig.wanted or sig.waiting > 0 or (
        sig.arrived_per_s > 0 and (sig.last_request_at == 0 or sig.last_request_at > state.last_change_at))

    if current == 0 and woken:
        new = max(1, min(lo, hi))
        return Decision(state=State(replicas=new, last_scale_up_at=now, last_change_at=now),
                        reason=f"0 → {new}: a request is waiting for a model at zero")
    if rolling:
        return Decision(state=dataclasses.replace(state, above_since=None, below_since=None, idle_since=idle_since),
                        reason="")
    if not lo <= current <= hi:
        new = min(max(current, lo), hi)
        why = f"below min_replicas {lo}" if current < lo else f"above max_replicas {hi}"
        return _changed(state, current, new, f"{current} → {new}: {why}", now=now, up=new > current)

    if current == 0:
        # Only a request wakes a model at zero: a draining replica still finishing its last
        # requests (in flight, tokens) must not start a new one the moment it went.
        return Decision(state=dataclasses.replace(state, above_since=None, below_since=None, idle_since=idle_since),
                        reason="")
    floor = max(lo, 1)
    # With nothing arriving, waiting or running, a TTFT or token rate still in the routers' window
    # describes requests already answered: scaling up on it would start replicas for nobody.
    load = sig if busy else dataclasses.replace(sig, ttft_p90_ms=None, tokens_per_s=0.0)
    asked = _desired(spec, load, current)
    if asked is None:
        # No target has data: while requests run (none has had its first token yet, say) nothing
        # says the count is wrong, so it holds; with no request at all the floor is enough.
        asked = (current, "", "") if busy else (0, "", "no request arriving, waiting or running")
    wanted, why_up, why_down = asked
    limited = ""
    if wanted > hi:
        limited = f"at max_replicas {hi}: the load asks for {wanted} ({why_up})"
    desired = min(max(wanted, floor), hi)

    if desired > current:
        above_since = state.above_since if state.above_since is not None else now
        held = now - above_since
        since_up = now - state.last_scale_up_at if state.last_scale_up_at else math.inf
        if unplaceable:
            limited = unplaceable
        elif held >= spec.scale_up_after_s and since_up >= spec.scale_up_after_s:
            return dataclasses.replace(
                _changed(state, current, desired, f"{current} → {desired}: {why_up} for {_secs(held)}",
                         now=now, up=True, idle_since=idle_since),
                limited=limited)
        return Decision(state=dataclasses.replace(state, above_since=above_since, below_since=None,
                                                  idle_since=idle_since), reason="", limited=limited)

    if desired < current:
        below_since = state.below_since if state.below_since is not None else now
        held = now - below_since
        if held >= spec.scale_down_after_s:
            return _changed(state, current, desired, f"{current} → {desired}: {why_down} for {_secs(held)}",
                            now=now, up=False, idle_since=idle_since)
        return Decision(state=dataclasses.replace(state, above_since=None, below_since=below_since,
                                                  idle_since=idle_since), reason="", limited=limited)

    if current == 1 and lo == 0 and not (sig.wanted or sig.waiting > 0 or sig.in_flight > 0):
        # Idle from the newest arrival any router saw, not from the window's arrival rate: the rate
        # counts a request for the whole window (30 s), so a model went to zero that long after its
        # scale_to_zero_after (seen in bench/autoscale.py: "no request for 30s" with 20s set).
        idle_from = sig.last_request_at if sig.last_request_at > 0 else (None if busy else idle_since)
        idle = now - idle_from if idle_from is not None else 0.0
        if idle >= spec.scale_to_zero_after_s:
            return _changed(state, 1, 0, f"1 → 0: no request for {_secs(idle)}", now=now, up=False,
                            idle_since=idle_since)
    return Decision(state=dataclasses.replace(state, above_since=None, below_since=None, idle_since=idle_since),
                    reason="", limited=limited)


def _changed(state: State, current: int, new: int, reason: str, *, now: float, up: bool,
             idle_since: float | None = None) -> Decision:
    """A new count: both windows restart (the next change needs a streak of its own)."""
    return Decision(state=State(replicas=new, idle_since=idle_since,
                                last_scale_up_at=now if up else state.last_scale_up_at, last_change_at=now),
                    reason=reason)


def _desired(spec: Autoscale, sig: Signals, current: int) -> tuple[int, str, str] | None:
    """The count the load asks for (max over the set targets), and the binding target in words, up and down.

    None when no target says anything: the only one set is TTFT and no first
    token was seen, or none is set (the spec refuses that; an Autoscale built
    by hand may have it).
    """
    per = max(current, 1)
    asks: list[tuple[int, str, str]] = []
    # The in-flight target counts the requests waiting too: they are in flight as soon as there is room.
    # Without them a router that caps each replica (max_concurrency_per_replica) at or below the target
    # holds the in-flight count at the target however long the queue grows, and the model never scales.
    demand, demand_words = sig.in_flight + sig.waiting, "in flight and waiting" if sig.waiting else "in flight"
    for target, total, words, unit in (
            (spec.queue_per_replica, sig.waiting, "queue", " per replica"),
            (spec.inflight_per_replica, demand, demand_words, " per replica"),
            (spec.tokens_per_s_per_replica, sig.tokens_per_s, "output", " tokens/s per replica")):
        if _num(target) > 0:
            value = f"{words} {_fmt(total / per)}{unit}"
            asks.append((_ceil(total / target), f"{value} > target {target:g}", f"{value} < target {target:g}"))
    if _num(spec.ttft_p90_ms) > 0 and sig.ttft_p90_ms is not None:
        target = spec.ttft_p90_ms
        value = f"TTFT p90 {sig.ttft_p90_ms:.0f} ms"
        asks.append((_ceil(per * sig.ttft_p90_ms / target), f"{value} > target {target:g} ms",
                     f"{value} < target {target:g} ms"))
    if not asks:
        return None
    # The largest ask binds; on a tie the first target in the order above names it.
    return max(asks, key=lambda a: a[0])


def _ceil(ratio: float) -> int:
    return math.ceil(min(ratio, _MAX_RATIO) - 1e-9)


def _num(value: float) -> float:
    """A signal as a usable number: NaN, infinities and negatives read as 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) and v > 0 else 0.0


def _clean(sig: Signals) -> Signals:
    ttft = sig.ttft_p90_ms
    return Signals(arrived_per_s=_num(sig.arrived_per_s), waiting=_num(sig.waiting), in_flight=_num(sig.in_flight),
                   ttft_p90_ms=None if ttft is None else _num(ttft), tokens_per_s=_num(sig.tokens_per_s),
                   last_request_at=_num(sig.last_request_at), wanted=bool(sig.wanted))


def _fmt(value: float) -> str:
    """9.2 for a sentence; a number past a million in short form, so a wild report keeps the event readable."""
    return f"{value:.1f}" if value < 1e6 else f"{value:.3g}"


def _secs(seconds: float) -> str:
    return f"{max(0, round(seconds))}s"


def ttft_quantile(counts: Sequence[int], q: float) -> float | None:
    """The q-quantile (0..1) of a TTFT histogram in ms, interpolated inside its bucket; None when it is empty.

    ``counts`` follows TTFT_BUCKETS_MS with the +inf bucket last (missing
    entries count 0, extra ones join the +inf bucket). As Prometheus's
    histogram_quantile, a quantile in the +inf bucket reads as the last finite
    bound: the histogram cannot say more, and a finite number keeps the
    autoscaler's arithmetic finite.
    """
    n = len(TTFT_BUCKETS_MS)
    cells = [max(0, int(c)) if isinstance(c, int | float) and math.isfinite(c) else 0 for c in counts]
    cells = (cells + [0] * (n + 1))[:n + 1] if len(cells) <= n + 1 else cells[:n] + [sum(cells[n:])]
    total = sum(cells)
    if total == 0:
        return None
    rank = min(_num(q), 1.0) * total
    seen = 0
    lower = 0.0
    for i, count in enumerate(cells[:n]):
        upper = float(TTFT_BUCKETS_MS[i])
        if count and seen + count >= rank:
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
        lower = upper
    return float(TTFT_BUCKETS_MS[-1])
