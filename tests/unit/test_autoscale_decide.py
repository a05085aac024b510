"""The autoscaler's decision, stepped with plain data and a fake clock: one rule per test."""

from __future__ import annotations

import dataclasses
import math

import pytest

from llmgw.core import autoscale as a

SPEC = a.Autoscale(min_replicas=1, max_replicas=4, queue_per_replica=2, scale_up_after_s=15,
                   scale_down_after_s=120, scale_to_zero_after_s=300)
T0 = 1000.0


def load(*, waiting: float = 0, in_flight: float = 0, arrived: float = 0, ttft: float | None = None,
         tokens: float = 0, last: float = 0.0, wanted: bool = False) -> a.Signals:
    return a.Signals(arrived_per_s=arrived, waiting=waiting, in_flight=in_flight, ttft_p90_ms=ttft,
                     tokens_per_s=tokens, last_request_at=last, wanted=wanted)


def step(spec: a.Autoscale, sig: a.Signals | None, state: a.State, times: list[float], **kw: object) -> a.Decision:
    """Feeds the same signals at each time in turn and returns the last decision."""
    out = a.Decision(state=state, reason="")
    for now in times:
        out = a.decide(spec, sig, out.state, now=now, **kw)  # type: ignore[arg-type]
    return out


def test_initial_state_is_the_minimum() -> None:
    """A newly autoscaled model starts at min_replicas, with no window running."""
    assert a.initial(SPEC) == a.State(replicas=1)
    assert a.initial(dataclasses.replace(SPEC, min_replicas=0)).replicas == 0


def test_up_only_after_the_window() -> None:
    """Load above target starts the window; the count holds until scale_up_after has passed."""
    busy = load(waiting=6, arrived=3)
    first = a.decide(SPEC, busy, a.State(replicas=1), now=T0)
    assert first.state.replicas == 1 and first.state.above_since == T0 and first.reason == ""
    held = a.decide(SPEC, busy, first.state, now=T0 + 14.9)
    assert held.state.replicas == 1 and held.state.above_since == T0
    up = a.decide(SPEC, busy, held.state, now=T0 + 15)
    assert up.state.replicas == 3
    assert up.reason == "1 → 3: queue 6.0 per replica > target 2 for 15s"
    assert up.state.last_scale_up_at == T0 + 15 and up.state.above_since is None


def test_up_jumps_straight_to_the_desired_count() -> None:
    """A scale-up goes to what the load asks for in one change, not one replica at a time."""
    out = step(SPEC, load(waiting=7, arrived=1), a.State(replicas=1), [T0, T0 + 15])
    assert out.state.replicas == 4 and out.reason.startswith("1 → 4: ")


def test_no_more_than_one_scale_up_per_window() -> None:
    """Right after a scale-up, more load does not scale up again until a window has passed since it."""
    up = step(SPEC, load(waiting=4, arrived=1), a.State(replicas=1), [T0, T0 + 15])
    assert up.state.replicas == 2
    more = load(waiting=8, arrived=1)
    soon = step(SPEC, more, up.state, [T0 + 16, T0 + 29])
    assert soon.state.replicas == 2 and soon.reason == ""
    later = a.decide(SPEC, more, soon.state, now=T0 + 31)
    assert later.state.replicas == 4 and later.reason == "2 → 4: queue 4.0 per replica > target 2 for 15s"
    # A stored state whose streak is older than its last scale-up (written by an earlier pass) waits too.
    restored = a.State(replicas=2, above_since=T0 - 100, last_scale_up_at=T0 - 5)
    assert a.decide(SPEC, more, restored, now=T0).state.replicas == 2
    assert a.decide(SPEC, more, restored, now=T0 + 10).state.replicas == 4


def test_never_above_max_and_limited_says_so() -> None:
    """Load that asks for more than max_replicas gets max, and `limited` names the cap and the load."""
    out = step(SPEC, load(waiting=20, arrived=1), a.State(replicas=2), [T0, T0 + 15])
    assert out.state.replicas == 4
    at_max = a.decide(SPEC, load(waiting=20, arrived=1), out.state, now=T0 + 60)
    assert at_max.state.replicas == 4 and at_max.reason == ""
    assert at_max.limited == "at max_replicas 4: the load asks for 10 (queue 5.0 per replica > target 2)"


