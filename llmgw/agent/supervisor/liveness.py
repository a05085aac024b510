"""Liveness: what one health probe of a Ready engine means for its shard. Pure: no process, no socket.

A process that exists is not an engine that serves: a deadlock, a wedged GPU or
``kill -STOP`` leaves the pid in place and the port accepting connections, and
until this existed such a shard stayed READY for ever (the routers ejected it
on their own, the control plane never replaced it). So once a shard is READY
its engine is asked its cheap health path every ``period_s``, each ask bounded
by ``timeout_s``, one at a time (``watching`` runs the asks; ``judge`` here
decides what each answer changes):

* each failure adds one to ``probe_failures`` and is reported at once while the
  shard is READY ("health probe failed 1/3: timed out after 2 s"): routers
  stop sending it new requests from the first one;
* the ``failure_threshold``-th in a row makes it UNHEALTHY, with the reason and
  the engine's last output; the control plane replaces it past its grace;
* later failures are counted but not sent: the state has said it, and a status
  every period until the replacement would be an event every two seconds;
* the first probe that passes puts it back to READY with ``probe_failures`` 0,
  saying it recovered (a SIGCONT, a GPU that came back).

The defaults were measured, not guessed (see ``TIMEOUT_S``).
"""

from __future__ import annotations

import dataclasses

from llmgw.core.shards import ShardState, ShardStatus

S = ShardState
#: How often a Ready engine is asked its health. A hang is found within about
#: period * threshold + timeout (8 s with the defaults).
PERIOD_S = 2.0
#: How long one health ask may take. Measured on this project's 2-vCPU build box
#: with the real llama.cpp server (xllamacpp 2026.10, SmolLM2-135M, the llamacpp
#: adapter's argv; ``bench/health_under_prefill.py``): /health answered in 1.0 ms
#: median, 23 ms at most, during a 915-token prefill at the adapter's defaults;
#: and in 4 ms median, 27 ms p99, 230 ms at most with the CPUs oversubscribed
#: (load 6: 2 threads, batch 2048, four 2,442-token prompts prefilling for
#: 97-215 s each). llama.cpp answers /health on its HTTP thread, not between
#: decode calls, so a long prefill does not delay it; 2 s is 9 times the worst
#: seen, room for a node whose CPUs are busier still.
TIMEOUT_S = 2.0
#: Failed asks in a row that make a shard UNHEALTHY: one lost packet or one GC
#: pause is not a hang, three in a row (six seconds of silence) are.
FAILURE_THRESHOLD = 3
#: The states in which a shard's engine is probed: it is in (or just out of) the routers' table.
PROBED = frozenset({S.READY, S.UNHEALTHY})


@dataclasses.dataclass(frozen=True, slots=True)
class Liveness:
    """How a Ready engine is probed; the agent's settings ``probe_period_s``, ``probe_timeout_s``,
    ``probe_failure_threshold``."""

    period_s: float = PERIOD_S
    timeout_s: float = TIMEOUT_S
    failure_threshold: int = FAILURE_THRESHOLD

    def __post_init__(self) -> None:
        if not (self.period_s > 0 and self.timeout_s > 0 and self.failure_threshold >= 1):
            raise ValueError(f"liveness needs a period and a timeout above 0 and a threshold of at least 1, "
                             f"not {self}")


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What one probe changes: the shard's next state, its count, and whether to tell the control plane."""

    state: ShardState
    probe_failures: int
    message: str
    #: False for a failure counted while already UNHEALTHY: recorded, not sent.
    report: bool = True
    #: True when the status should carry the end of the engine's output (the move to UNHEALTHY).
    with_output: bool = False


def judge(status: ShardStatus, problem: str | None, *, liveness: Liveness, pid: int = 0,
          last_line: str = "") -> Verdict | None:
    """The verdict on one probe of ``status``'s engine: ``problem`` None means it answered; None: nothing changes.

    ``pid`` and ``last_line`` (the engine's last output line) only go into the words.
    """
    if status.state not in PROBED:
        return None  # a stop or a drain moved it while the probe was out: theirs to report
    before = status.probe_failures
    if problem is None:
        if before == 0 and status.state is S.READY:
            return None
        if status.state is S.UNHEALTHY:
            said = f"recovered: the engine answers its health probe again after {before} failed in a row"
        else:
            said = f"health probe passed again after {before} failed"
        return Verdict(S.READY, 0, said)
    n = before + 1
    k = liveness.failure_threshold
    if status.state is S.UNHEALTHY:
        return Verdict(S.UNHEALTHY, n, status.message, report=False)
    if n < k:
        return Verdict(S.READY, n, f"health probe failed {n}/{k}: {problem}")
    where = f" (pid {pid})" if pid else ""
    last = f"; its last output: {last_line}" if last_line else "; it wrote no output"
    return Verdict(S.UNHEALTHY, n, f"unhealthy: health probe failed {n}/{k} in a row ({problem}); its process"
                   f"{where} still runs but the engine does not answer{last}", with_output=True)
