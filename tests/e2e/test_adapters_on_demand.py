"""More adapters than one engine holds, through a standalone router: 2 sim replicas of a base, each holding at
most 2 adapters (``--max-cpu-loras 2``, vLLM's LRU cache as the sim mimics it), 4 adapters registered on both.
Adapter affinity keeps each adapter's requests on the replica that holds it (the engines stop loading), a busy
holder sends the next request to the other replica, which loads the adapter on demand and evicts its least
recently used one, and no request fails; each adapter's requests are metered under its own name."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmgw.core import adapters
from llmgw.core.adapteraffinity import BUSY_SPREAD
from llmgw.testing import procs, routed

NAMES = ("a", "b", "c", "d")


def stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/sim/stats", timeout=10).json())


def served_by(urls: dict[str, str], name: str, since: dict[str, int]) -> set[str]:
    """The replicas that answered ``name`` after the first ``since[replica]`` requests each."""
    return {r for r, url in urls.items() if any(b["model"] == name for b in stats(url)["requests"][since[r]:])}


def test_affinity_on_demand_load_and_lru_eviction_fail_no_request(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(adapters.VLLM_RUNTIME_ENV, "True")  # the sims inherit it, as the agent sets it
    for name in NAMES:
        (tmp_path / name).mkdir()
    with routed.started(tmp_path) as p:
        sim_args = ("--enable-lora", "--max-loras", "2", "--max-cpu-loras", "2", "--decode-tps", "20")
        urls = {"r1": p.sim("base", *sim_args), "r2": p.sim("base", *sim_args)}
        for url in urls.values():  # every replica registers every adapter, as its agent does
            for name in NAMES:
                got = httpx.post(f"{url}/v1/load_lora_adapter", timeout=10,
                                 json={"lora_name": name, "lora_path": str(tmp_path / name)})
                assert got.status_code == 200, got.text
        assert [stats(u)["lora"]["held"] for u in urls.values()] == [["c", "d"], ["c", "d"]]
        router = p.router([{
            "name": "base", "served_name": "base", "routing": "least_outstanding", "adapters": list(NAMES),
            "adapter_slots": 2,
            "endpoints": [{"replica_id": r, "url": u, "adapters": list(NAMES)} for r, u in urls.items()],
        }])
        client = openai.OpenAI(base_url=f"{router}/v1", api_key="none", max_retries=0)

        def ask(name: str, tokens: int = 1) -> str:
            out = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=tokens)
            assert out.model == name
            return str(out.choices[0].message.content)

        # Each adapter twice in a row, twice over: round robin would put each on both replicas, and each
        # engine would load at every other request. Affinity keeps each on one replica from its first request.
        for _ in range(2):
            for name in NAMES:
                assert ask(name) == ask(name) == f" {name}:tok0"
        warm = {r: len(stats(u)["requests"]) for r, u in urls.items()}
        loads = {r: stats(u)["lora"]["loads"] for r, u in urls.items()}
        for _ in range(3):
            for name in NAMES:
                assert ask(name) == f" {name}:tok0"
        owners = {name: served_by(urls, name, warm) for name in NAMES}
        assert all(len(o) == 1 for o in owners.values()), owners
        assert sorted(len([n for n in NAMES if owners[n] == {r}]) for r in urls) == [2, 2]  # 2 each: all fit
        # Warm: not one load more in either engine since; each holds exactly the two it is sent.
        assert {r: stats(u)["lora"]["loads"] for r, u in urls.items()} == loads
        for r, u in urls.items():
            assert sorted(stats(u)["lora"]["held"]) == sorted(n for n in NAMES if owners[n] == {r})
        # The evicted adapters (a and b, evicted at registration) were loaded on demand, and served.
        assert sum(stats(u)["lora"]["loads"] for u in urls.values()) > 2 * len(NAMES)

        # A busy holder: BUSY_SPREAD long requests for a keep its holder busy; the next goes to the other
        # replica, whose engine loads a on demand and evicts its least recently used adapter.
        (home,) = owners["a"]
        (other,) = set(urls) - {home}
        lru_there = stats(urls[other])["lora"]["held"][0]
        before = stats(urls[other])["lora"]

        def at_home() -> int:
            return sum(1 for b in stats(urls[home])["requests"] if b["model"] == "a")

        seen = at_home()
        with concurrent.futures.ThreadPoolExecutor(BUSY_SPREAD + 1) as pool:
            long = [pool.submit(ask, "a", 60) for _ in range(BUSY_SPREAD)]  # 3 s each at 20 tokens/s
            # Until its engine has them all (all in flight at the router): this orders the test, decides nothing.
            procs.wait_for(lambda: at_home() == seen + BUSY_SPREAD, timeout=20, interval=0.02, what="all in")
            assert ask("a") == " a:tok0"
            assert all(f.result().startswith(" a:tok0") for f in long)
        after = stats(urls[other])["lora"]
        assert after["loads"] == before["loads"] + 1 and after["evictions"] == before["evictions"] + 1
        assert lru_there not in after["held"] and after["held"][-1] == "a"
        metrics = httpx.get(f"{router}/metrics", timeout=10).text
        for name in NAMES:
            assert f'model="{name}"' in metrics