def test_within_bounds_is_not_limited() -> None:
    """Load the replicas can take leaves `limited` empty."""
    out = a.decide(SPEC, load(waiting=2, arrived=1), a.State(replicas=1), now=T0)
    assert out.limited == ""


def test_unplaceable_holds_the_count_with_its_message() -> None:
    """While a replica waits for a node, no scale-up happens (however long), and limited is the refusal."""
    why = "no node has 2 free GPUs; add a node"
    out = step(SPEC, load(waiting=8, arrived=1), a.State(replicas=2), [T0, T0 + 15, T0 + 100, T0 + 500],
               unplaceable=why)
    assert out.state.replicas == 2 and out.reason == "" and out.limited == why
    # The window kept running: once a node frees up, the scale-up comes at once, not a window later.
    freed = a.decide(SPEC, load(waiting=8, arrived=1), out.state, now=T0 + 501)
    assert freed.state.replicas == 4 and freed.reason.endswith("for 501s")


def test_down_only_after_the_longer_window() -> None:
    """Load below target for scale_down_after brings the count down to what it asks, not sooner."""
    quiet = load(waiting=1, in_flight=2, arrived=1)
    held = step(SPEC, quiet, a.State(replicas=4), [T0, T0 + 60, T0 + 119])
    assert held.state.replicas == 4 and held.state.below_since == T0
    down = a.decide(SPEC, quiet, held.state, now=T0 + 120)
    assert down.state.replicas == 1
    assert down.reason == "4 → 1: queue 0.2 per replica < target 2 for 120s"
    assert down.state.last_change_at == T0 + 120 and down.state.below_since is None


def test_down_never_below_min() -> None:
    """With no load at all the count goes down to min_replicas and no further."""
    spec = dataclasses.replace(SPEC, min_replicas=2)
    out = step(spec, load(), a.State(replicas=4), [T0, T0 + 120, T0 + 1000, T0 + 5000])
    assert out.state.replicas == 2


def test_down_never_below_one_while_there_is_load() -> None:
    """With min 0 and a trickle of load, scale-down stops at 1; only idleness takes a model to zero."""
    spec = dataclasses.replace(SPEC, min_replicas=0)
    out = step(spec, load(in_flight=1, arrived=0.1, last=T0 + 5000), a.State(replicas=3),
               [T0, T0 + 120, T0 + 1000, T0 + 5000])
    assert out.state.replicas == 1


def test_to_zero_after_idle_with_min_zero() -> None:
    """One replica, no request for scale_to_zero_after, min 0: the count goes to 0 with its sentence."""
    spec = dataclasses.replace(SPEC, min_replicas=0)
    early = a.decide(spec, load(last=T0), a.State(replicas=1), now=T0 + 299)
    assert early.state.replicas == 1
    out = a.decide(spec, load(last=T0), early.state, now=T0 + 300)
    assert out.state.replicas == 0 and out.reason == "1 → 0: no request for 300s"


def test_to_zero_counts_from_the_last_request_not_the_window_rate() -> None:
    """A request still in the routers' window (a rate above 0) does not hold the model past its idle time."""
    spec = dataclasses.replace(SPEC, min_replicas=0, scale_to_zero_after_s=20)
    trickle = load(arrived=1 / 30, last=T0)  # one request in a 30 s window, 20 s ago
    assert a.decide(spec, trickle, a.State(replicas=1), now=T0 + 19).state.replicas == 1
    out = a.decide(spec, trickle, a.State(replicas=1), now=T0 + 20)
    assert out.state.replicas == 0 and out.reason == "1 → 0: no request for 20s"


def test_never_to_zero_with_min_one() -> None:
    """min_replicas 1 keeps one replica however long the model is idle."""
    out = step(SPEC, load(last=T0), a.State(replicas=1), [T0 + 10_000, T0 + 100_000])
    assert out.state.replicas == 1 and out.reason == ""


def test_not_to_zero_while_requests_run() -> None:
    """A request in flight (a long generation) keeps the last replica even when the last arrival is old."""
    spec = dataclasses.replace(SPEC, min_replicas=0)
    out = a.decide(spec, load(in_flight=1, last=T0), a.State(replicas=1), now=T0 + 1000)
    assert out.state.replicas == 1


