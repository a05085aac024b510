"""The route table: parsing the control plane's endpoints document, and finding a model by any name."""

from __future__ import annotations

import re

import pytest

from llmgw.router.table import NOT_LOADED, Endpoint, RouteTable, TableError, TableHolder

DOC = {
    "version": 7,
    "models": [
        {"name": "smollm2-135m", "served_name": "smollm2-135m", "aliases": [],
         "state": "Ready", "message": "1 of 1 replicas Ready",
         "endpoints": [{"replica_id": "r-1a2b", "url": "http://127.0.0.1:41234", "api_key": "secret"}]},
        {"name": "qwen", "served_name": "qwen2.5-0.5b-instruct", "aliases": ["small", "gpt-4o-mini"],
         "state": "Starting", "message": "0 of 1 replicas Ready: replica r-9 Starting on node n1 for 12s",
         "endpoints": []},
    ],
}


def test_parses_models_and_endpoints() -> None:
    """Every model and endpoint in the document is in the table, fields intact."""
    table = RouteTable.from_doc(DOC)
    assert table.version == 7 and table.loaded
    smol = table.lookup("smollm2-135m")
    assert smol is not None
    assert smol.endpoints == (Endpoint("r-1a2b", "http://127.0.0.1:41234", "secret"),)
    assert smol.state == "Ready" and smol.message == "1 of 1 replicas Ready"
    assert table.endpoint_count() == 1


@pytest.mark.parametrize("name", ["qwen", "qwen2.5-0.5b-instruct", "small", "gpt-4o-mini"])
def test_lookup_by_name_served_name_or_alias(name: str) -> None:
    """A model is found by its llmgw name, its served name and each alias."""
    route = RouteTable.from_doc(DOC).lookup(name)
    assert route is not None and route.name == "qwen"


def test_unknown_name_is_none() -> None:
    """A name no model claims finds nothing."""
    assert RouteTable.from_doc(DOC).lookup("gpt-5") is None


def test_public_names_are_served_names_and_aliases() -> None:
    """/v1/models lists served names and aliases, each once, in table order."""
    assert RouteTable.from_doc(DOC).public_names() == ["smollm2-135m", "qwen2.5-0.5b-instruct", "small",
                                                       "gpt-4o-mini"]


def test_alias_does_not_steal_another_models_name() -> None:
    """An alias equal to another model's name loses to that name, whatever the order."""
    doc = {"version": 1, "models": [
        {"name": "a", "served_name": "a", "aliases": ["b"], "endpoints": []},
        {"name": "b", "served_name": "b", "endpoints": []},
    ]}
    route = RouteTable.from_doc(doc).lookup("b")
    assert route is not None and route.name == "b"


def test_defaults_for_missing_or_null_fields() -> None:
    """served_name defaults to name; null api_key, aliases and endpoints mean none."""
    doc = {"version": 2, "models": [{"name": "m", "served_name": None, "aliases": None,
                                     "endpoints": [{"replica_id": "r", "url": "http://h:1/", "api_key": None}]}]}
    route = RouteTable.from_doc(doc).lookup("m")
    assert route is not None and route.served_name == "m" and route.aliases == ()
    assert route.endpoints == (Endpoint("r", "http://h:1", ""),)  # trailing slash dropped


@pytest.mark.parametrize(("doc", "where"), [
    ([], "expected an object"),
    ({"models": []}, "version"),
    ({"version": True, "models": []}, "version"),
    ({"version": 1, "models": {}}, "models"),
    ({"version": 1, "models": [{"served_name": "x"}]}, "models[0].name"),
    ({"version": 1, "models": [{"name": "x", "aliases": "y"}]}, "models[0].aliases"),
    ({"version": 1, "models": [{"name": "x", "endpoints": [{"replica_id": "r"}]}]}, "models[0].endpoints[0].url"),
    ({"version": 1, "models": [{"name": "x", "endpoints": [{"replica_id": "r", "url": "h:1"}]}]}, "http://"),
])
def test_bad_documents_name_the_field(doc: object, where: str) -> None:
    """A document the router does not understand is refused with the bad field's path."""
    with pytest.raises(TableError, match=re.escape(where)):
        RouteTable.from_doc(doc)


def test_holder_starts_not_loaded_and_swaps() -> None:
    """The holder starts with the not-loaded placeholder; swap installs and returns the old table."""
    holder = TableHolder()
    assert holder.current is NOT_LOADED and not holder.current.loaded
    table = RouteTable.from_doc(DOC)
    assert holder.swap(table) is NOT_LOADED
    assert holder.current is table


def test_equal_documents_make_equal_tables() -> None:
    """Two tables from the same document compare equal, so the watcher can skip a no-op swap."""
    assert RouteTable.from_doc(DOC) == RouteTable.from_doc(DOC)
    changed = {**DOC, "models": DOC["models"][:1]}
    assert RouteTable.from_doc(DOC) != RouteTable.from_doc(changed)
