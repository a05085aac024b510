"""Budgets and usage across two control planes on one PostgreSQL, with the leader killed mid-burst (issue 26).

Two control planes (A leads, B stands by) on a real PostgreSQL, an agent, a sim model, and two standalone
routers told of both control planes. A key with a budget of 100 requests a day; 300 requests at once over both
routers; halfway, A is killed with SIGKILL. The routers' quota syncs and usage batches go to B from then on:
the ledger and the journals' marks are in the database, so nothing is granted twice and nothing counted twice.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing.burst import Outcome, StandaloneRouter, burst, summary
from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model

LEASE = ("--lease", "2s", "--lease-renew", "0.25s")
MODEL = "metered"
REQUESTS_PER_DAY = 100
TOKENS_PER_DAY = 20_000
_names = itertools.count(1)


@pytest.fixture(scope="module")
def pg() -> Iterator[Postgres]:
    with Postgres() as server:
        yield server


@pytest.fixture
def ha(tmp_path: Path, pg: Postgres) -> Iterator[tuple[System, System, list[StandaloneRouter], dict[str, str]]]:
    url = pg.create_database(f"budget{next(_names)}")
    a = System(tmp_path / "a", database=url, server_args=LEASE, node_grace_s=60)
    b = System(tmp_path / "b", database=url, ca_from=tmp_path / "a" / "data" / "pki", server_args=LEASE,
               node_grace_s=60)
    routers: list[StandaloneRouter] = []
    try:
        a.start_server()
        b.token = a.token
        b.start_server()
        a.start_agent("node1")
        a.apply(sim_model(MODEL, replicas=2, args=["--decode-tps", "2000"]))
        a.wait_model(MODEL, timeout=60)
        keys = {}
        for name, limits in (("requests", {"requests_per_day": REQUESTS_PER_DAY}),
                             ("tokens", {"tokens_per_day": TOKENS_PER_DAY})):
            made = a.request("POST", "/api/v1/keys", json={"name": name, "limits": limits})
            assert made.status_code == 201, made.text
            keys[name], keys[name + "_id"] = made.json()["key"], made.json()["id"]
        routers = [StandaloneRouter(a, tmp_path, f"r{i}", controls=(a.url, b.url)) for i in (1, 2)]
        for r in routers:
            r.start()
        yield a, b, routers, keys
    finally:
        for r in routers:
            r.stop()
        b.close()
        a.close()


def test_a_control_plane_killed_mid_burst_loses_nothing_and_grants_nothing_twice(ha: Any) -> None:
    """Both keys' bursts at once (600 requests), the leading control plane killed halfway through them."""
    a, b, routers, keys = ha
    import httpx

    for r in routers:
        wait_for(lambda r=r: httpx.get(r.url + "/v1/models", headers={"Authorization": f"Bearer {keys['tokens']}"},
                                       timeout=5).status_code == 200, timeout=30, what=f"{r.name} serving")

    def kill_leader() -> None:
        assert a.server is not None
        a.server.signal(signal.SIGKILL)
        a.server.stop(timeout=5)
        a.server = None

    async def both() -> tuple[list[Outcome], list[Outcome]]:
        urls = [r.url for r in routers]
        by_requests, by_tokens = await asyncio.gather(
            burst(urls, keys["requests"], MODEL, n=300, max_tokens=20, midway=kill_leader),
            burst(urls, keys["tokens"], MODEL, n=300, max_tokens=100))
        return by_requests, by_tokens

    by_requests, by_tokens = asyncio.run(both())
    for name, outcomes, limit in (("requests", by_requests, REQUESTS_PER_DAY), ("tokens", by_tokens, TOKENS_PER_DAY)):
        s = summary(outcomes)
        assert s.broken == 0, [o.error or o.body for o in outcomes if o.status not in (200, 429)][:5]
        assert s.refused == 300 - s.served
        if name == "requests":
            assert s.served <= limit, s
        else:
            assert s.tokens <= limit + 300 * 20, s
        want = (s.served, s.prompt_tokens, s.completion_tokens)
        last: dict[str, Any] = {}

        def check(key_id: str = keys[name + "_id"], want: tuple[int, int, int] = want) -> bool:
            nonlocal last
            items = b.get("/api/v1/usage?since=1d&by=key")["rows"]
            last = next((i for i in items if i.get("group") == key_id), {})
            return (last.get("requests"), last.get("prompt_tokens"), last.get("completion_tokens")) == want

        try:
            wait_for(check, timeout=40, interval=0.5, what="B's stored usage to equal the engines' usage")
        except TimeoutError:
            pass
        assert (last.get("requests"), last.get("prompt_tokens"), last.get("completion_tokens")) == want, (last, s)
        print(f"\ncontrol plane killed mid-burst, {name} key: served {s.served} requests, {s.tokens} tokens "
              f"(limit {limit}), refused {s.refused}; stored {last.get('requests')} requests")
