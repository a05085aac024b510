"""spec.idle end to end (issue 31, part 3): a real `llmgw server` (its in-process router), an agent and a
sim engine with vLLM's sleep mode. A replica idle past `after` is put to sleep by its agent (same pid, its
reported memory freed, Sleeping in the API); the next request is held, wakes it and is served."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from typing import Any

import openai

from llmgw.control.loop.sleeper import KEY
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model


def sim_stats(endpoint: str) -> dict[str, Any]:
    with urllib.request.urlopen(endpoint + "/sim/stats", timeout=5) as r:
        return dict(json.loads(r.read()))


def replica(system: System, model: str) -> dict[str, Any]:
    items = system.replicas(model)
    assert len(items) == 1, items
    return items[0]


def events(system: System, model: str, reason: str) -> list[str]:
    return [e["message"] for e in system.get(f"/api/v1/events?model={model}")["items"] if e["reason"] == reason]


def test_idle_replica_sleeps_and_the_next_request_wakes_it(system: System) -> None:
    system.apply(sim_model("sleepy", args=["--decode-tps", "400", "--wake-delay", "0.5", "--memory-mib", "8000",
                                           "--sleep-memory-mib", "200"],
                           idle={"after": "3s", "action": "sleep", "level": 1}))
    system.wait_model("sleepy")
    system.wait_router("sleepy", 1)
    first = replica(system, "sleepy")
    endpoint = first["endpoint"]
    stats = sim_stats(endpoint)
    pid = stats["sleep"]["pid"]
    assert stats["sleep"]["memory_mib"] == 8000 and not stats["sleep"]["sleeping"]

    # Idle past 3 s: its agent puts the engine to sleep; the process stays.
    wait_for(lambda: sim_stats(endpoint)["sleep"]["sleeping"], timeout=30, interval=0.2, what="engine asleep")
    wait_for(lambda: replica(system, "sleepy").get("sleep_level") == 1, timeout=10, interval=0.1,
             what="replica Sleeping in the API")
    asleep = sim_stats(endpoint)["sleep"]
    assert asleep == {"sleeping": True, "level": 1, "sleeps": 1, "wakes": 0, "memory_mib": 200, "pid": pid}
    assert any("no request for" in m and "put to sleep at level 1" in m for m in events(system, "sleepy", "Sleeping"))
    assert replica(system, "sleepy")["id"] == first["id"]
    shown = subprocess.run([*LLMGW, "get", "replicas", "--url", system.url], capture_output=True, text=True,
                           timeout=60, env={**system.cli_env(), "COLUMNS": "300"})
    assert "Sleeping (level 1)" in shown.stdout, shown.stdout + shown.stderr
    for what in (["describe", "model", "sleepy"], ["describe", "node", "node1"]):
        shown = subprocess.run([*LLMGW, *what, "--url", system.url], capture_output=True, text=True,
                               timeout=60, env={**system.cli_env(), "COLUMNS": "300"})
        assert "Sleeping (level 1)" in shown.stdout, shown.stdout + shown.stderr

    # The next request is held (not refused), wakes it, and is served by the same engine.
    c = openai.OpenAI(base_url=f"{system.url}/v1", api_key="unused", max_retries=0, timeout=60)
    started = time.monotonic()
    chat = c.chat.completions.create(model="sleepy", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    waited = time.monotonic() - started
    assert chat.choices[0].message.content
    woke = sim_stats(endpoint)["sleep"]
    assert woke["wakes"] == 1 and not woke["sleeping"] and woke["memory_mib"] == 8000 and woke["pid"] == pid
    assert waited >= 0.5  # held through the wake (the sim's wake delay)
    assert events(system, "sleepy", "Waking")
    after = replica(system, "sleepy")
    assert after["id"] == first["id"] and after["endpoint"] == endpoint and after.get("sleep_level") == 0
    assert KEY  # the sleeping set lives in the store's settings row named here


def test_idle_stop_is_a_scale_to_zero_after_the_idle_window(system: System) -> None:
    """action: stop (what an engine that cannot sleep gets): gone after `after`, not after scale_to_zero_after
    (300 s here); the next request is held, starts a replica and is served."""
    system.apply(sim_model("stopper", args=["--decode-tps", "400"], idle={"after": "2s", "action": "stop"},
                           autoscale={"min_replicas": 0, "max_replicas": 1, "queue_per_replica": 4,
                                      "scale_to_zero_after": "300s", "cold_start_timeout": "40s"}))
    c = openai.OpenAI(base_url=f"{system.url}/v1", api_key="unused", max_retries=0, timeout=60)
    assert c.chat.completions.create(model="stopper", messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=2).choices[0].message.content
    wait_for(lambda: system.replicas("stopper") == [], timeout=30, interval=0.2, what="stopped on idle")
    assert any(m.startswith("1 → 0: no request for") for m in events(system, "stopper", "Autoscaled"))
    assert c.chat.completions.create(model="stopper", messages=[{"role": "user", "content": "again"}],
                                     max_tokens=2).choices[0].message.content


def test_a_sleeping_engine_adopted_by_a_new_agent_stays_asleep_until_wanted(system: System) -> None:
    """The agent is killed while its engine sleeps; the next agent adopts the engine, asks it (/is_sleeping)
    and reports it asleep, so nothing is routed to it; a request then wakes it, same process throughout."""
    system.apply(sim_model("adopted", args=["--decode-tps", "400", "--wake-delay", "0.2"],
                           idle={"after": "2s"}))
    system.wait_model("adopted")
    system.wait_router("adopted", 1)
    endpoint = replica(system, "adopted")["endpoint"]
    pid = sim_stats(endpoint)["sleep"]["pid"]
    wait_for(lambda: replica(system, "adopted").get("sleep_level") == 1, timeout=30, interval=0.2, what="asleep")
    system.kill_agent("node1")
    system.start_agent("node1")
    log = system.root / "agent-node1.log"
    wait_for(lambda: "adopted engine answers after" in log.read_text() and ", asleep" in log.read_text(),
             timeout=60, interval=0.2, what="the new agent adopted it, asleep")
    time.sleep(1.0)  # its report reaches the control plane; a pass would wake it only if it were wanted
    assert replica(system, "adopted").get("sleep_level") == 1 and sim_stats(endpoint)["sleep"]["sleeping"]
    c = openai.OpenAI(base_url=f"{system.url}/v1", api_key="unused", max_retries=0, timeout=60)
    assert c.chat.completions.create(model="adopted", messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=2).choices[0].message.content
    assert sim_stats(endpoint)["sleep"]["pid"] == pid and sim_stats(endpoint)["sleep"]["wakes"] == 1