def test_idle_since_counts_when_routers_saw_no_request() -> None:
    """With last_request_at 0 (no router saw one), the idle time runs from the first quiet pass."""
    spec = dataclasses.replace(SPEC, min_replicas=0)
    first = a.decide(spec, load(), a.State(replicas=1), now=T0)
    assert first.state.replicas == 1 and first.state.idle_since == T0
    assert a.decide(spec, load(), first.state, now=T0 + 299).state.replicas == 1
    assert a.decide(spec, load(), first.state, now=T0 + 300).state.replicas == 0


def test_a_request_resets_idle() -> None:
    """A request during the idle window clears idle_since, so the idle time starts over."""
    spec = dataclasses.replace(SPEC, min_replicas=0)
    quiet = a.decide(spec, load(), a.State(replicas=1), now=T0)
    busy = a.decide(spec, load(arrived=0.5), quiet.state, now=T0 + 200)
    assert busy.state.idle_since is None
    again = a.decide(spec, load(), busy.state, now=T0 + 250)
    assert a.decide(spec, load(), again.state, now=T0 + 400).state.replicas == 1
    assert a.decide(spec, load(), again.state, now=T0 + 550).state.replicas == 0


@pytest.mark.parametrize("sig", [load(wanted=True), load(waiting=1), load(arrived=0.5)],
                         ids=["wanted", "waiting", "arriving"])
def test_wake_from_zero_at_once(sig: a.Signals) -> None:
    """A model at zero with a request held, waiting or arriving goes to 1 in the same pass, no window."""
    spec = dataclasses.replace(SPEC, min_replicas=0)
    out = a.decide(spec, sig, a.State(replicas=0, idle_since=T0 - 5000), now=T0)
    assert out.state.replicas == 1 and out.reason == "0 → 1: a request is waiting for a model at zero"
    assert out.state.last_scale_up_at == T0 and out.state.idle_since is None


def test_requests_from_before_the_scale_to_zero_do_not_wake_it() -> None:
    """Arrivals still in the routers' window but older than the scale to zero leave the model at zero."""
    spec = dataclasses.replace(SPEC, min_replicas=0, scale_to_zero_after_s=3)
    trickle = load(arrived=1 / 30, last=T0)
    zero = a.decide(spec, trickle, a.State(replicas=1), now=T0 + 4)
    assert zero.state.replicas == 0
    out = step(spec, trickle, zero.state, [T0 + 5, T0 + 6, T0 + 7])
    assert out.state.replicas == 0 and out.reason == ""
    newer = a.decide(spec, load(arrived=2 / 30, last=T0 + 8), out.state, now=T0 + 8)
    assert newer.state.replicas == 1


def test_stays_at_zero_without_requests() -> None:
    """A model at zero with no request stays at zero (a draining replica's in-flight does not wake it)."""
    spec = dataclasses.replace(SPEC, min_replicas=0)
    out = step(spec, load(in_flight=1), a.State(replicas=0), [T0, T0 + 1000])
    assert out.state.replicas == 0 and out.reason == ""


def test_wake_happens_even_while_rolling() -> None:
    """A rollout in flight does not delay the wake: a held request waits on it."""
    spec = dataclasses.replace(SPEC, min_replicas=0)
    out = a.decide(spec, load(wanted=True), a.State(replicas=0), now=T0, rolling=True)
    assert out.state.replicas == 1


def test_nothing_changes_while_rolling_and_windows_restart() -> None:
    """During a rollout neither up nor down happens; afterwards each window starts over."""
    busy = load(waiting=8, arrived=1)
    started = a.decide(SPEC, busy, a.State(replicas=1), now=T0)
    rolled = step(SPEC, busy, started.state, [T0 + 15, T0 + 100], rolling=True)
    assert rolled.state.replicas == 1 and rolled.state.above_since is None
    after = a.decide(SPEC, busy, rolled.state, now=T0 + 101)
    assert after.state.replicas == 1 and after.state.above_since == T0 + 101
    assert a.decide(SPEC, busy, after.state, now=T0 + 116).state.replicas == 4
    idle = step(SPEC, load(), a.State(replicas=4, below_since=T0), [T0 + 500], rolling=True)
    assert idle.state.replicas == 4 and idle.state.below_since is None


