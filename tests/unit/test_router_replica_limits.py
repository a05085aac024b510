"""Per-replica concurrency limits: the spec field, the table's caps, and the pick skipping full replicas."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.core import specs
from llmgw.core.errors import SpecError
from llmgw.router import pick
from llmgw.router.table import RouteTable


def _manifest(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"}, "spec": {"engine": "sim", **spec}}


def _doc(*models: dict[str, Any]) -> dict[str, Any]:
    return {"version": 3, "models": list(models)}


def _model(name: str, n_endpoints: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "endpoints": [{"replica_id": f"{name}-{i}", "url": f"http://127.0.0.1:{9000 + i}"}
                                        for i in range(n_endpoints)], **extra}


def test_spec_field_round_trips_and_stays_out_of_the_fingerprint() -> None:
    """max_concurrency_per_replica parses, survives to_manifest, and changing it restarts no engine."""
    limited = specs.parse_manifest(_manifest(max_concurrency_per_replica=4))
    assert limited.spec.max_concurrency_per_replica == 4
    assert specs.parse_manifest(limited.to_manifest()) == limited
    plain = specs.parse_manifest(_manifest())
    assert plain.spec.max_concurrency_per_replica == 0
    assert plain.spec.fingerprint() == limited.spec.fingerprint()


@pytest.mark.parametrize("bad", [-1, "4", True, 2.5])
def test_spec_field_refuses_what_is_not_a_count(bad: object) -> None:
    """A negative, textual, boolean or fractional limit is refused, naming the field."""
    with pytest.raises(SpecError) as info:
        specs.parse_manifest(_manifest(max_concurrency_per_replica=bad))
    assert info.value.field == "spec.max_concurrency_per_replica"


def test_table_caps_admission_at_limit_times_endpoints() -> None:
    """A model's admission limit is its per-replica limit times its endpoints, or its own limit if lower."""
    table = RouteTable.from_doc(_doc(
        _model("a", 3, limits={"concurrency_per_replica": 2}),
        _model("b", 3, limits={"concurrency_per_replica": 2, "concurrency": 4}),
        _model("c", 2, limits={"concurrency": 5}),
        _model("d", 0, limits={"concurrency_per_replica": 2}),
        _model("e", 2)))
    assert table.limits == {"a": 6, "b": 4, "c": 5}
    assert table.lookup("a").replica_limit == 2  # type: ignore[union-attr]
    # No endpoints, no cap: its requests get the immediate 503, not a wait for a slot that cannot come.
    assert "d" not in table.limits
    assert table.lookup("e").replica_limit == 0  # type: ignore[union-attr]


def test_malformed_replica_limit_is_ignored_not_fatal() -> None:
    """A bad per-replica limit is not applied, and the rest of the table still loads."""
    table = RouteTable.from_doc(_doc(_model("a", 2, limits={"concurrency_per_replica": "lots"}), _model("b", 1)))
    assert table.lookup("a").replica_limit == 0  # type: ignore[union-attr]
    assert [m.name for m in table.models] == ["a", "b"]


def test_at_limit_names_only_full_replicas() -> None:
    """Replicas with limit or more in flight are full; no limit or nothing in flight: none is."""
    ids = ["r1", "r2", "r3"]
    assert pick.at_limit(ids, {"r1": 2, "r2": 1, "r3": 3}, 2) == {"r1", "r3"}
    assert pick.at_limit(ids, {"r1": 5}, 0) == set()
    assert pick.at_limit(ids, {}, 1) == set()


@pytest.mark.parametrize("policy", [pick.RoundRobin(), pick.LeastOutstanding(), pick.SessionAffinity()])
def test_policies_never_pick_a_full_replica(policy: pick.Policy) -> None:
    """With the full replicas excluded, every policy picks among the others, and None when all are full."""
    table = RouteTable.from_doc(_doc(_model("a", 3, limits={"concurrency_per_replica": 1})))
    route = table.lookup("a")
    assert route is not None
    in_flight = {"a-0": 1, "a-2": 1}
    full = pick.at_limit([e.replica_id for e in route.endpoints], in_flight, route.replica_limit)
    key = pick.RequestKey(session="s1")
    for _ in range(5):
        chosen = policy.pick("a", route.endpoints, load=dict(in_flight), key=key, exclude=full)
        assert chosen is not None and chosen.replica_id == "a-1"
    everyone = full | {"a-1"}
    assert policy.pick("a", route.endpoints, load={}, key=key, exclude=everyone) is None
