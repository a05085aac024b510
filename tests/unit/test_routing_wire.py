"""The control plane <-> router wire (``llmgw.api.routing``): each document round-trips, the router's reading
ignores what it does not know, and the control plane's names the field it refuses."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from llmgw.api.routing import (
    AuthDoc,
    AutoscaleHint,
    BadReport,
    BadTable,
    Ejected,
    EndpointDoc,
    EndpointsDoc,
    KeyEntry,
    KeyUsed,
    LoadReport,
    ModelEntry,
    ModelLoad,
    Recovered,
    RouterReport,
    UnhealthyDoc,
)
from llmgw.control.loadreports import RouterSignals
from llmgw.control.routerreports import RouterEvents
from llmgw.core import autoscale
from llmgw.router.table import RouteTable, TableHolder
from llmgw.router.watch import LocalWatcher

BUCKETS = len(autoscale.TTFT_BUCKETS_MS) + 1

#: A table as ``Cluster.endpoints_doc`` builds it today, numbered as it is published: the wire format.
CONTROL_DOC: dict[str, Any] = {
    "version": 7,
    "models": [
        {"name": "qwen", "served_name": "qwen2.5", "aliases": ["q"], "routing": "round_robin", "engine": "vllm",
         "limits": {"concurrency_per_replica": 4}, "state": "Ready", "message": "2 of 2 replicas Ready",
         "endpoints": [{"replica_id": "qwen-1", "url": "http://10.0.0.1:8000", "api_key": "k1"},
                       {"replica_id": "qwen-2", "url": "https://10.0.0.2:8000", "api_key": ""}],
         "unhealthy": [{"replica_id": "qwen-3", "reason": "no answer to /health for 30s"}],
         "autoscale": {"min_replicas": 0, "max_replicas": 3, "cold_start_timeout_s": 90.0}},
        {"name": "tiny", "served_name": "tiny", "aliases": [], "routing": "prefix_cache", "engine": "llamacpp",
         "limits": {"concurrency_per_replica": 0}, "state": "Pending", "message": "waiting for a node",
         "endpoints": [], "unhealthy": []},
    ],
    "auth": {"required": True, "keys": [{"id": "key-a", "sha256": "ab" * 32, "models": ["qwen"], "rpm": 60,
                                         "tpm": 0, "priority": 2, "project": "default"}]},
}

ENDPOINTS = EndpointsDoc(
    version=3,
    models=(ModelEntry(name="m", served_name="m-served", aliases=("a", "b"), routing="least_outstanding",
                       engine="sglang", concurrency_per_replica=2, concurrency=5, state="Ready", message="ok",
                       endpoints=(EndpointDoc("m-1", "http://h:1", "secret"),),
                       unhealthy=(UnhealthyDoc("m-2", "hung"),), autoscale=AutoscaleHint(1, 4, 12.5), created=17,
                       embeddings=True),
            ModelEntry(name="chat-only", engine="llamacpp", embeddings=False), ModelEntry(name="bare")),
    auth=AuthDoc(required=True, keys=(KeyEntry("k", "cd" * 32, ("m",), rpm=1, tpm=2, priority=-1),)))

ROUTER_REPORT = RouterReport("r1", (
    Ejected(model="m", replica="m-1", for_s=2.5, failures=3, reason="HTTP 503", at=1000.0),
    Recovered(model="m", replica="m-1", at=1001.0),
    KeyUsed(key="key-a", at=1002.0)))

LOAD_REPORT = LoadReport(router="r1", interval_s=2.0, sent_at=1000.0, models=(
    ModelLoad(model="m", arrived=12, waiting=3, in_flight=5, held=1, ttft_counts=(0, 1) + (0,) * (BUCKETS - 2),
              tokens_out=345, last_request_at=999.5, replicas={"m-1": 2, "m-2": 3}),
    ModelLoad(model="quiet")), version="0.2.0", protocol=2)


def through_json(doc: dict[str, Any]) -> Any:
    return json.loads(json.dumps(doc))


# -- round trips --------------------------------------------------------------------------------------------
def test_each_document_round_trips_through_its_json() -> None:
    assert EndpointsDoc.from_doc(through_json(ENDPOINTS.to_doc())) == ENDPOINTS
    assert RouterReport.from_doc(through_json(ROUTER_REPORT.to_doc())) == ROUTER_REPORT
    assert LoadReport.from_doc(through_json(LOAD_REPORT.to_doc())) == LOAD_REPORT


def test_the_control_planes_table_reads_back_to_the_same_json() -> None:
    """The wire format is what it was: a table the control plane sends comes out of the dataclass unchanged."""
    assert EndpointsDoc.from_doc(copy.deepcopy(CONTROL_DOC)).to_doc() == CONTROL_DOC


def test_reports_keep_the_json_routers_sent() -> None:
    """The bodies routers POST are the ones they posted before the dataclasses."""
    assert ROUTER_REPORT.to_doc() == {"router": "r1", "events": [
        {"type": "ejected", "model": "m", "replica": "m-1", "for_s": 2.5, "failures": 3, "reason": "HTTP 503",
         "at": 1000.0},
        {"type": "recovered", "model": "m", "replica": "m-1", "at": 1001.0},
        {"type": "key_used", "key": "key-a", "at": 1002.0}]}
    first = LOAD_REPORT.to_doc()["models"][0]
    assert first["replicas"] == {"m-1": {"in_flight": 2}, "m-2": {"in_flight": 3}}
    # errors and tokens_in (issue 30, the UI's charts) are additions: a control plane before them ignores them
    # (it reads each field by name), and one after reads their absence from an older router as 0.
    assert list(first) == ["model", "arrived", "waiting", "in_flight", "held", "ttft_counts", "tokens_out",
                           "last_request_at", "errors", "tokens_in", "replicas"]


def test_the_router_reads_the_object_as_it_reads_its_json() -> None:
    """In process the router gets the object; over HTTP its JSON: the same table either way."""
    assert RouteTable.from_doc(ENDPOINTS) == RouteTable.from_doc(through_json(ENDPOINTS.to_doc()))
    table = RouteTable.from_doc(EndpointsDoc.from_doc(CONTROL_DOC))
    qwen = table.lookup("q")
    assert qwen is not None and qwen.served_name == "qwen2.5" and qwen.replica_limit == 4
    assert table.limits == {"qwen": 8} and table.unhealthy() == {"qwen-3": "no answer to /health for 30s"}
    assert table.auth.required and table.auth.by_hash["ab" * 32].rpm == 60


def test_a_published_table_is_numbered_and_compared_without_its_version() -> None:
    built = EndpointsDoc.from_doc(CONTROL_DOC).with_version(0)
    assert built.with_version(8).version == 8 and built.same_routes(built.with_version(8))
    no_keys = EndpointsDoc(version=0, models=built.models)
    assert not built.same_routes(no_keys)


# -- a newer control plane, an older router ------------------------------------------------------------------
def test_the_router_ignores_fields_it_does_not_know() -> None:
    newer = copy.deepcopy(CONTROL_DOC)
    newer["tenants"] = [{"name": "t"}]
    newer["models"][0]["lora"] = {"adapters": ["x"]}
    newer["models"][0]["endpoints"][0]["zone"] = "eu-1"
    newer["models"][0]["limits"]["tokens_per_minute"] = 9
    newer["models"][0]["autoscale"]["target_ttft_ms"] = 500
    newer["models"][0]["unhealthy"][0]["since"] = 12.0
    newer["auth"]["keys"][0]["tenant"] = "t"
    newer["auth"]["mode"] = "oidc"
    assert EndpointsDoc.from_doc(newer) == EndpointsDoc.from_doc(CONTROL_DOC)


def test_the_router_refuses_only_what_it_cannot_route_and_names_it() -> None:
    bad = copy.deepcopy(CONTROL_DOC)
    bad["models"][0]["endpoints"][1]["url"] = "ftp://x"
    with pytest.raises(BadTable, match=r"models\[0\]\.endpoints\[1\]\.url"):
        EndpointsDoc.from_doc(bad)
    odd = copy.deepcopy(CONTROL_DOC)
    odd["models"][0]["routing"] = "fastest-please"  # a policy of a newer control plane: the router's to default
    odd["models"][0]["limits"] = {"concurrency_per_replica": "many"}
    odd["auth"]["keys"].append({"id": "no-hash"})
    read = EndpointsDoc.from_doc(odd)
    assert read.models[0].routing == "fastest-please" and read.models[0].concurrency_per_replica == 0
    assert [k.id for k in read.auth.keys] == ["key-a"]
    odd["models"][0]["embeddings"] = "yes"  # not a boolean: not known, so the engine is asked and answers itself
    assert EndpointsDoc.from_doc(odd).models[0].embeddings is None
    assert "embeddings" not in EndpointsDoc.from_doc(CONTROL_DOC).models[0].to_doc()  # unknown: not sent


# -- the control plane is strict -----------------------------------------------------------------------------
@pytest.mark.parametrize(("doc", "field"), [
    ({"router": "r1", "events": [{"type": "ejected", "model": "m", "replica": "m-1"}, {"type": "drained"}]},
     "events[1].type"),
    ({"router": "r1", "events": [{"type": "recovered", "model": "m"}]}, "events[0].replica"),
    ({"router": "r1", "events": [{"type": "ejected", "model": "m", "replica": "r", "for_s": -1}]},
     "events[0].for_s"),
    ({"router": "", "events": []}, "router"),
])
def test_a_bad_router_report_is_refused_with_the_field_named(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(BadReport) as e:
        RouterReport.from_doc(doc)
    assert str(e.value).startswith(field + ":")


@pytest.mark.parametrize(("doc", "field"), [
    ({"router": "r1", "models": [{"model": "m", "waiting": "3"}]}, "models[0].waiting"),
    ({"router": "r1", "models": [{"model": "m", "ttft_counts": [1, 2]}]}, "models[0].ttft_counts"),
    ({"router": "r1", "models": [{"model": "m"}, {"model": "m"}]}, "models[1].model"),
    ({"router": "r1", "interval_s": 0, "models": []}, "interval_s"),
    ({"router": "r1"}, "models"),
    ({"router": "r1", "models": [], "version": 2}, "version"),
    ({"router": "r1", "models": [], "protocol": "2"}, "protocol"),
])
def test_a_bad_load_report_is_refused_with_the_field_named(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(BadReport) as e:
        LoadReport.from_doc(doc)
    assert str(e.value).startswith(field + ":")


def test_reports_from_a_newer_router_are_read_without_what_it_added() -> None:
    """Unknown fields are not refused (a newer router still reports); an unknown event type is."""
    doc = ROUTER_REPORT.to_doc()
    doc["zone"] = "eu-1"
    doc["events"][0]["trace_id"] = "abc"
    assert RouterReport.from_doc(doc) == ROUTER_REPORT
    load = LOAD_REPORT.to_doc()
    load["models"][0]["queued_tokens"] = 5
    assert LoadReport.from_doc(load) == LOAD_REPORT


def test_a_load_report_says_the_routers_version_and_the_control_plane_lists_it() -> None:
    """A router's version and protocol ride on its load reports (``llmgw version`` lists them); a router before 0.2.0
    says neither and is listed so, its version unknown."""
    signals = RouterSignals(clock=lambda: 1000.0)
    signals.record(LOAD_REPORT.to_doc())
    signals.record({"router": "r0", "models": []})  # 0.1.0's report: no version, no protocol
    assert [(r.id, r.version, r.protocol) for r in signals.seen()] == [("r0", "", 0), ("r1", "0.2.0", 2)]


# -- in process: objects, no JSON ----------------------------------------------------------------------------
def test_the_control_plane_takes_the_objects_as_it_takes_their_json() -> None:
    by_object, by_json = RouterEvents(clock=lambda: 1000.0), RouterEvents(clock=lambda: 1000.0)
    assert by_object.record(ROUTER_REPORT) == by_json.record(ROUTER_REPORT.to_doc()) == 3
    assert by_object.current() == by_json.current() == {}  # ejected, then recovered
    signals_object, signals_json = RouterSignals(clock=lambda: 1000.0), RouterSignals(clock=lambda: 1000.0)
    assert signals_object.record(LOAD_REPORT) == signals_json.record(LOAD_REPORT.to_doc()) == 2
    assert signals_object.signals("m", 1000.0) == signals_json.signals("m", 1000.0)
    assert signals_object.load() == signals_json.load() == {"m-1": 2.0, "m-2": 3.0}


def test_a_router_in_process_follows_the_published_objects() -> None:
    """``LocalWatcher`` long-polls a call answering ``EndpointsDoc``s; a bad table keeps the last one."""
    tables: list[Any] = [ENDPOINTS.with_version(1), "not a table", ENDPOINTS.with_version(2)]
    asked: list[int] = []

    async def wait(*, after: int, timeout: float) -> Any:
        asked.append(after)
        if not tables:
            await asyncio.sleep(timeout)
            return ENDPOINTS.with_version(2)
        return tables.pop(0)

    async def run() -> list[int]:
        holder = TableHolder()
        seen: list[int] = []
        holder.listen(lambda table: seen.append(table.version))
        watcher = LocalWatcher(wait, holder, poll_timeout_s=30, retry_s=0.01)
        await watcher.start()
        try:
            assert await watcher.wait_loaded(5)
            for _ in range(500):
                if holder.current.version == 2:
                    break
                await asyncio.sleep(0.01)
        finally:
            await watcher.stop()
        return seen

    assert asyncio.run(run()) == [1, 2]
    assert asked[:3] == [-1, 1, 1]
