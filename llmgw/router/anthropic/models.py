"""``GET /v1/models`` asked by an Anthropic client: the same models, in Anthropic's list shape.

An Anthropic SDK (``client.models.list()``) sends ``anthropic-version`` on every request and its key as
``x-api-key``; an OpenAI client sends neither. Such a request gets the models the key may use (the app's own
list, the same cache) as Anthropic's page of ``ModelInfo``: ``{"data": [{"type": "model", "id", "display_name",
"created_at", ...}], "has_more": false, "first_id", "last_id"}``, and its refusals in Anthropic's shape.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable

from llmgw.router import asgi, auth, errors
from llmgw.router.anthropic import answer
from llmgw.router.table import TableHolder

VERSION_HEADER = b"anthropic-version"


def asked(scope: asgi.Scope) -> bool:
    """Whether the request is an Anthropic client's (it sent ``anthropic-version``)."""
    return any(name == VERSION_HEADER for name, _ in scope.get("headers", ()))


def page(openai_list: bytes) -> bytes:
    """The app's OpenAI model list as Anthropic's page of ``ModelInfo``."""
    data = [{"type": "model", "id": m["id"], "display_name": m["id"], "lifecycle": "active",
             "created_at": datetime.datetime.fromtimestamp(int(m.get("created") or 0), datetime.UTC)
             .isoformat().replace("+00:00", "Z")}
            for m in json.loads(openai_list)["data"]]
    return json.dumps({"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
                       "last_id": data[-1]["id"] if data else None}).encode()


async def serve(holder: TableHolder, scope: asgi.Scope, send: asgi.Send,
                models_body: Callable[[auth.KeyInfo], bytes], header: bytes | None) -> None:
    """Answer the list for the key in ``header`` (``Authorization``, or ``x-api-key`` made one)."""
    key = holder.current.auth.identify(header)
    if isinstance(key, errors.ApiError):
        body = answer.error(key.status, key.message + " Anthropic clients: send the llmgw key as x-api-key.",
                            key.code)
        await asgi.send_bytes(send, key.status, json.dumps(body).encode())
        return
    await asgi.send_bytes(send, 200, page(models_body(key)))
