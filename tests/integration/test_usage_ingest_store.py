"""Usage rollups and the quota ledger on real SQLite and a real PostgreSQL: exact, once, under concurrency.

Two control planes are two ``Store`` objects on one database, each applying or syncing from its own
threads, as two servers' store threads would.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from llmgw.api.usage import QuotaItem, UsageBatch, UsageRecord
from llmgw.control.store import store as store_mod
from llmgw.control.store.store import Store
from llmgw.control.store.usagetables import UsageRequestRow, UsageRollupRow
from llmgw.control.usage import prune as usageprune
from llmgw.control.usage.config import UsageConfig
from llmgw.core import quota
from llmgw.testing.postgres import Postgres

NOW = 1_796_000_000.0  # a fixed instant: periods do not roll over under the test
_names = itertools.count(1)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return store_mod.sqlite_url(tmp_path)
    server: Postgres = request.getfixturevalue("pg")
    return server.create_database(f"u{next(_names)}")


@pytest.fixture
def opened(url: str) -> Iterator[Callable[[], Store]]:
    stores: list[Store] = []

    def open_() -> Store:
        stores.append(Store.open_url(url))
        return stores[-1]

    yield open_
    for s in stores:
        s.close()


def records(n: int, *, first: int = 1, seed: int = 0) -> list[UsageRecord]:
    rnd = random.Random(seed)
    return [UsageRecord(seq=first + i, at=NOW + rnd.uniform(-7200, 7200), project=rnd.choice(["a", "b"]),
                        key=rnd.choice(["k1", "k2", ""]), model=rnd.choice(["m1", "m2"]), node="n1",
                        prompt_tokens=rnd.randint(1, 500), cached_tokens=rnd.randint(0, 1),
                        completion_tokens=rnd.randint(0, 300), spend_micros=rnd.randint(0, 9999),
                        status=rnd.choice([200, 200, 200, 429, 499]), ttft_ms=rnd.choice([0.0, 12.0, 300.0, 4e4]),
                        duration_ms=rnd.uniform(1, 900))
            for i in range(n)]


def totals(store: Store, grain: str) -> tuple[int, ...]:
    with store.engine.connect() as c:
        row = c.execute(sa.select(sa.func.sum(UsageRollupRow.requests), sa.func.sum(UsageRollupRow.errors),
                                  sa.func.sum(UsageRollupRow.prompt_tokens), sa.func.sum(UsageRollupRow.cached_tokens),
                                  sa.func.sum(UsageRollupRow.completion_tokens),
                                  sa.func.sum(UsageRollupRow.spend_micros), sa.func.sum(UsageRollupRow.ttft_count))
                        .where(UsageRollupRow.grain == grain)).one()
        hists = c.execute(sa.select(UsageRollupRow.ttft_hist).where(UsageRollupRow.grain == grain)).scalars().all()
    return (*(int(v or 0) for v in row), sum(sum(h) for h in hists))


def expected(recs: list[UsageRecord]) -> tuple[int, ...]:
    ttft = sum(1 for r in recs if r.ttft_ms > 0)
    return (len(recs), sum(r.status >= 400 for r in recs), sum(r.prompt_tokens for r in recs),
            sum(r.cached_tokens for r in recs), sum(r.completion_tokens for r in recs),
            sum(r.spend_micros for r in recs), ttft, ttft)


def test_a_batch_sent_twice_and_overlapping_replays_count_once(opened: Callable[[], Store]) -> None:
    store = opened()
    recs = records(300)
    batch = UsageBatch("r1", "j1", tuple(recs[:200]))
    assert store.apply_usage(batch, now=NOW, request_log=True) == 200
    assert store.apply_usage(batch, now=NOW, request_log=True) == 200  # a retry: nothing more
    # A replay after a restart: 150..300, overlapping what is stored.
    assert store.apply_usage(UsageBatch("r1", "j1", tuple(recs[149:])), now=NOW, request_log=True) == 300
    assert store.apply_usage(UsageBatch("r1", "j1", ()), now=NOW) == 300
    for grain in "mhd":
        assert totals(store, grain) == expected(recs), grain
    with store.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(UsageRequestRow)).scalar() == 300
    assert store.usage_mark("j1") == 300


@pytest.mark.parametrize("per_batch", [50, 400])
def test_journals_applied_at_once_by_two_control_planes_sum_exactly(opened: Callable[[], Store],
                                                                   per_batch: int) -> None:
    """8 journals, each a thread, alternating between two Store objects, each batch sent twice (batches of
    400 records spread over 4 hours are several chunks of rollup rows each)."""
    stores = [opened(), opened()]
    journals = {f"j{j}": records(400, seed=j) for j in range(8)}
    errors: list[BaseException] = []

    def send(j: int, name: str, recs: list[UsageRecord]) -> None:
        try:
            for start in range(0, len(recs), per_batch):
                batch = UsageBatch(f"router{j % 2}", name, tuple(recs[start:start + per_batch]))
                for s in (stores[j % 2], stores[(j + 1) % 2]):  # the retry lands on the other control plane
                    s.apply_usage(batch, now=NOW)
        except BaseException as e:  # noqa: BLE001  (the assertion below says what)
            errors.append(e)

    threads = [threading.Thread(target=send, args=(j, name, recs)) for j, (name, recs) in enumerate(journals.items())]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    every = [r for recs in journals.values() for r in recs]
    for grain in "mhd":
        assert totals(stores[0], grain) == expected(every), grain


def test_prune_drops_each_grain_past_its_retention(opened: Callable[[], Store]) -> None:
    store = opened()
    store.apply_usage(UsageBatch("r1", "j1", tuple(records(50))), now=NOW, request_log=True)
    cfg = UsageConfig(request_log_retention_s=86400.0)
    usageprune.prune(store, cfg, now=NOW + 3600)  # nothing is old enough yet
    assert totals(store, "m")[0] == 50
    usageprune.prune(store, cfg, now=NOW + 3 * 86400)  # the leader's pass, with the defaults
    assert totals(store, "m")[0] == 0
    assert totals(store, "h")[0] == totals(store, "d")[0] == 50
    with store.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(UsageRequestRow)).scalar() == 0


# -- the quota ledger ------------------------------------------------------------------------------------
def budget(kind: str = "requests_per_day", scope: str = "key:k1") -> str:
    return quota.budget_id(scope, kind, quota.period(kind, NOW).id)


def test_routers_syncing_at_once_never_hold_more_than_the_limit(opened: Callable[[], Store]) -> None:
    """Six routers on two control planes take units one sync at a time until none is free: each unit
    taken is consumed at the next sync, so everything granted ends up charged, and no more than the limit."""
    stores = [opened(), opened()]
    b, limit = budget(), 1000
    granted_total = [0] * 6
    errors: list[BaseException] = []

    def router(n: int) -> None:
        try:
            held = 0
            store = stores[n % 2]
            while True:
                got = store.quota_sync(f"r{n}", [QuotaItem(b, consumed=held, want=40)], lambda *_: limit,
                                       now=NOW).grants[0]
                granted_total[n] += got.granted
                assert got.charged + got.held <= limit
                held = got.held
                if got.granted == 0 and got.free == 0:
                    store.quota_sync(f"r{n}", [QuotaItem(b, consumed=held)], lambda *_: limit, now=NOW)
                    return
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=router, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(granted_total) == limit
    got = stores[0].quota_ledger(b)
    assert got is not None and got[1] == limit and sum(got[2].values()) == 0


def test_a_dead_routers_lease_is_charged_when_it_expires(opened: Callable[[], Store]) -> None:
    store = opened()
    b = budget("tokens_per_day")
    dead = store.quota_sync("dead", [QuotaItem(b, want=300)], lambda *_: 1000, now=NOW).grants[0]
    assert dead.granted == 300  # what it asked: within half of what is free
    live = store.quota_sync("live", [QuotaItem(b, want=1000)], lambda *_: 1000, now=NOW + 1).grants[0]
    assert live.granted == 175 and live.free == 1000 - 300 - 175  # (1000 - 300) // (2 routers * 2)
    later = store.quota_sync("live", [QuotaItem(b, want=0)], lambda *_: 1000,
                             now=NOW + quota.LEASE_TTL_S + 5).grants[0]
    assert later.charged == 300 and later.held == 175
    assert store.quota_ledger(b) == (1000, 300, {"live": 175})


def test_returned_units_are_granted_again_and_consumed_beyond_held_is_charged(opened: Callable[[], Store]) -> None:
    store = opened()
    b = budget("requests_per_minute")
    first = store.quota_sync("r1", [QuotaItem(b, want=10)], lambda *_: 20, now=NOW).grants[0]
    assert first.granted == 10 and first.free == 10
    back = store.quota_sync("r1", [QuotaItem(b, consumed=3, returned=7)], lambda *_: 20, now=NOW).grants[0]
    assert (back.held, back.charged, back.free) == (0, 3, 17)
    other = store.quota_sync("r2", [QuotaItem(b, want=8)], lambda *_: 20, now=NOW).grants[0]
    assert other.granted == 8
    over = store.quota_sync("r2", [QuotaItem(b, consumed=12)], lambda *_: 20, now=NOW).grants[0]
    assert (over.charged, over.held) == (15, 0)


def test_a_limit_gone_answers_not_in_force_and_drops_the_lease(opened: Callable[[], Store]) -> None:
    store = opened()
    b = budget("tokens_per_month", "project:p")
    assert store.quota_sync("r1", [QuotaItem(b, want=50)], lambda *_: 1000, now=NOW).grants[0].held == 50
    gone = store.quota_sync("r1", [QuotaItem(b, want=50)], lambda *_: 0, now=NOW).grants[0]
    assert (gone.limit, gone.granted, gone.held) == (0, 0, 0)
    assert store.quota_ledger(b) == (1000, 0, {})


def test_concurrency_slots_are_held_and_given_back_never_charged(opened: Callable[[], Store]) -> None:
    store = opened()
    b = budget("concurrent_requests")
    got = store.quota_sync("r1", [QuotaItem(b, consumed=5, want=4)], lambda *_: 4, now=NOW).grants[0]
    assert (got.granted, got.charged) == (2, 0)  # consumed means nothing to slots; half of the 4 free
    back = store.quota_sync("r1", [QuotaItem(b, returned=2)], lambda *_: 4, now=NOW).grants[0]
    assert (back.held, back.charged, back.free) == (0, 0, 4)
    assert math.isinf(back.reset_at)


def test_thresholds_cross_once_each_per_period(opened: Callable[[], Store]) -> None:
    store = opened()
    b = budget("tokens_per_day")
    seen = []
    for consumed in (50, 30, 5, 20, 40):
        seen += [c.percent for c in store.quota_sync("r1", [QuotaItem(b, consumed=consumed)], lambda *_: 100,
                                                     now=NOW).crossings]
    assert seen == [80, 100]
    tomorrow = quota.budget_id("key:k1", "tokens_per_day", quota.period("tokens_per_day", NOW + 86400).id)
    again = store.quota_sync("r1", [QuotaItem(tomorrow, consumed=100)], lambda *_: 100, now=NOW + 86400).crossings
    assert [c.percent for c in again] == [80, 100]


def test_prune_quota_drops_ended_periods_and_their_leases(opened: Callable[[], Store]) -> None:
    store = opened()
    b = budget("requests_per_minute")
    store.quota_sync("r1", [QuotaItem(b, want=5)], lambda *_: 10, now=NOW)
    assert store.prune_quota(now=NOW + 60) == 0
    assert store.prune_quota(now=NOW + 60 + 86400 + 1) == 2
    assert store.quota_ledger(b) is None


def test_two_control_planes_tell_each_threshold_once(opened: Callable[[], Store]) -> None:
    """Routers consuming one budget through two stores at once: each threshold is crossed in one sync only,
    and its event is written once."""
    stores = [opened(), opened()]
    b = budget("tokens_per_day", "project:p")
    crossings: list[int] = []
    errors: list[BaseException] = []

    def router(n: int) -> None:
        try:
            for _ in range(25):
                got = stores[n % 2].quota_sync(f"r{n}", [QuotaItem(b, consumed=1)], lambda *_: 100, now=NOW)
                crossings.extend(c.percent for c in got.crossings)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=router, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(crossings) == [80, 100]
    assert [e.reason for e in stores[0].list_events(obj="project/p")] == ["BudgetThreshold"] * 2
    assert stores[0].quota_ledger(b) == (100, 150, {})
