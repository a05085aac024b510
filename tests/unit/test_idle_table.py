"""spec.idle in the routers' table (loop/table.py, loop/sleeper.py): a sleeping replica leaves its model's
endpoints, and a model with spec.idle carries a hold hint so its requests are held, not refused."""

from __future__ import annotations

import json

from llmgw.control.loop import sleeper
from llmgw.control.loop.table import _model_route
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.core import idle, specs


def ready(rid: str) -> ReplicaRecord:
    return ReplicaRecord(id=rid, model="m", fingerprint="f", phase=Phase.READY, api_key="k", node_id="n1",
                         shard_id=f"{rid}-1", endpoint=f"http://127.0.0.1:1/{rid}")


def test_sleeping_replica_leaves_the_endpoints_and_the_model_is_held() -> None:
    spec = specs.ModelSpec(engine="sim", served_name="m", replicas=2, idle=idle.Idle(after_s=60))
    route = _model_route(spec, "m", spec, [ready("a"), ready("b")], 0.0, {}, {"a": 1})
    assert [e.replica_id for e in route.endpoints] == ["b"]
    assert route.autoscale is not None and route.autoscale.cold_start_timeout_s > 0
    asleep = _model_route(spec, "m", spec, [ready("a"), ready("b")], 0.0, {}, {"a": 1, "b": 2})
    assert asleep.endpoints == () and asleep.autoscale is not None


def test_model_without_idle_is_routed_as_before() -> None:
    spec = specs.ModelSpec(engine="sim", served_name="m")
    route = _model_route(spec, "m", spec, [ready("a")], 0.0, {}, {})
    assert [e.replica_id for e in route.endpoints] == ["a"] and route.autoscale is None


def test_sleeping_row_reads_tolerantly() -> None:
    assert sleeper.sleeping_from({sleeper.KEY: json.dumps({"a": 1, "b": 0, "c": "2", "d": True})}) == {"a": 1}
    assert sleeper.sleeping_from({sleeper.KEY: "not json"}) == {}
    assert sleeper.sleeping_from({sleeper.KEY: "[1]"}) == {}
    assert sleeper.sleeping_from({}) == {}
