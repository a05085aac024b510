"""Idle replicas (issue 31, part 3): when one is put to sleep or stopped, when it is woken, and which
replica gives way when several models over-commit one accelerator.

``spec.idle`` (``Idle``) says how long a replica may go without a request (``after_s``) and what then
happens to it (``action``): ``sleep`` keeps the engine's process and frees its accelerator memory through
the engine's own sleep mode (vLLM's ``POST /sleep?level=N``, ``POST /wake_up``; level 1 keeps the weights
in host memory, level 2 drops them too), ``stop`` ends the process, as scaling to zero does, and the
node's page cache keeps the weights' files warm for the next start. An engine that cannot sleep
(llama.cpp, SGLang, vLLM on CPU: its sleep mode is CUDA and ROCm only) is stopped even when ``sleep`` is
asked, and the step says so. Stopping is scaling to zero (``zero_window``): the autoscaler's rule, with
``after`` as its window, for a model that may go to zero (``spec.autoscale.min_replicas: 0``).

Pure: every function takes plain data and the time and returns what to do, so the control plane's
pass applies the steps and the rules are tested without a clock.

- ``idle_step``: one replica's next step: a sleeping replica that is wanted (a router holds a request
  for its model) wakes; an awake one that is neither busy nor wanted and has had no request for
  ``after_s`` (counted from its model's newest request, or from when it last woke, whichever is later:
  a replica just woken is not put back to sleep on a stale clock) sleeps or stops.
- ``fits``: over-commit: a replica may be placed on an accelerator while the memory of every replica
  there (awake or asleep) stays within ``capacity × overcommit`` and the awake ones' within capacity.
- ``wake_plan``: waking a sleeping replica where the awake ones leave too little memory: the least
  recently used awake replicas that are not busy are put to sleep first, as many as it takes; when the
  busy ones alone leave too little, nothing moves and the wake waits (its request stays held) until one
  goes quiet. Two wanted models on one accelerator so alternate, each served in turn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from llmgw.core import autoscale

#: ``spec.idle.action``.
ACTIONS = ("sleep", "stop")
#: vLLM's sleep levels: 1 offloads the weights to host memory and drops the KV cache; 2 drops both.
LEVELS = (1, 2)
#: A replica's sleep state, as ``get replicas`` shows it.
AWAKE, SLEEPING = "Awake", "Sleeping"
#: ``--sleep-overcommit``'s bound: past it a wake would have to evict more than it could ever hold.
MAX_OVERCOMMIT = 8.0


#: Engines with a sleep mode, and whether it needs an accelerator: vLLM's is CUDA and ROCm only; the sim
#: mimics vLLM's routes anywhere. llama.cpp and SGLang have none here: their idle replicas are stopped.
SLEEPERS: dict[str, bool] = {"vllm": True, "sim": False}


def can_sleep(engine: str, gpus: Sequence[int]) -> bool:
    """Whether a replica of ``engine`` on ``gpus`` (empty: CPU) can be put to sleep rather than stopped."""
    needs_gpu = SLEEPERS.get(engine)
    return needs_gpu is not None and (bool(gpus) or not needs_gpu)


@dataclasses.dataclass(frozen=True, slots=True)
class Idle:
    """``spec.idle``: after ``after_s`` seconds with no request, ``action`` (sleep at ``level``, or stop)."""

    after_s: float
    action: str = "sleep"
    level: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Replica:
    """What ``idle_step`` reads of one replica."""

    id: str
    state: str
    #: The engine has a sleep mode here (vLLM on CUDA/ROCm started with it enabled).
    can_sleep: bool
    #: The newest request any router saw for its model (unix time; 0.0: none seen).
    last_request_at: float
    #: When it last became Ready or woke (unix time).
    awake_since: float


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One thing to do to one replica: ``verb`` is "sleep", "stop" or "wake"."""

    replica: str
    verb: str
    reason: str
    level: int = 1


def idle_step(idle: Idle, replica: Replica, *, now: float, wanted: bool, busy: bool) -> Step | None:
    """The next step for one replica of a model with ``spec.idle``; None when it stays as it is.

    ``wanted``: a router holds a request for the model (or requests arrive); ``busy``: requests run at
    its engines now. A sleeping replica wakes only when wanted; an awake one sleeps only when neither.
    """
    if replica.state == SLEEPING:
        return Step(replica.id, "wake", "a request is waiting for a sleeping replica") if wanted else None
    if wanted or busy:
        return None
    quiet = now - max(replica.last_request_at, replica.awake_since)
    if quiet < idle.after_s:
        return None
    head = f"no request for {max(0, round(quiet))}s (spec.idle.after: {idle.after_s:g}s)"
    if idle.action == "sleep" and replica.can_sleep:
        return Step(replica.id, "sleep", f"{head}: put to sleep at level {idle.level}, its process kept",
                    level=idle.level)
    if idle.action == "sleep":
        return Step(replica.id, "stop", f"{head}: stopped, as its engine cannot sleep here; the node's page "
                                        "cache keeps the weights for the next start")
    return Step(replica.id, "stop", f"{head}: stopped (spec.idle.action: stop)")


