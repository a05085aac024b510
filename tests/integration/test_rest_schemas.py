"""Real answers of the REST API validate against the response schemas its OpenAPI document states, held
strict: a key a body carries that its schema does not declare fails too, so the schemas describe every key.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema

from llmgw.core import skew
from llmgw.testing import system as system_mod

GETS = ["/healthz", "/api/v1/models", "/api/v1/models/m1", "/api/v1/models/m2", "/api/v1/models/m1/describe",
        "/api/v1/models/m2/describe", "/api/v1/replicas", "/api/v1/replicas?model=m1", "/api/v1/nodes",
        "/api/v1/nodes?limit=1", "/api/v1/nodes/node1", "/api/v1/nodes/node1/describe", "/api/v1/whoami",
        "/api/v1/controlplanes", "/api/v1/events", "/api/v1/keys", "/api/v1/users", "/api/v1/routers",
        "/api/v1/audit", "/api/v1/engines", "/api/v1/weights", "/api/v1/settings",
        "/api/v1/nodes/node1/certificates"]


def strict(doc: dict[str, Any]) -> dict[str, Any]:
    """The document with every declared object closed (``additionalProperties: false``)."""
    out = copy.deepcopy(doc)
    for schema in out["components"]["schemas"].values():
        if "properties" in schema:
            schema["additionalProperties"] = False
    return out


def schema_of(doc: dict[str, Any], method: str, path: str, status: int) -> dict[str, Any]:
    answers = doc["paths"][path][method.lower()]["responses"]
    found = answers.get(str(status)) or answers[f"{str(status)[0]}XX"]
    return {**found["content"]["application/json"]["schema"], "components": doc["components"]}


def check(doc: dict[str, Any], method: str, template: str, status: int, body: Any) -> None:
    try:
        jsonschema.Draft202012Validator(schema_of(doc, method, template, status)).validate(body)
    except jsonschema.ValidationError as e:
        raise AssertionError(f"{method} {template} ({status}): {e.message} at {list(e.absolute_path)}") from None


def template_of(doc: dict[str, Any], path: str) -> str:
    """The document's path for a concrete one (``/api/v1/nodes/node1`` -> ``/api/v1/nodes/{node_id}``)."""
    parts = path.split("?")[0].split("/")
    for template in doc["paths"]:
        t = template.split("/")
        if len(t) == len(parts) and all(a == b or a.startswith("{") for a, b in zip(t, parts, strict=True)):
            return template
    raise AssertionError(f"no operation for {path}")


def test_real_answers_validate_against_their_response_schemas(tmp_path: Path) -> None:
    """The main GETs, a router's reads and reports, node marks and refusals, each against its schema."""
    with system_mod.running(tmp_path) as s:
        s.apply(system_mod.sim_model("m1"))
        s.apply(system_mod.sim_model("m2", autoscale={"min_replicas": 1, "max_replicas": 2, "queue_per_replica": 2}))
        s.wait_model("m1")
        s.wait_model("m2")
        assert s.request("POST", "/api/v1/keys", json={"name": "k", "models": ["m1"]}).status_code == 201
        doc = strict(s.get("/api/openapi.json"))
        checked = 0
        for path in GETS:
            resp = s.request("GET", path)
            assert resp.status_code == 200, (path, resp.text)
            check(doc, "GET", template_of(doc, path), 200, resp.json())
            checked += 1
        made = s.request("POST", "/api/v1/routers", json={"name": "r1"})
        check(doc, "POST", "/api/v1/routers", 201, made.json())
        as_router = {"headers": {"Authorization": f"Bearer {made.json()['token']}", **skew.headers()}}
        calls: list[tuple[str, str, dict[str, Any]]] = [
            ("GET", "/api/v1/endpoints?timeout=0", as_router),
            ("POST", "/api/v1/router/signals", {**as_router, "json": {"router": "r1", "interval_s": 2.0,
                                                                     "sent_at": 1.0, "models": []}}),
            ("POST", "/api/v1/router/events", {**as_router, "json": {"router": "r1", "events": []}}),
            ("POST", "/api/v1/nodes/node1/cordon", {}), ("POST", "/api/v1/nodes/node1/uncordon", {}),
            ("POST", "/api/v1/models/m1/scale", {"json": {"replicas": 1}}),
            ("POST", "/api/v1/users", {"json": {"name": "viewer1", "role": "viewer"}}),
            ("PUT", "/api/v1/settings", {"json": {}}),
            # Refusals, against the error body every 4xx documents.
            ("GET", "/api/v1/models/nope", {}), ("POST", "/api/v1/models/m2/scale", {"json": {"replicas": 3}}),
            ("GET", "/api/v1/nodes/nope/describe", {}), ("DELETE", "/api/v1/keys/nope", {}),
            ("POST", "/api/v1/users", {"json": {"name": "!!", "role": "viewer"}}),
            ("GET", "/api/v1/nodes?offset=-1", {}),
        ]
        for method, path, kw in calls:
            resp = s.request(method, path, **kw)
            assert resp.status_code < 500, (method, path, resp.text)
            check(doc, method, template_of(doc, path), resp.status_code, resp.json())
            checked += 1
    assert checked == len(GETS) + len(calls)
