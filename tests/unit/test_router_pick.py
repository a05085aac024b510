"""Round-robin endpoint choice: fair across endpoints, per model, skipping endpoints already tried."""

from __future__ import annotations

import collections

from llmgw.router.pick import RoundRobin
from llmgw.router.table import Endpoint

EPS = tuple(Endpoint(f"r{i}", f"http://127.0.0.1:{9000 + i}") for i in range(3))


def test_round_robin_is_fair() -> None:
    """Over many picks each endpoint is chosen equally often, in table order."""
    rr = RoundRobin()
    picks = [rr.pick("m", EPS) for _ in range(300)]
    assert [p.replica_id for p in picks[:4] if p] == ["r0", "r1", "r2", "r0"]
    assert collections.Counter(p.replica_id for p in picks if p) == {"r0": 100, "r1": 100, "r2": 100}


def test_models_have_separate_cursors() -> None:
    """Traffic to one model does not move another model's cursor."""
    rr = RoundRobin()
    rr.pick("a", EPS)
    rr.pick("a", EPS)
    picked = rr.pick("b", EPS)
    assert picked is not None and picked.replica_id == "r0"


def test_exclude_skips_tried_endpoints() -> None:
    """A retry never lands on an endpoint the request already tried; None once all are tried."""
    rr = RoundRobin()
    tried: set[str] = set()
    order = []
    while (ep := rr.pick("m", EPS, exclude=tried)) is not None:
        tried.add(ep.replica_id)
        order.append(ep.replica_id)
    assert order == ["r0", "r1", "r2"]


def test_next_request_starts_after_the_one_that_served() -> None:
    """After a retry skipped r0 and r1 served, the next request goes to r2."""
    rr = RoundRobin()
    first = rr.pick("m", EPS)
    assert first is not None and first.replica_id == "r0"
    retry = rr.pick("m", EPS, exclude={"r0"})
    assert retry is not None and retry.replica_id == "r1"
    after = rr.pick("m", EPS)
    assert after is not None and after.replica_id == "r2"


def test_empty_and_shrinking_endpoint_lists() -> None:
    """No endpoints gives None; a cursor past a shrunken list wraps instead of failing."""
    rr = RoundRobin()
    assert rr.pick("m", ()) is None
    for _ in range(3):
        rr.pick("m", EPS)
    picked = rr.pick("m", EPS[:2])
    assert picked is not None and picked.replica_id in {"r0", "r1"}
