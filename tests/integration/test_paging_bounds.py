"""Every paging query parameter of the REST API refuses an out-of-range value with 422 and a sentence.

Found by an attacker's probe: ``GET /api/v1/nodes?offset=9999999999999999999`` answered 500 to any
viewer (the number reached the database, whose integers hold 64 bits). The routes are read from the
server's own OpenAPI document, so a paging parameter added later is asked too.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from llmgw.testing.system import System

PAGING = ("offset", "limit", "since", "after")
BAD = ("9999999999999999999", "-5", "ten", "1e400", "nan")


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[System, dict[str, str]]]:
    s = System(tmp_path_factory.mktemp("paging"))
    try:
        s.start_server()
        made = s.request("POST", "/api/v1/users", json={"name": "vera", "role": "viewer"})
        assert made.status_code == 201, made.text
        login = s.request("POST", "/api/v1/login", json={"username": "vera", "password": made.json()["password"]})
        assert login.status_code == 200, login.text
        router = s.request("POST", "/api/v1/routers", json={"name": "r1"})
        assert router.status_code == 201, router.text
        yield s, {"viewer": f"Bearer {login.json()['token']}", "admin": f"Bearer {s.token}",
                  "router": f"Bearer {router.json()['token']}"}
    finally:
        s.close()


def _paged_routes(s: System) -> list[tuple[str, str]]:
    doc = s.get("/api/openapi.json")
    # Numeric ones only: /api/v1/usage's ``since``/``until`` are durations or dates ("7d"), refused by their own
    # check with the same 422 shape (tests/integration/test_usage_views.py).
    found = [(path, p["name"]) for path, ops in doc["paths"].items() for method, op in ops.items()
             if method == "get" for p in op.get("parameters", ()) if p["in"] == "query" and p["name"] in PAGING
             and p["schema"].get("type") != "string"]
    return found


def test_every_paging_parameter_is_bounded_in_the_openapi_document(viewer: tuple[System, dict[str, str]]) -> None:
    """Each paging parameter states its range in the document (what clients and the REST fuzz read)."""
    s, _ = viewer
    routes = _paged_routes(s)
    assert {("/api/v1/nodes", "offset"), ("/api/v1/nodes", "limit"), ("/api/v1/audit", "since"),
            ("/api/v1/events", "after"), ("/api/v1/events", "since")} <= set(routes), routes
    doc = s.get("/api/openapi.json")
    for path, name in routes:
        [param] = [p for p in doc["paths"][path]["get"]["parameters"] if p["name"] == name]
        schema = param["schema"].get("anyOf", [param["schema"]])[0]
        assert "maximum" in schema and "minimum" in schema, (path, name, param)
        assert schema["maximum"] <= 2**63 - 1, (path, name, schema)


def test_huge_negative_and_non_numeric_paging_is_422_with_a_sentence(viewer: tuple[System, dict[str, str]]) -> None:
    """Any paging route asked (by a viewer where it may) with 2**63+, a negative or a word: 422 naming the parameter."""
    s, auth = viewer
    routes = _paged_routes(s)
    for path, name in routes:
        for value in BAD:
            # As a viewer where a viewer may read; the audit log as the admin, the routers' own routes as a router.
            routers = path == "/api/v1/endpoints" or path.startswith("/api/v1/router/")
            who = "admin" if path == "/api/v1/audit" else "router" if routers else "viewer"
            resp = httpx.get(f"{s.url}{path}", params={name: value}, headers={"Authorization": auth[who]},
                             timeout=30)
            assert resp.status_code == 422, (path, name, value, resp.status_code, resp.text[:300])
            err = resp.json()["error"]
            assert err["param"] == name and err["message"].startswith(f"query parameter {name}: "), err
            assert value[:10] in err["message"], err
    # In range, the same routes answer: the bounds refuse only what no database holds.
    viewer_auth = {"Authorization": auth["viewer"]}
    assert httpx.get(f"{s.url}/api/v1/nodes", params={"offset": 2**31, "limit": 10}, headers=viewer_auth,
                     timeout=30).json() == {"items": [], "total": 0}
    assert httpx.get(f"{s.url}/api/v1/events", params={"after": 2**63 - 1}, headers=viewer_auth,
                     timeout=30).status_code == 200
