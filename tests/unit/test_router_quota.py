"""The router's budget client (``router.quota``) against the sim ledger (``sim.ledger``): the ledger's semantics,
two routers sharing it, reservations that settle, refusals that say what and when, and the headers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from llmgw.core import quota as q
from llmgw.router import quota, request
from llmgw.router.auth import KeyInfo
from llmgw.router.table import ModelRoute
from llmgw.sim.ledger import SimLedger

ROUTE = ModelRoute(name="m", served_name="m")
PRICED = ModelRoute(name="p", served_name="p", prices=q.Prices(input_per_1m=1.0, output_per_1m=2.0))


def req(max_tokens: int | None = None, prompt: str = "hi") -> request.CompletionRequest:
    doc: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
    if max_tokens is not None:
        doc["max_tokens"] = max_tokens
    return request.parse(json.dumps(doc).encode())


def key(**limits: Any) -> KeyInfo:
    return KeyInfo(id="k1", project="team-a", limits=q.Limits(**limits))


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_key_and_project_without_budgets_cost_nothing() -> None:
    client = quota.QuotaClient("r1", SimLedger().sync)
    assert client.take(KeyInfo(id="k1", project="team-a"), {}, ROUTE, req()) is None
    assert client.take(KeyInfo(id=""), {}, ROUTE, req()) is None


def test_two_routers_on_one_ledger_never_admit_more_than_requests_per_day() -> None:
    ledger = SimLedger({("key:k1", "requests_per_day"): 25})
    a, b = quota.QuotaClient("r1", ledger.sync), quota.QuotaClient("r2", ledger.sync)
    k = key(requests_per_day=25)

    async def one(client: quota.QuotaClient) -> int | quota.BudgetRefused:
        try:
            ticket = await client.admit(k, {}, ROUTE, req())
        except quota.BudgetRefused as refused:
            return refused
        await asyncio.sleep(0)
        assert ticket is not None
        client.settle(ticket, 10, 0)
        return 1

    async def main() -> list[Any]:
        got = await asyncio.gather(*(one(a if i % 2 else b) for i in range(80)))
        await a.stop()
        await b.stop()
        return got

    results = run(main())
    served = sum(1 for r in results if r == 1)
    refused = [r for r in results if isinstance(r, quota.BudgetRefused)]
    assert served == 25 and len(refused) == 55
    assert ledger.charged("key:k1", "requests_per_day") == 25
    first = refused[0]
    assert first.status == 429 and first.code == "budget_exceeded"
    assert "API key k1's requests_per_day" in first.message and "limit 25" in first.message
    assert "resets at" in first.message
    headers = dict(first.headers())
    assert int(headers[b"retry-after"]) >= 1
    assert headers[b"x-ratelimit-limit-requests"] == b"25"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"


def test_token_reservation_settles_to_what_the_engine_reported() -> None:
    ledger = SimLedger({("project:team-a", "tokens_per_day"): 10_000})
    client = quota.QuotaClient("r1", ledger.sync)
    k = KeyInfo(id="k1", project="team-a")
    projects = {"team-a": q.Limits(tokens_per_day=10_000)}
    r = req(max_tokens=100)
    reserve = q.reserve_tokens(len(r.body), 100)

    async def main() -> None:
        ticket = await client.admit(k, projects, ROUTE, r)
        assert ticket is not None
        (budget, taken), = ticket.takes
        assert taken == reserve and budget.reserved == reserve
        lease = budget.lease
        client.settle(ticket, 42, 0)
        assert budget.reserved == 0 and budget.lease == lease - 42  # the rest of the reservation is back
        await client.stop()  # tells the ledger and gives back what is held

    run(main())
    assert ledger.charged("project:team-a", "tokens_per_day") == 42
    assert ledger.held("project:team-a", "tokens_per_day") == 0


def test_a_request_the_tokens_left_cannot_cover_is_refused_naming_the_project() -> None:
    ledger = SimLedger({("project:team-a", "tokens_per_day"): 300})
    client = quota.QuotaClient("r1", ledger.sync)
    projects = {"team-a": q.Limits(tokens_per_day=300)}
    with pytest.raises(quota.BudgetRefused) as refused:
        run(client.admit(KeyInfo(id="k1", project="team-a"), projects, ROUTE, req(max_tokens=1000)))
    assert "project team-a's tokens_per_day" in refused.value.message
    assert "limit 300" in refused.value.message and "max_tokens" in refused.value.message
    assert dict(refused.value.headers())[b"x-ratelimit-limit-tokens"] == b"300"


def test_spend_reserves_at_the_output_price_and_settles_the_real_cost() -> None:
    ledger = SimLedger({("key:k1", "spend_per_month"): 5_000_000})
    client = quota.QuotaClient("r1", ledger.sync)
    k = key(spend_per_month=5.0)
    r = req(max_tokens=10)

    async def main() -> None:
        ticket = await client.admit(k, {}, PRICED, r)
        assert ticket is not None
        assert ticket.takes[0][1] == q.reserve_tokens(len(r.body), 10) * 2
        assert await client.admit(k, {}, ROUTE, r) is not None  # no price: spend takes nothing
        client.settle(ticket, 0, PRICED.prices.spend_micros(30, 0, 5))  # type: ignore[union-attr]
        await client.stop()

    run(main())
    assert ledger.charged("key:k1", "spend_per_month") == 40


def test_concurrency_slots_come_back_when_requests_end() -> None:
    ledger = SimLedger({("key:k1", "concurrent_requests"): 2})
    client = quota.QuotaClient("r1", ledger.sync)
    k = key(concurrent_requests=2)

    async def main() -> None:
        t1 = await client.admit(k, {}, ROUTE, req())
        t2 = await client.admit(k, {}, ROUTE, req())
        with pytest.raises(quota.BudgetRefused) as refused:
            await client.admit(k, {}, ROUTE, req())
        assert refused.value.code == "rate_limit_exceeded" and refused.value.retry_after_s == 1
        assert t1 is not None and t2 is not None
        client.settle(t1, 5, 0)
        assert await client.admit(k, {}, ROUTE, req()) is not None
        await client.stop()

    run(main())
    assert ledger.charged("key:k1", "concurrent_requests") == 0


def test_rpm_and_tpm_are_cluster_budgets_per_minute() -> None:
    ledger = SimLedger({("key:k1", "requests_per_minute"): 3})
    client = quota.QuotaClient("r1", ledger.sync)
    k = KeyInfo(id="k1", project="team-a", rpm=3)

    async def main() -> None:
        for _ in range(3):
            assert await client.admit(k, {}, ROUTE, req()) is not None
        with pytest.raises(quota.BudgetRefused) as refused:
            await client.admit(k, {}, ROUTE, req())
        assert refused.value.code == "rate_limit_exceeded" and 1 <= refused.value.retry_after_s <= 60
        await client.stop()

    run(main())


def test_unreachable_budget_service_fails_closed_on_an_empty_lease_only() -> None:
    ledger = SimLedger({("key:k1", "requests_per_day"): 100})
    client = quota.QuotaClient("r1", ledger.sync)
    k = key(requests_per_day=100)

    async def main() -> None:
        budget = client.plan(k, {})[0]
        while budget.avail <= 0:  # slices grow with use: a lease is held once a few requests came
            assert await client.admit(k, {}, ROUTE, req()) is not None
        ledger.fail = True
        held = budget.avail
        assert held > 0
        for _ in range(held):  # out of what is held: admitted with the control plane down
            assert await client.admit(k, {}, ROUTE, req()) is not None
        with pytest.raises(quota.BudgetRefused) as refused:
            await client.admit(k, {}, ROUTE, req())
        assert "unreachable" in refused.value.message and refused.value.status == 429

    run(main())


def test_a_removed_limit_admits_freely() -> None:
    ledger = SimLedger({})  # the control plane says limit 0: the budget is no longer in force
    client = quota.QuotaClient("r1", ledger.sync)
    k = key(requests_per_day=1)

    async def main() -> None:
        for _ in range(5):
            assert await client.admit(k, {}, ROUTE, req()) is not None

    run(main())


def test_headers_show_the_tightest_budget_and_openai_durations() -> None:
    ledger = SimLedger({("key:k1", "requests_per_day"): 1000, ("project:team-a", "requests_per_day"): 50,
                        ("key:k1", "tokens_per_minute"): 5000})
    client = quota.QuotaClient("r1", ledger.sync)
    k = key(requests_per_day=1000, tokens_per_minute=5000)
    projects = {"team-a": q.Limits(requests_per_day=50)}

    async def main() -> dict[bytes, bytes]:
        ticket = await client.admit(k, projects, ROUTE, req(max_tokens=10))
        assert ticket is not None
        return dict(client.headers(ticket.plan))

    headers = run(main())
    assert headers[b"x-ratelimit-limit-requests"] == b"50"
    assert 0 < int(headers[b"x-ratelimit-remaining-requests"]) <= 50
    assert headers[b"x-ratelimit-limit-tokens"] == b"5000"
    assert headers[b"x-ratelimit-reset-tokens"].endswith(b"s")
    assert quota.duration(90) == "1m30s" and quota.duration(0.02) == "20ms" and quota.duration(3600) == "1h0m0s"


def test_a_request_waits_for_reservations_in_flight_to_settle_instead_of_being_refused() -> None:
    # 1,000 tokens a day; each request reserves its prompt estimate + 100 and uses 20. Taken all at once, the
    # reservations fill the budget; those that arrive then are served as the first ones settle, not refused.
    ledger = SimLedger({("key:k1", "tokens_per_day"): 1000})
    client = quota.QuotaClient("r1", ledger.sync, settle_wait_s=2.0)
    k = key(tokens_per_day=1000)
    r = req(max_tokens=100)

    async def one() -> int:
        try:
            ticket = await client.admit(k, {}, ROUTE, r)
        except quota.BudgetRefused:
            return 0
        assert ticket is not None
        await asyncio.sleep(0.01)
        client.settle(ticket, 20, 0)
        return 20

    async def main() -> list[int]:
        got = await asyncio.gather(*(one() for _ in range(80)))
        await client.stop()
        return got

    served = run(main())
    # Without waiting, at most 1000 // reservation (< 10) would be served; each settlement frees room for more.
    assert sum(1 for s in served if s) >= 40, served
    # The bound holds: never more charged than the limit (every request used less than it reserved).
    assert ledger.charged("key:k1", "tokens_per_day") == sum(served) <= 1000
    assert ledger.held("key:k1", "tokens_per_day") == 0


def test_a_request_nothing_in_flight_could_make_room_for_is_refused_at_once() -> None:
    ledger = SimLedger({("key:k1", "tokens_per_day"): 1000})
    client = quota.QuotaClient("r1", ledger.sync, settle_wait_s=30.0)
    k = key(tokens_per_day=1000)

    async def main() -> float:
        held = await client.admit(k, {}, ROUTE, req(max_tokens=100))
        assert held is not None
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(quota.BudgetRefused):  # more than the whole budget: no settlement can cover it
            await client.admit(k, {}, ROUTE, req(max_tokens=5000))
        return loop.time() - start

    assert run(main()) < 5.0


@pytest.mark.parametrize(("status", "content_type", "stream"), [(200, "application/json", False),
                                                                (500, "application/json", False),
                                                                (200, "text/event-stream", True)])
def test_every_answer_start_carries_the_ratelimit_headers(status: int, content_type: str, stream: bool) -> None:
    # A whole answer carries them on its start (relay.whole), an engine's error too, a stream through
    # quota.with_headers: the same headers each way.
    import hashlib

    from llmgw.router import app as app_mod
    from llmgw.router import table as table_mod
    from llmgw.router.asgi import CANCELS

    secret = "sk-headers"
    usage = b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}'
    answer = (b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}],' + usage + b'}\n\ndata: [DONE]\n\n'
              if stream else b'{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],' + usage + b'}'
              if status == 200 else b'{"error":{"message":"boom"}}')

    class Canned:
        headers = {"Content-Type": content_type}

        def __init__(self) -> None:
            self.status = status

        async def read(self) -> bytes:
            return answer

        @property
        def content(self) -> Canned:
            return self

        async def readany(self) -> bytes:
            return answer

        def ended(self) -> bool:
            return True

        def body_started(self) -> None:
            pass

        def close(self) -> None:
            pass

    class Upstream:
        async def open(self, route: Any, path: str, body: bytes, **_: Any) -> tuple[Any, Canned]:
            return route.endpoints[0], Canned()

    doc = {"version": 1, "models": [{"name": "m", "served_name": "m", "state": "Ready", "routing": "round_robin",
                                     "endpoints": [{"replica_id": "r1", "url": "http://127.0.0.1:9", "node": "n"}]}],
           "auth": {"required": True, "keys": [{"id": "k1", "sha256": hashlib.sha256(secret.encode()).hexdigest(),
                                                "project": "team-a", "limits": {"requests_per_day": 1000}}],
                    "projects": [{"name": "team-a"}]}}
    ledger = SimLedger({("key:k1", "requests_per_day"): 1000})
    body = json.dumps({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}).encode()
    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST",
             "headers": [(b"authorization", b"Bearer " + secret.encode())], "extensions": {CANCELS: {}}}
    starts: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            starts.append(message)

    async def main() -> None:
        holder = table_mod.TableHolder()
        holder.swap(table_mod.RouteTable.from_doc(doc))
        app = app_mod.RouterApp(holder, quota=ledger.sync, usage=ledger.ingest, router_id="r")
        app._proxy.forwarder = Upstream()  # type: ignore[assignment]
        await app(dict(scope), receive, send)
        assert app.quota is not None
        await app.quota.stop()

    run(main())
    (start,) = starts
    headers = dict(start["headers"])
    assert start["status"] == status
    assert headers[b"x-ratelimit-limit-requests"] == b"1000"
    assert int(headers[b"x-ratelimit-remaining-requests"]) < 1000
    assert b"x-ratelimit-reset-requests" in headers
