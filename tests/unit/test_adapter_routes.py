"""Adapters on the routers' wire and in their table: round-tripped, read tolerantly, and each adapter a route of
its own on the endpoints that hold it (every endpoint of its base while none does), never taking a model's name."""

from __future__ import annotations

import dataclasses

from llmgw.api import routing
from llmgw.router.table import RouteTable

A = routing.EndpointDoc("r1", "http://127.0.0.1:1", adapters=("sql", "chat"))
B = routing.EndpointDoc("r2", "http://127.0.0.1:2", adapters=("chat",))
BASE = routing.ModelEntry(name="base", served_name="base-8b", endpoints=(A, B), adapters=("sql", "chat", "new"))


def table(*models: routing.ModelEntry) -> RouteTable:
    return RouteTable.from_doc(routing.EndpointsDoc(models=models).to_doc())


def test_adapters_round_trip_and_are_left_out_when_none() -> None:
    doc = routing.EndpointsDoc(models=(BASE,)).to_doc()
    assert doc["models"][0]["adapters"] == ["sql", "chat", "new"]
    assert doc["models"][0]["endpoints"][1]["adapters"] == ["chat"]
    assert routing.EndpointsDoc.from_doc(doc).models[0] == BASE
    plain = routing.EndpointsDoc(models=(routing.ModelEntry(name="m", endpoints=(routing.EndpointDoc("r", "http://h"),)),
                                         )).to_doc()
    assert "adapters" not in plain["models"][0] and "adapters" not in plain["models"][0]["endpoints"][0]


def test_malformed_adapters_are_read_as_none_not_refused() -> None:
    doc = routing.EndpointsDoc(models=(BASE,)).to_doc()
    doc["models"][0]["adapters"] = "sql"
    doc["models"][0]["endpoints"][0]["adapters"] = [1]
    entry = routing.EndpointsDoc.from_doc(doc).models[0]
    assert entry.adapters == () and entry.endpoints[0].adapters == ()


def test_each_adapter_routes_to_its_holders_under_its_own_name() -> None:
    t = table(BASE)
    sql, chat, new = t.lookup("sql"), t.lookup("chat"), t.lookup("new")
    assert sql is not None and chat is not None and new is not None
    assert (sql.name, sql.served_name, sql.parent) == ("sql", "sql", "base-8b")
    assert [e.replica_id for e in sql.endpoints] == ["r1"]
    assert [e.replica_id for e in chat.endpoints] == ["r1", "r2"]
    # Held nowhere yet, while its base's endpoints say what they hold: no endpoint, and held as a cold start
    # is (an engine that has not registered it answers 404), saying why.
    assert new.endpoints == () and new.cold and new.autoscale is not None
    assert "not loaded into any replica of base-8b yet" in new.message
    assert sql.autoscale is None and not chat.cold
    assert t.lookup("base-8b").parent == ""  # type: ignore[union-attr]
    assert t.public_names() == ["base-8b", "sql", "chat", "new"]


def test_a_models_name_wins_over_an_adapters() -> None:
    other = routing.ModelEntry(name="sql", endpoints=(routing.EndpointDoc("r9", "http://127.0.0.1:9"),))
    t = table(BASE, other)
    found = t.lookup("sql")
    assert found is not None and found.parent == "" and [e.replica_id for e in found.endpoints] == ["r9"]


def test_adapter_slots_round_trip_reach_each_adapter_route_and_a_bad_value_reads_as_unsaid() -> None:
    entry = dataclasses.replace(BASE, adapter_slots=2)
    doc = routing.EndpointsDoc(models=(entry,)).to_doc()
    assert doc["models"][0]["adapter_slots"] == 2
    assert "adapter_slots" not in routing.EndpointsDoc(models=(BASE,)).to_doc()["models"][0]
    assert routing.EndpointsDoc.from_doc(doc).models[0] == entry
    t = table(entry)
    assert [t.lookup(n).adapter_slots for n in ("sql", "chat", "new")] == [2, 2, 2]  # type: ignore[union-attr]
    for bad in (-1, "2", True, None):
        doc["models"][0]["adapter_slots"] = bad
        assert routing.EndpointsDoc.from_doc(doc).models[0].adapter_slots == 0


def test_without_any_endpoint_saying_what_it_holds_every_endpoint_of_the_base_serves_each_adapter() -> None:
    """A standby's table (it hears no agent): nothing to hold a request for, so every endpoint is used."""
    silent = dataclasses.replace(BASE, endpoints=tuple(dataclasses.replace(e, adapters=()) for e in (A, B)))
    new = table(silent).lookup("new")
    assert new is not None and [e.replica_id for e in new.endpoints] == ["r1", "r2"] and not new.cold
