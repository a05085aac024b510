"""More adapters than an engine holds, in a running cluster (server, agent, 2 sim replicas, the in-process
router): a model with MAX_SLOTS + 2 adapters starts its engines with MAX_SLOTS slots, every replica registers
every adapter, each adapter's requests stay on one replica, the ones evicted are loaded on demand, no request
fails, and the usage the control plane stores counts each adapter under its own name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.core import adapters
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model

NAMES = tuple(f"l{i}" for i in range(adapters.MAX_SLOTS + 2))


@pytest.fixture
def system_args(tmp_path: Path) -> dict[str, Any]:
    """Adapters are local directories under the test's folder: the agent's source roots must hold them."""
    return {"agent_env": {"LLMGW_AGENT_SOURCE_ROOTS": str(tmp_path)}}


def lora(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/sim/stats", timeout=10).json()["lora"])


def test_more_adapters_than_slots_load_on_demand_with_affinity_and_are_metered(system: System,
                                                                              tmp_path: Path) -> None:
    for name in NAMES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")
    system.apply(sim_model("base", replicas=2, args=["--decode-tps", "2000"],
                           adapters=[{"name": n, "source": str(tmp_path / n)} for n in NAMES]))
    system.wait_model("base")
    wait_for(lambda: [sorted(r["adapters"]) for r in system.replicas("base")] == [sorted(NAMES)] * 2, timeout=30,
             interval=0.2, what="every replica registered every adapter")
    engines = {r["id"]: r["endpoint"] for r in system.replicas("base")}
    assert len(engines) == 2
    # Started with MAX_SLOTS, not one slot per adapter: registering all evicted the first two in each.
    for url in engines.values():
        held = lora(url)
        assert held["capacity"] == adapters.MAX_SLOTS and len(held["registered"]) == len(NAMES)
        assert held["held"] == list(NAMES[2:])
    before = sum(lora(u)["loads"] for u in engines.values())
    failures = []

    def each_once() -> None:
        for name in NAMES:
            r = system.request("POST", "/v1/chat/completions", json={
                "model": name, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
            if r.status_code != 200 or r.json()["choices"][0]["message"]["content"] != f" {name}:tok0":
                failures.append((name, r.status_code, r.text[:200]))

    each_once()
    # On demand: the evicted ones were loaded again where they were sent.
    warm = sum(lora(u)["loads"] for u in engines.values())
    assert warm > before
    each_once()
    assert failures == []
    stats = {rid: httpx.get(f"{u}/sim/stats", timeout=10).json() for rid, u in engines.items()}
    # Affinity: each adapter's two requests went to one replica, the adapters spread over both (the same
    # prompt would put them all on one by its prefix, where 18 do not fit in 16), so the second round
    # found every adapter held: not one load.
    for name in NAMES:
        assert sum(1 for s in stats.values() if any(b["model"] == name for b in s["requests"])) == 1, name
    assert all(s["requests"] for s in stats.values())
    assert sum(s["lora"]["loads"] for s in stats.values()) == warm
    assert all(len(s["lora"]["held"]) <= adapters.MAX_SLOTS for s in stats.values())

    def by_model() -> dict[str, int]:
        rows = system.get("/api/v1/usage?since=1d&by=model")["rows"]
        return {r["group"]: r["requests"] for r in rows}

    wait_for(lambda: by_model() == dict.fromkeys(NAMES, 2), timeout=30, interval=0.5,
             what="usage stored per adapter")


def test_an_adapter_no_replica_has_registered_yet_is_held_until_one_has_not_refused(system: System,
                                                                                   tmp_path: Path) -> None:
    """The table names an adapter as soon as it is applied; its engines register it a while later (here the
    sim takes 4 s to load one). A request in between is held, as for a cold start, and answered once a
    replica has it: never sent to an engine that does not know the name (which answers 404)."""
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")

    def model(*names: str) -> dict[str, Any]:
        return sim_model("slow", args=["--decode-tps", "2000", "--lora-load-delay", "4"],
                         adapters=[{"name": n, "source": str(tmp_path / n)} for n in names])

    system.apply(model("x"))
    system.wait_model("slow")
    wait_for(lambda: [r["adapters"] for r in system.replicas("slow")] == [["x"]], timeout=30, interval=0.1,
             what="x registered")
    system.apply(model("x", "y"))

    def names() -> set[str]:
        return {m["id"] for m in httpx.get(f"{system.url}/v1/models", timeout=10).json()["data"]}

    listed = wait_for(lambda: "y" in names() and [r["adapters"] for r in system.replicas("slow")], timeout=20,
                      interval=0.05, what="y listed")
    assert listed == [["x"]]  # the router knows the name before the engine does
    r = system.request("POST", "/v1/chat/completions", json={
        "model": "y", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == " y:tok0", r.text
    assert [r["adapters"] for r in system.replicas("slow")] == [["x", "y"]]
