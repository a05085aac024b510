"""The REST API's OpenAPI document is checked in (``docs/openapi.json``), so a reviewer sees API changes,
and every refusal's sentence is written once, in its ``apierrors`` class."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw.control.auth import principals
from llmgw.control.http import apierrors, openapi


def test_the_checked_in_document_is_the_api_s() -> None:
    """Fails when the API changed without docs/openapi.json: the message names the command that rewrites it."""
    found = openapi.check()
    assert not found, (f"the REST API differs from {openapi.CHECKED_IN} in: {', '.join(found)}; run "
                       f"`{openapi.REGENERATE}` and commit the file")


def test_check_names_what_differs_and_write_makes_it_agree(tmp_path: Path) -> None:
    """``--check`` exits 1 naming the changed path; ``--write`` then makes it agree; the file is stable."""
    copy = tmp_path / "openapi.json"
    assert openapi.main(["--write", "--path", str(copy)]) == 0
    first = copy.read_text()
    assert openapi.main(["--check", "--path", str(copy)]) == 0
    doc = json.loads(first)
    del doc["paths"]["/api/v1/models"]
    copy.write_text(json.dumps(doc))
    assert openapi.check(copy) == ["path /api/v1/models"]
    assert openapi.main(["--check", "--path", str(copy)]) == 1
    assert openapi.main(["--write", "--path", str(copy)]) == 0 and copy.read_text() == first


def test_every_json_operation_describes_its_answer_and_its_refusals() -> None:
    """Each operation but the text/NDJSON ones names a response schema, and documents refusals as sent."""
    doc = openapi.document()
    bare = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            ok = op["responses"].get("200") or op["responses"].get("201")
            content = ok.get("content", {})
            if path in ("/metrics", "/api/v1/nodes/{node_id}/logs", "/api/v1/ca.crt"):  # text, NDJSON, PEM
                continue
            if not content.get("application/json", {}).get("schema"):
                bare.append(f"{method.upper()} {path}")
            assert op["responses"]["4XX"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorBody"}, (method, path)
    assert bare == []
    assert "HTTPValidationError" not in doc["components"]["schemas"]  # FastAPI's 422 shape is never answered


def test_refusals_write_their_sentences() -> None:
    nf = apierrors.NotFound("model", "m", "`llmgw get models` lists them")
    assert (nf.status, nf.code, nf.message) == (404, "model_not_found",
                                                 "model 'm' does not exist; `llmgw get models` lists them")
    node = apierrors.NotFound("node", "n", "`llmgw get nodes` lists them", says="is not known")
    assert node.message == "node 'n' is not known; `llmgw get nodes` lists them" and node.code == "node_not_found"
    anon = apierrors.NotFound("vllm 1.0", "", "see the wants", says="is not wanted on pool p", code="not_found")
    assert anon.message == "vllm 1.0 is not wanted on pool p; see the wants"
    who = principals.Principal("user", "bob", principals.OPERATOR)
    fb = apierrors.Forbidden(who, principals.Need(principals.ADMIN), "POST", "/api/v1/tokens")
    assert (fb.status, fb.code, fb.type) == (403, "forbidden", "permission_error")
    assert "POST /api/v1/tokens needs" in fb.message and "llmgw user set-role bob admin" in fb.message
    assert apierrors.TooLarge(5, 4).message == "body is 5 bytes; the limit is 4"
    many = apierrors.TooManyLogins("slow down", 9.5)
    assert (many.status, many.headers) == (429, {"Retry-After": "10"})
    c = apierrors.Conflict("no", code="autoscaled", param="replicas")
    assert (c.status, c.code, c.param) == (409, "autoscaled", "replicas")


def test_read_json_refuses_with_the_reason() -> None:
    assert apierrors.read_json(b'{"a": 1}', limit=100) == {"a": 1}
    for body, status, start in ((b"x" * 101, 413, "body is 101 bytes"), (b"{", 400, "body is not valid JSON"),
                                (b"[" * 100_000, 400, "body is nested too deeply")):
        try:
            apierrors.read_json(body, limit=None if status != 413 else 100)
        except apierrors.ApiError as e:
            assert (e.status, e.message[:len(start)]) == (status, start)
        else:
            raise AssertionError(body[:10])
