"""A rolling update under load, on the whole system: server, two agents, four sim engines, the router.

The property measured is the one a roll promises: clients sending without
pause (streaming and not) see no failed request while every replica is
replaced, and the model never has more than replicas + max_surge replicas nor
fewer than replicas - max_unavailable Ready.
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Any

import httpx

from llmgw.testing.load import Load
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model


def _watch(system: System, name: str, samples: list[tuple[int, int]], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            reps = system.replicas(name)
        except httpx.HTTPError:
            continue
        samples.append((len(reps), sum(1 for r in reps if r["phase"] == "Ready")))
        time.sleep(0.05)


def _rolled(system: System, name: str, fp: str) -> bool:
    reps = system.get(f"/api/v1/models/{name}/describe")["replicas"]
    return len(reps) == 4 and all(r["fingerprint"] == fp and r["phase"] == "Ready" for r in reps)


def test_rolling_update_of_four_replicas_under_load_fails_no_request(system: System) -> None:
    """Changing the engine args of a 4-replica model rolls all 4 while clients send: zero failed requests."""
    system.start_agent("node2")
    doc = sim_model("roll", replicas=4, args=["--decode-tps", "400"])
    system.apply(doc)
    system.wait_model("roll", timeout=60)
    system.wait_router("roll", 4)
    old_fp = system.get("/api/v1/models/roll/describe")["fingerprint"]
    samples: list[tuple[int, int]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(system, "roll", samples, stop), daemon=True)
    with Load(system.url, "roll") as load:
        load.wait_ok(20)
        steady_from, steady_ok = time.monotonic(), load.ok
        load.wait_ok(50)
        steady_rate = (load.ok - steady_ok) / (time.monotonic() - steady_from)
        before_roll = load.ok
        watcher.start()
        doc["spec"]["engine_args"] = ["--decode-tps", "401"]
        started = time.monotonic()
        system.apply(doc)
        new_fp = system.get("/api/v1/models/roll/describe")["fingerprint"]
        assert new_fp != old_fp
        wait_for(lambda: _rolled(system, "roll", new_fp), timeout=120, interval=0.2, what="all 4 replicas rolled")
        took = time.monotonic() - started
        during = load.ok - before_roll
        system.wait_router("roll", 4)
        load.wait_ok(50)  # and the new replicas serve
        stop.set()
        watcher.join(timeout=10)
    assert load.failures == [], load.failures[:5]
    assert samples and max(n for n, _ in samples) <= 5, samples  # replicas + max_surge 1
    assert min(ready for _, ready in samples) >= 4, samples  # replicas - max_unavailable 0
    print(f"\nmeasured: roll of 4 sim replicas took {took:.1f}s; {during} requests during it, {load.ok} in all, "
          f"{len(load.failures)} failed; at most {max(n for n, _ in samples)} replicas, "
          f"at least {min(r for _, r in samples)} Ready; throughput during the roll / steady before it: "
          f"{during / took / steady_rate:.2f}")

    described = system.get("/api/v1/models/roll/describe")
    conds = {c["type"]: c for c in described["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["Progressing"]["reason"] == "UpToDate"
    reasons = [e["reason"] for e in described["events"]]
    assert "Updated" in reasons and "RollingUpdate" in reasons and "UpToDate" in reasons
    out = subprocess.run([*LLMGW, "describe", "model", "roll", "--url", system.url], capture_output=True, text=True,
                         timeout=60, env=system.cli_env())
    assert out.returncode == 0, out.stderr
    assert "4 desired, 4 Ready, 4 on the current spec" in out.stdout and "Progressing" in out.stdout
    ev = subprocess.run([*LLMGW, "events", "--model", "roll", "--url", system.url], capture_output=True,
                        text=True, timeout=60, env=system.cli_env())
    assert ev.returncode == 0 and ev.stdout.count("replaced by a replica with the model's new spec") == 4


def test_rollout_bounds_are_validated(system: System) -> None:
    """A bad rollout bound is refused naming the field; only the bounds changing rolls nothing, while the loop
    goes on acting on the model (a later scale is carried out)."""
    bad = sim_model("b", rollout={"max_surge": "150%"})
    r = system.request("POST", "/api/v1/models", json=bad)
    assert r.status_code == 422 and r.json()["error"]["param"] == "spec.rollout.max_surge"
    doc: dict[str, Any] = sim_model("b", replicas=2)
    system.apply(doc)
    system.wait_model("b")
    ids = {x["id"] for x in system.replicas("b")}
    fp = system.get("/api/v1/models/b/describe")["fingerprint"]
    doc["spec"]["rollout"] = {"max_surge": 2, "max_unavailable": "50%"}
    system.apply(doc)
    # Then a change the loop must act on. Passes are level-triggered and in order: once the third replica is
    # Ready, the loop has passed over the new bounds more than once, so a roll they started would show below
    # (surge replicas, or old ones not current). A stalled loop never gets here; a sleep would have passed.
    doc["spec"]["replicas"] = 3
    system.apply(doc)
    wait_for(lambda: system.model_status("b")["ready_replicas"] == 3, timeout=30, interval=0.1,
             what="the third replica Ready")
    described = system.get("/api/v1/models/b/describe")
    reps = described["replicas"]
    assert len(reps) == 3 and ids < {r["id"] for r in reps}, reps  # the two kept, one added, none replaced
    assert all(r["phase"] == "Ready" and r["current"] and r["attempt"] == 1 for r in reps), reps
    assert described["fingerprint"] == fp  # the bounds are not part of what the engine runs
    reasons = [e["reason"] for e in system.get("/api/v1/events?model=b")["items"]]
    assert "RollingUpdate" not in reasons and "Deleted" not in reasons, reasons
