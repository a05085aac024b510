"""``stream`` and ``stream_options`` of the wrong type are refused as OpenAI refuses them, not streamed anyway.

``"stream": "yes"`` or ``1`` used to get a 200 (read as "not streamed", or streamed for a client that did
not ask for SSE); OpenAI answers 400 naming the field. Through a real standalone router in front of a sim
engine: the refusal is a valid ErrorResponse with ``param`` set, and true/false/null still work.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.testing import openai_schema
from llmgw.testing.routed import started


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone router over one sim engine serving ``m``; the router's URL."""
    tmp: Path = tmp_path_factory.mktemp("stream-field")
    with started(tmp) as procs:
        sim = procs.sim("m")
        yield procs.router([{"name": "m", "state": "Ready", "engine": "vllm", "routing": "round_robin",
                             "endpoints": [{"replica_id": "r0", "url": sim}]}])


def _post(url: str, path: str, extra: dict[str, Any]) -> httpx.Response:
    doc = {"model": "m", "max_tokens": 2, **extra,
           **({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"})}
    return httpx.post(url + path, content=json.dumps(doc).encode(), headers={"Content-Type": "application/json"},
                      timeout=30)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(("extra", "param"), [
    ({"stream": "yes"}, "stream"),
    ({"stream": 1}, "stream"),
    ({"stream": "true"}, "stream"),
    ({"stream": {}}, "stream"),
    ({"stream": True, "stream_options": "include_usage"}, "stream_options"),
    ({"stream": True, "stream_options": [True]}, "stream_options"),
], ids=["yes", "one", "string-true", "object", "options-string", "options-array"])
def test_a_non_boolean_stream_is_a_400_naming_the_field(router: str, path: str, extra: dict[str, Any],
                                                         param: str) -> None:
    """The answer is OpenAI's ErrorResponse, 400, invalid_request_error, with param the field at fault."""
    got = _post(router, path, extra)
    assert got.status_code == 400, got.text
    assert got.headers["content-type"].startswith("application/json")
    openai_schema.validate("error", got.json())
    assert got.json()["error"]["param"] == param
    assert got.json()["error"]["type"] == "invalid_request_error"
    assert param in got.json()["error"]["message"]


@pytest.mark.parametrize(("extra", "streamed"), [
    ({"stream": True}, True), ({"stream": False}, False), ({"stream": None}, False), ({}, False),
    ({"stream": True, "stream_options": {"include_usage": True}}, True), ({"stream_options": None}, False),
], ids=["true", "false", "null", "absent", "options-object", "options-null"])
def test_booleans_and_null_are_still_served(router: str, extra: dict[str, Any], streamed: bool) -> None:
    """What OpenAI accepts is served as before: SSE for true, one JSON body otherwise."""
    got = _post(router, "/v1/chat/completions", extra)
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith("text/event-stream" if streamed else "application/json")