def test_no_signals_hold_everything() -> None:
    """No router has reported: the count and every window stay as they were."""
    state = a.State(replicas=3, above_since=T0, below_since=None, idle_since=T0 - 10, last_scale_up_at=T0 - 100)
    out = a.decide(SPEC, None, state, now=T0 + 10_000)
    assert out.state == state and out.reason == "" and out.limited == ""


def test_a_broken_streak_resets_its_window() -> None:
    """Load that drops back to target in the window clears above_since; the next streak needs a full window."""
    first = a.decide(SPEC, load(waiting=8, arrived=1), a.State(replicas=2), now=T0)
    broke = a.decide(SPEC, load(waiting=4, arrived=1), first.state, now=T0 + 10)
    assert broke.state.above_since is None and broke.state.below_since is None
    again = a.decide(SPEC, load(waiting=8, arrived=1), broke.state, now=T0 + 16)
    assert again.state.replicas == 2 and again.state.above_since == T0 + 16
    down = a.decide(SPEC, load(arrived=1), a.State(replicas=3), now=T0)
    back = a.decide(SPEC, load(waiting=6, arrived=1), down.state, now=T0 + 100)
    assert back.state.below_since is None
    over = a.decide(SPEC, load(waiting=8, arrived=1), down.state, now=T0 + 100)
    assert over.state.below_since is None and over.state.above_since == T0 + 100
    assert a.decide(SPEC, load(arrived=1), back.state, now=T0 + 130).state.replicas == 3


def test_the_largest_ask_over_targets_wins_and_names_the_reason() -> None:
    """With several targets the desired count is the max of their asks, and the reason names that target."""
    spec = a.Autoscale(min_replicas=1, max_replicas=10, queue_per_replica=2, inflight_per_replica=4,
                       tokens_per_s_per_replica=100, scale_up_after_s=0)
    out = a.decide(spec, load(waiting=2, in_flight=20, tokens=150, arrived=1), a.State(replicas=2), now=T0)
    assert out.state.replicas == 6
    assert out.reason == "2 → 6: in flight and waiting 11.0 per replica > target 4 for 0s"
    tok = a.decide(spec, load(tokens=900, in_flight=1, arrived=1), a.State(replicas=3), now=T0)
    assert tok.state.replicas == 9
    assert tok.reason == "3 → 9: output 300.0 tokens/s per replica > target 100 for 0s"


def test_inflight_target_counts_the_waiting_requests() -> None:
    """In flight held at the target by the router's per-replica cap, with a queue behind it, still scales up."""
    spec = a.Autoscale(min_replicas=1, max_replicas=10, inflight_per_replica=2, scale_up_after_s=0)
    out = a.decide(spec, load(in_flight=4, waiting=6, arrived=3), a.State(replicas=2), now=T0)
    assert out.state.replicas == 5
    assert out.reason == "2 → 5: in flight and waiting 5.0 per replica > target 2 for 0s"


def test_ttft_target_scales_in_proportion() -> None:
    """TTFT p90 over its target asks for current × p90 / target replicas."""
    spec = a.Autoscale(min_replicas=1, max_replicas=8, ttft_p90_ms=500, scale_up_after_s=0, scale_down_after_s=0)
    up = a.decide(spec, load(ttft=1200, in_flight=3, arrived=2), a.State(replicas=2), now=T0)
    assert up.state.replicas == 5 and up.reason == "2 → 5: TTFT p90 1200 ms > target 500 ms for 0s"
    down = a.decide(spec, load(ttft=100, in_flight=3, arrived=2), a.State(replicas=4), now=T0)
    assert down.state.replicas == 1 and down.reason == "4 → 1: TTFT p90 100 ms < target 500 ms for 0s"
    none = a.decide(spec, load(ttft=None, in_flight=3, arrived=2), a.State(replicas=4), now=T0)
    assert none.state.replicas == 4  # no TTFT seen: the target says nothing; ask for nothing is not "go down"


