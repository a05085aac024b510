"""Idle replicas (issue 31, part 3): spec.idle parsed and refused by field, the idle timer's steps, and
over-commit's least-recently-used wake plan, on plain data (core/idle.py)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from llmgw.core import autoscale, idle, specs
from llmgw.core.errors import SpecError

BASE: dict[str, Any] = {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m1"},
                        "spec": {"engine": "sim"}}
IDLE = idle.Idle(after_s=600)


def doc(**spec: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    d["spec"].update(spec)
    return d


def test_idle_parses_defaults_and_round_trips() -> None:
    m = specs.parse_manifest(doc(idle={"after": "10m"}))
    assert m.spec.idle == idle.Idle(after_s=600.0, action="sleep", level=1)
    again = specs.parse_manifest(m.to_manifest())
    assert again == m
    assert m.to_manifest()["spec"]["idle"] == {"after": 600.0, "action": "sleep", "level": 1}


def test_idle_off_by_default_and_outside_the_fingerprint() -> None:
    plain = specs.parse_manifest(doc())
    assert plain.spec.idle is None and "idle" not in plain.to_manifest()["spec"]
    slept = specs.parse_manifest(doc(idle={"after": 30, "action": "stop"}))
    assert slept.spec.fingerprint() == plain.spec.fingerprint()  # changing idle restarts no engine


@pytest.mark.parametrize(("value", "field", "words"), [
    ({"action": "sleep"}, "spec.idle.after", "required"),
    ({"after": "0s"}, "spec.idle.after", "at least 1s"),
    ({"after": "soon"}, "spec.idle.after", ""),
    ({"after": "5m", "action": "nap"}, "spec.idle.action", "one of: sleep, stop"),
    ({"after": "5m", "level": 3}, "spec.idle.level", ""),
    ({"after": "5m", "action": "stop", "level": 2}, "spec.idle.level", "action: sleep"),
    ({"after": "5m", "afer": 1}, "spec.idle.afer", "did you mean 'after'"),
    ("10m", "spec.idle", ""),
])
def test_idle_refusals_name_the_field(value: Any, field: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        specs.parse_manifest(doc(idle=value))
    assert str(e.value).startswith(field + ":"), str(e.value)
    assert words in str(e.value)


def replica(state: str = idle.AWAKE, *, can_sleep: bool = True, last: float = 1000.0,
            awake_since: float = 0.0) -> idle.Replica:
    return idle.Replica(id="r1", state=state, can_sleep=can_sleep, last_request_at=last, awake_since=awake_since)


def test_awake_replica_sleeps_only_after_the_window() -> None:
    assert idle.idle_step(IDLE, replica(), now=1599, wanted=False, busy=False) is None
    step = idle.idle_step(IDLE, replica(), now=1600, wanted=False, busy=False)
    assert step is not None and step.verb == "sleep" and step.level == 1
    assert "no request for 600s" in step.reason


def test_busy_or_wanted_replica_never_sleeps() -> None:
    assert idle.idle_step(IDLE, replica(), now=9999, wanted=False, busy=True) is None
    assert idle.idle_step(IDLE, replica(), now=9999, wanted=True, busy=False) is None


def test_window_counts_from_the_last_wake_when_later() -> None:
    """A replica woken at 5000 by a request seen at 1000 (the routers' clock is stale) is not slept at once."""
    r = replica(last=1000.0, awake_since=5000.0)
    assert idle.idle_step(IDLE, r, now=5001, wanted=False, busy=False) is None
    assert idle.idle_step(IDLE, r, now=5600, wanted=False, busy=False) is not None


def test_engine_that_cannot_sleep_is_stopped_and_says_why() -> None:
    step = idle.idle_step(IDLE, replica(can_sleep=False), now=1600, wanted=False, busy=False)
    assert step is not None and step.verb == "stop"
    assert "cannot sleep" in step.reason and "page cache" in step.reason
    stop = idle.idle_step(idle.Idle(after_s=600, action="stop"), replica(), now=1600, wanted=False, busy=False)
    assert stop is not None and stop.verb == "stop" and "action: stop" in stop.reason


def test_sleeping_replica_wakes_only_when_wanted() -> None:
    asleep = replica(idle.SLEEPING)
    assert idle.idle_step(IDLE, asleep, now=99999, wanted=False, busy=False) is None
    step = idle.idle_step(IDLE, asleep, now=99999, wanted=True, busy=False)
    assert step is not None and step.verb == "wake"


def res(rid: str, model: str, mib: int, *, awake: bool, used: float, busy: bool = False) -> idle.Resident:
    return idle.Resident(id=rid, model=model, memory_mib=mib, awake=awake, last_used=used, busy=busy)


def test_fits_bounds_total_by_overcommit_and_awake_by_capacity() -> None:
    a = res("a", "ma", 60, awake=True, used=1)
    assert not idle.fits(100, [a], 60, overcommit=1.0)  # 120 > 100
    assert idle.fits(100, [a], 60, overcommit=2.0)  # a is idle: it can sleep to make room
    assert not idle.fits(100, [dataclass_busy(a)], 60, overcommit=2.0)  # a serves: no room awake
    assert not idle.fits(100, [a, res("b", "mb", 60, awake=False, used=2)], 60, overcommit=1.5)  # 180 > 150
    assert not idle.fits(100, [], 120, overcommit=4.0)  # bigger than the accelerator


def dataclass_busy(r: idle.Resident) -> idle.Resident:
    return idle.Resident(id=r.id, model=r.model, memory_mib=r.memory_mib, awake=r.awake, last_used=r.last_used,
                         busy=True)


def test_wake_with_room_sleeps_nobody() -> None:
    plan = idle.wake_plan(100, [res("a", "ma", 40, awake=True, used=5), res("b", "mb", 50, awake=False, used=1)],
                          "b")
    assert plan.wake == "b" and plan.sleep == ()


def test_wake_sleeps_the_least_recently_used_first_and_only_as_many_as_needed() -> None:
    residents = [res("new", "m1", 40, awake=True, used=90), res("old", "m2", 40, awake=True, used=10),
                 res("mid", "m3", 10, awake=True, used=50), res("want", "m4", 45, awake=False, used=0)]
    plan = idle.wake_plan(100, residents, "want")
    assert plan.wake == "want" and plan.sleep == ("old",)  # 10 free + 40 from the oldest is enough
    assert "least recently used old (m2)" in plan.reason


def test_wake_waits_while_the_only_room_is_held_by_busy_replicas() -> None:
    residents = [res("a", "ma", 80, awake=True, used=10, busy=True), res("b", "mb", 60, awake=False, used=0)]
    plan = idle.wake_plan(100, residents, "b")
    assert plan.wake == "" and plan.sleep == ()
    assert "ma" in plan.reason and "goes quiet" in plan.reason


def test_two_models_on_one_gpu_alternate() -> None:
    """A serves while B waits; once A goes quiet B wakes in its place; then the same for A."""
    a, b = res("a", "ma", 70, awake=True, used=10, busy=True), res("b", "mb", 70, awake=False, used=0)
    assert idle.wake_plan(100, [a, b], "b").wake == ""
    a = res("a", "ma", 70, awake=True, used=10)
    plan = idle.wake_plan(100, [a, b], "b")
    assert (plan.wake, plan.sleep) == ("b", ("a",))
    a, b = res("a", "ma", 70, awake=False, used=10), res("b", "mb", 70, awake=True, used=20)
    plan = idle.wake_plan(100, [a, b], "a")
    assert (plan.wake, plan.sleep) == ("a", ("b",))


def test_wake_plan_for_an_awake_or_unknown_replica_does_nothing() -> None:
    a = res("a", "ma", 10, awake=True, used=1)
    assert idle.wake_plan(100, [a], "a").wake == ""
    assert idle.wake_plan(100, [a], "zz").wake == ""


AUTO0 = autoscale.Autoscale(min_replicas=0, max_replicas=2, queue_per_replica=1, scale_to_zero_after_s=300)


def test_stop_on_idle_is_scale_to_zero_with_the_idle_window() -> None:
    stop = idle.Idle(after_s=60, action="stop")
    assert idle.zero_window(AUTO0, stop, engine="vllm", on_gpus=True).scale_to_zero_after_s == 60
    # An engine that cannot sleep stops even when sleep is asked: llama.cpp, vLLM on CPU.
    sleep = idle.Idle(after_s=60)
    assert idle.zero_window(AUTO0, sleep, engine="llamacpp", on_gpus=True).scale_to_zero_after_s == 60
    assert idle.zero_window(AUTO0, sleep, engine="vllm", on_gpus=False).scale_to_zero_after_s == 60


def test_sleepers_and_models_that_keep_a_replica_keep_their_window() -> None:
    sleep = idle.Idle(after_s=60)
    assert idle.zero_window(AUTO0, sleep, engine="vllm", on_gpus=True) == AUTO0
    assert idle.zero_window(AUTO0, sleep, engine="sim", on_gpus=False) == AUTO0
    assert idle.zero_window(AUTO0, None, engine="llamacpp", on_gpus=False) == AUTO0
    floor1 = dataclasses.replace(AUTO0, min_replicas=1)
    assert idle.zero_window(floor1, idle.Idle(after_s=60, action="stop"), engine="llamacpp", on_gpus=False) == floor1
    late = idle.Idle(after_s=900, action="stop")  # scale_to_zero_after comes first: as written
    assert idle.zero_window(AUTO0, late, engine="llamacpp", on_gpus=False) == AUTO0


def test_can_sleep_by_engine_and_accelerator() -> None:
    assert idle.can_sleep("vllm", (0,)) and not idle.can_sleep("vllm", ())
    assert idle.can_sleep("sim", ()) and not idle.can_sleep("llamacpp", (0,)) and not idle.can_sleep("sglang", (0,))


def test_sleep_and_kv_events_enter_the_fingerprint_where_the_engine_is_started_for_them() -> None:
    """An engine is started with what sleeping and kv_aware need (--enable-sleep-mode, --kv-events-config): setting
    or dropping them rolls the replicas, or they would reach only replicas started later. Where the engine starts
    no differently (stop on idle, llama.cpp), nothing restarts."""
    base = specs.parse_manifest(doc())
    slept = specs.parse_manifest(doc(idle={"after": 30, "action": "sleep"}))
    stopped = specs.parse_manifest(doc(idle={"after": 30, "action": "stop"}))
    routed = specs.parse_manifest(doc(routing="kv_aware"))
    assert slept.spec.fingerprint() != base.spec.fingerprint()
    assert stopped.spec.fingerprint() == base.spec.fingerprint()
    assert routed.spec.fingerprint() != base.spec.fingerprint()
    assert specs.parse_manifest(doc(routing="prefix_cache")).spec.fingerprint() == base.spec.fingerprint()
    llama = {"engine": "llamacpp", "source": "file:///models/m.gguf"}
    assert specs.parse_manifest(doc(routing="kv_aware", **llama)).spec.fingerprint() == \
        specs.parse_manifest(doc(**llama)).spec.fingerprint()
