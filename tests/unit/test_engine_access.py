"""Issue 33 on plain data: each node's engine_access and tunnel state (``control.engineaccess``), and what the routers'
table makes of it (``loop/table``): a tunnelled replica's URL names its node's tunnel; while the tunnel is down the
replica is out of the endpoints and listed unhealthy (its waiting requests go elsewhere), with why."""

from __future__ import annotations

from llmgw.api import routing, tunnel
from llmgw.control.engineaccess import EngineAccess
from llmgw.control.loop.table import _model_route
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.core import specs


def ready(rid: str, node: str, port: int) -> ReplicaRecord:
    return ReplicaRecord(id=rid, model="m", fingerprint="f", phase=Phase.READY, api_key="k", node_id=node,
                         shard_id=f"{rid}-1", endpoint=f"https://10.0.0.9:{port}")


def route(access: EngineAccess) -> routing.ModelEntry:
    spec = specs.ModelSpec(engine="sim", served_name="m", replicas=2)
    return _model_route(spec, "m", spec, [ready("a", "nat1", 8001), ready("b", "dc1", 8002)], 0.0, {}, {},
                        dict(access.routes()))


def test_a_tunnel_node_is_reached_through_its_tunnel_and_out_of_routing_while_it_is_down() -> None:
    kicks: list[int] = []
    access = EngineAccess(on_change=lambda: kicks.append(1))
    access.registered("nat1", "tunnel")
    access.registered("dc1", "direct")
    before = route(access)  # registered, its tunnel not dialled yet
    assert [e.replica_id for e in before.endpoints] == ["b"]
    assert before.unhealthy[0].replica_id == "a" and "not dialled" in before.unhealthy[0].reason
    access.tunnel("nat1", True, "")
    up = route(access)
    assert {e.replica_id: e.url for e in up.endpoints} == {"a": tunnel.url("nat1", 8001), "b": "https://10.0.0.9:8002"}
    assert tunnel.node_of("nat1.tunnel.invalid:8001") == ("nat1", 8001)
    assert not up.unhealthy
    access.tunnel("nat1", False, "nothing heard for 4s")
    down = route(access)
    assert [e.replica_id for e in down.endpoints] == ["b"]
    assert down.unhealthy == (routing.UnhealthyDoc("a", "the tunnel of node nat1 is down: nothing heard for 4s"),)
    assert len(kicks) == 4  # each change runs a pass, so the table follows at once
    assert access.describe("nat1") == ("tunnel", "engine_access tunnel (its agent's setting); its tunnel is down: "
                                                 "nothing heard for 4s")
    assert access.describe("dc1") == ("direct", "engine_access direct (its agent's setting)")


def test_auto_is_direct_until_a_router_cannot_reach_the_engines() -> None:
    access = EngineAccess()
    access.registered("n", "auto")
    assert access.describe("n")[0] == "direct" and not access.routes()
    access.reachable("n", "")
    assert access.describe("n") == ("direct", "engine_access auto: a router reached its engines at their address")
    access.reachable("n", "no connection to 10.0.0.9:8001 within 2s")
    access.tunnel("n", True, "")
    assert access.routes() == {"n": access.routes()["n"]} and access.routes()["n"].down == ""
    mode, why = access.describe("n")
    assert mode == "tunnel" and "could not reach its engines (no connection to 10.0.0.9:8001 within 2s)" in why
    access.registered("odd", "sideways")  # an agent's word we do not know: direct
    assert access.describe("odd")[0] == "direct"