def zero_window(auto: autoscale.Autoscale, spec: Idle | None, *, engine: str, on_gpus: bool) -> autoscale.Autoscale:
    """The autoscaler's bounds with ``spec.idle``'s stop folded in: stopping an idle replica is scaling to zero.

    Where the replica is to stop (``action: stop``, or an engine that cannot sleep here) and the model may go
    to zero (``min_replicas: 0``), it does so after ``after`` when that is sooner than ``scale_to_zero_after``;
    otherwise the bounds are as written (a sleeper is stopped at ``scale_to_zero_after`` if that comes).
    """
    if spec is None or auto.min_replicas > 0:
        return auto
    stops = spec.action == "stop" or not can_sleep(engine, (0,) if on_gpus else ())
    if not stops or spec.after_s >= auto.scale_to_zero_after_s:
        return auto
    return dataclasses.replace(auto, scale_to_zero_after_s=spec.after_s)


@dataclasses.dataclass(frozen=True, slots=True)
class Resident:
    """A replica on one accelerator, for over-commit: its memory, whether it is awake, and its use."""

    id: str
    model: str
    memory_mib: int
    awake: bool
    #: The newest request for its model (unix time): the least recently used gives way first.
    last_used: float
    #: Requests run at it now: never put to sleep under them.
    busy: bool = False


def fits(capacity_mib: int, residents: Sequence[Resident], memory_mib: int, *, overcommit: float) -> bool:
    """Whether a new (awake) replica of ``memory_mib`` may join ``residents`` on an accelerator.

    All of them together, asleep or not, within ``capacity × overcommit``; and since a new replica
    starts awake, a place for it among the awake ones as ``wake_plan`` would make it (sleeping the idle).
    """
    if memory_mib > capacity_mib:
        return False
    total = sum(r.memory_mib for r in residents) + memory_mib
    if total > capacity_mib * max(1.0, overcommit):
        return False
    busy_awake = sum(r.memory_mib for r in residents if r.awake and r.busy)
    return busy_awake + memory_mib <= capacity_mib


@dataclasses.dataclass(frozen=True, slots=True)
class WakePlan:
    """Put ``sleep`` to sleep (in that order), then wake ``wake``; ``wake`` "" when the wake must wait."""

    wake: str
    sleep: tuple[str, ...]
    reason: str


def wake_plan(capacity_mib: int, residents: Sequence[Resident], wanted: str) -> WakePlan:
    """How to wake ``wanted`` (a sleeping resident) on an accelerator of ``capacity_mib``.

    The least recently used awake residents that are not busy give way, fewest first by age, until the
    wanted one fits; when even all of them would not make room, nothing moves.
    """
    target = next((r for r in residents if r.id == wanted), None)
    if target is None:
        return WakePlan("", (), f"replica {wanted} is not on this accelerator")
    if target.awake:
        return WakePlan("", (), f"replica {wanted} is awake already")
    free = capacity_mib - sum(r.memory_mib for r in residents if r.awake)
    if target.memory_mib <= free:
        return WakePlan(wanted, (), f"{free} MiB free for its {target.memory_mib} MiB")
    quiet = sorted((r for r in residents if r.awake and not r.busy and r.id != wanted),
                   key=lambda r: (r.last_used, r.id))
    chosen: list[Resident] = []
    for r in quiet:
        if free >= target.memory_mib:
            break
        chosen.append(r)
        free += r.memory_mib
    if free < target.memory_mib:
        busy = sorted(r.model for r in residents if r.awake and r.busy)
        return WakePlan("", (), f"{target.memory_mib} MiB wanted and only {free} MiB can be freed: the awake "
                                f"replicas of {', '.join(busy) or 'no model'} are serving; it wakes when one "
                                "goes quiet")
    names = ", ".join(f"{r.id} ({r.model})" for r in chosen)
    return WakePlan(wanted, tuple(r.id for r in chosen),
                    f"put to sleep the least recently used {names} to free {target.memory_mib} MiB")