def test_stale_ttft_without_load_does_not_scale_up() -> None:
    """A slow TTFT still in the window after the load stopped starts no replica for nobody."""
    spec = a.Autoscale(min_replicas=1, max_replicas=8, ttft_p90_ms=500, scale_up_after_s=0)
    out = a.decide(spec, load(ttft=5000), a.State(replicas=2), now=T0)
    assert out.state.replicas == 2 and out.state.above_since is None
    gone = a.decide(dataclasses.replace(spec, scale_down_after_s=0), load(ttft=5000), a.State(replicas=3), now=T0)
    assert gone.state.replicas == 1 and gone.reason == "3 → 1: no request arriving, waiting or running for 0s"


@pytest.mark.parametrize("bad", [math.nan, -5.0, math.inf, -math.inf])
def test_odd_signal_values_read_as_zero(bad: float) -> None:
    """NaN, infinite and negative signals read as 0: no exception, no scale-up to max, no wake."""
    spec = dataclasses.replace(SPEC, inflight_per_replica=4, tokens_per_s_per_replica=100, ttft_p90_ms=500,
                               scale_up_after_s=0)
    sig = load(waiting=bad, in_flight=bad, arrived=bad, ttft=bad, tokens=bad, last=bad)
    out = a.decide(spec, sig, a.State(replicas=2), now=T0)
    assert out.state.replicas == 2 and out.state.above_since is None
    zero = a.decide(dataclasses.replace(spec, min_replicas=0), sig, a.State(replicas=0), now=T0)
    assert zero.state.replicas == 0


def test_huge_signal_is_capped_not_an_overflow() -> None:
    """A signal far past any cluster asks for max_replicas, without an OverflowError."""
    out = a.decide(dataclasses.replace(SPEC, scale_up_after_s=0), load(waiting=1e300, arrived=1),
                   a.State(replicas=1), now=T0)
    assert out.state.replicas == 4
    assert out.limited == "at max_replicas 4: the load asks for 1000000000 (queue 1e+300 per replica > target 2)"


def test_count_outside_new_bounds_is_brought_in() -> None:
    """After the bounds change, a count above max (or below min) moves to the bound at once."""
    out = a.decide(SPEC, load(waiting=100, arrived=1), a.State(replicas=6), now=T0)
    assert out.state.replicas == 4 and out.reason == "6 → 4: above max_replicas 4"
    spec = dataclasses.replace(SPEC, min_replicas=3)
    up = a.decide(spec, load(), a.State(replicas=1), now=T0)
    assert up.state.replicas == 3 and up.reason == "1 → 3: below min_replicas 3"


def test_ttft_quantile_interpolates_inside_the_bucket() -> None:
    """The quantile falls inside its bucket, linearly between the bucket's bounds."""
    counts = [0] * (len(a.TTFT_BUCKETS_MS) + 1)
    counts[2] = 10  # 10 requests in (50, 100] ms
    assert a.ttft_quantile(counts, 0.9) == pytest.approx(95.0)
    assert a.ttft_quantile(counts, 0.5) == pytest.approx(75.0)
    counts[5] = 10  # and 10 in (300, 500]
    assert a.ttft_quantile(counts, 0.9) == pytest.approx(460.0)


def test_ttft_quantile_empty_is_none_and_inf_bucket_is_the_last_bound() -> None:
    """No observation gives None; a quantile in the +inf bucket reads as the last finite bound."""
    n = len(a.TTFT_BUCKETS_MS) + 1
    assert a.ttft_quantile([0] * n, 0.9) is None and a.ttft_quantile([], 0.9) is None
    only_slow = [0] * n
    only_slow[-1] = 3
    assert a.ttft_quantile(only_slow, 0.9) == a.TTFT_BUCKETS_MS[-1]


def test_ttft_quantile_takes_odd_input() -> None:
    """Short, long and negative count lists, and q outside 0..1, give a finite answer, never an exception."""
    assert a.ttft_quantile([4], 0.5) == pytest.approx(12.5)
    long = [0] * 20
    long[-1] = 5
    assert a.ttft_quantile(long, 0.5) == a.TTFT_BUCKETS_MS[-1]
    assert a.ttft_quantile([-3, 2], 0.5) == pytest.approx(37.5)
    assert a.ttft_quantile([4], 7.0) == pytest.approx(25.0)
    assert a.ttft_quantile([4], math.nan) == pytest.approx(0.0)
