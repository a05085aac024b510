"""Autoscaling end to end: a real `llmgw server` (its in-process router reporting load), an agent and sim engines.

Load goes through the server's router as a client's would; the autoscaler's decisions are read
back from the REST API (the model's count in force, its Autoscaled events), and every request
sent is counted: none may fail, through a scale-up, a drained scale-down, and a cold start from zero.
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from llmgw.control.store import store as store_mod
from llmgw.control.store.store import Store, StoredAutoscale
from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model


def auto_model(name: str, *, args: list[str] | None = None, **auto: Any) -> dict[str, Any]:
    return sim_model(name, args=args, autoscale=auto)


def client(system: System, *, timeout: float = 60) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{system.url}/v1", api_key="unused", max_retries=0, timeout=timeout)


class Load:
    """``workers`` threads each sending chat requests back to back through the router; counts what failed."""

    def __init__(self, system: System, model: str, workers: int, *, max_tokens: int = 10) -> None:
        self.url, self.model, self.max_tokens = system.url, model, max_tokens
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(workers)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60, trust_env=False) as c:
            while not self._stop.is_set():
                try:
                    r = c.post("/v1/chat/completions", json={"model": self.model, "max_tokens": self.max_tokens,
                                                             "messages": [{"role": "user", "content": "x"}]})
                    said = "" if r.status_code == 200 else f"{r.status_code}: {r.text[:200]}"
                except httpx.HTTPError as e:
                    said = f"{type(e).__name__}: {e}"
                with self._lock:
                    if said:
                        self.failed.append(said)
                    else:
                        self.ok += 1

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)


def cli(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLMGW, *args, "--url", system.url], capture_output=True, text=True, timeout=60,
                          env={**system.cli_env(), "COLUMNS": "300"})


def autoscaled_events(system: System, model: str) -> list[str]:
    return [e["message"] for e in system.get(f"/api/v1/events?model={model}")["items"] if e["reason"] == "Autoscaled"]


def in_force(system: System, model: str) -> int:
    return int(system.model_status(model)["autoscale"]["replicas"])


def test_a_burst_scales_up_and_its_end_drains_back_down_without_a_failed_request(system: System) -> None:
    """min 1 max 4: 12 requests at once scale up within the window, with the event; back to 1, zero failed."""
    system.apply(auto_model("burst", args=["--decode-tps", "20", "--parallel", "16"], min_replicas=1,
                            max_replicas=4, inflight_per_replica=2, scale_up_after="2s", scale_down_after="4s"))
    system.wait_model("burst")
    system.wait_router("burst", 1)
    load = Load(system, "burst", 12)  # each request ~0.5 s at 20 tokens/s: ~12 in flight for 2 replicas' worth 6
    try:
        wait_for(lambda: in_force(system, "burst") == 4, timeout=30, interval=0.2, what="scaled up to 4")
        ups = autoscaled_events(system, "burst")
        # Up from 1 in one step (to 4, or to 3 then 4 when a report caught fewer in flight): each with its reason.
        assert ups and ups[0].startswith("1 → ") and all(": in flight" in m and "> target 2 for" in m for m in ups), ups
        wait_for(lambda: system.model_status("burst")["ready_replicas"] == 4, timeout=30, interval=0.2,
                 what="4 Ready")
        load.stop()
        burst_ok = load.ok
        load = Load(system, "burst", 1)  # a trickle goes on through the drain: nothing it sends may fail
        wait_for(lambda: in_force(system, "burst") == 1, timeout=30, interval=0.2, what="scaled down to 1")
        wait_for(lambda: len(system.replicas("burst")) == 1, timeout=30, interval=0.2, what="drained replicas gone")
        time.sleep(1.0)
    finally:
        load.stop()
    downs = autoscaled_events(system, "burst")
    assert any(m.startswith("4 → ") and ": in flight" in m and "< target 2 for" in m for m in downs), downs
    assert load.failed == [] and load.ok > 0 and burst_ok > 20
    doc = system.get("/api/v1/models/burst")["status"]["autoscale"]
    assert " → 1: in flight" in doc["last_reason"], doc
    assert doc["replicas"] == 1 and doc["signals"] is not None and doc["routers"] == ["server"]


def test_a_model_at_zero_holds_requests_until_its_replica_is_ready(system: System) -> None:
    """min 0: Cold with no replica; a request (not streamed, then streamed) is held, a replica starts, both answered."""
    system.apply(auto_model("zero", args=["--decode-tps", "400", "--startup-delay", "1"], min_replicas=0,
                            max_replicas=2, queue_per_replica=4, scale_to_zero_after="3s", cold_start_timeout="40s"))
    cold = system.wait_model("zero", "Cold")
    assert cold["message"] == ("no replica: scaled to zero after 3s idle; the next request starts one (cold start, "
                               "up to 40s)")
    assert system.replicas("zero") == []
    c = client(system)
    chat = c.chat.completions.create(model="zero", messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    assert chat.choices[0].message.content
    assert "0 → 1: a request is waiting for a model at zero" in autoscaled_events(system, "zero")
    # Idle past scale_to_zero_after: back to zero, drained, Cold again.
    system.wait_model("zero", "Cold", timeout=30)
    wait_for(lambda: system.replicas("zero") == [], timeout=30, interval=0.2, what="replica gone")
    assert any(m.startswith("1 → 0: no request for") for m in autoscaled_events(system, "zero"))
    chunks = list(c.chat.completions.create(model="zero", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert len(text.split()) == 4
    assert autoscaled_events(system, "zero").count("0 → 1: a request is waiting for a model at zero") == 2
    # What a person sees: the count in force and the last decision; a manual scale refused with the bounds.
    shown = cli(system, "describe", "model", "zero")
    assert shown.returncode == 0 and "Autoscale:" in shown.stdout and "(min 0, max 2); last: 0 → 1" in shown.stdout
    assert "from 1 router(s)" in shown.stdout
    refused = cli(system, "scale", "zero", "--replicas", "2")
    assert refused.returncode == 1
    assert ("model zero is autoscaled (min 0, max 2); change spec.autoscale.min_replicas/max_replicas instead"
            in " ".join(refused.stderr.split())), refused.stderr


def test_a_cold_start_longer_than_its_timeout_is_a_clear_503(system: System) -> None:
    """The engine takes 20 s to start and the model's cold_start_timeout is 2 s: 503, Retry-After, the state said."""
    system.apply(auto_model("slow", args=["--startup-delay", "20"], min_replicas=0, max_replicas=1,
                            queue_per_replica=1, cold_start_timeout="2s"))
    system.wait_model("slow", "Cold")
    started = time.monotonic()
    r = system.request("POST", "/v1/chat/completions", json={"model": "slow", "max_tokens": 2,
                                                              "messages": [{"role": "user", "content": "x"}]})
    waited = time.monotonic() - started
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) > 0
    message = r.json()["error"]["message"]
    assert "slow" in message and ("Starting" in message or "Pending" in message or "Cold" in message), message
    assert waited >= 1.5  # held for its timeout first, not refused at once
    assert in_force(system, "slow") == 1  # the held request woke it: the replica goes on starting for the next one


def test_the_autoscale_state_on_postgresql_is_fenced_like_every_write() -> None:
    """On a real PostgreSQL: states round-trip and delete; a deposed leader's write is refused and changes nothing."""
    with Postgres() as pg:
        url = pg.create_database("autoscale")
        leader, usurper = Store.open_url(url), Store.open_url(url)
        try:
            assert leader.take_lease("cp-a", now=100.0, lease_s=10.0) is not None
            leader.fence = ("cp-a", 1)
            a = StoredAutoscale("m", 3, above_since=101.5, idle_since=None, last_scale_up_at=104.0,
                                last_change_at=104.0, last_reason="1 → 3: queue 9.2 per replica > target 2 for 30s")
            leader.write_autoscale(upserts=[a, StoredAutoscale("x", 0, idle_since=3.0)])
            leader.write_autoscale(deletes=["x"])
            assert usurper.autoscale_states() == {"m": a}
            assert usurper.take_lease("cp-b", now=111.0, lease_s=10.0) is not None  # a's lease ran out
            with pytest.raises(store_mod.Fenced):
                leader.write_autoscale(upserts=[StoredAutoscale("m", 1)])
            assert usurper.autoscale_states()["m"].replicas == 3
        finally:
            leader.close()
            usurper.close()
