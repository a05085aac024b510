"""The router's own refusals, each one an OpenAI-shaped error a client can show as it is.

Every answer the router makes itself (rather than relaying an engine's) is an
``ApiError``: an HTTP status plus ``{"error": {"message", "type", "param", "code"}}``
as OpenAI's published schema requires (``param`` is required there, even when
null). The constructors below are the only place the wording lives, so each
refusal says what was wrong and what to do next in one sentence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from llmgw.core.errors import LlmgwError


class ApiError(LlmgwError):
    """A refusal to answer with ``status`` and an OpenAI-shaped body."""

    def __init__(self, status: int, message: str, *, type: str, code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def payload(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def body(self) -> bytes:
        return json.dumps(self.payload()).encode()


def invalid_request(message: str, *, param: str | None = None) -> ApiError:
    return ApiError(400, message, type="invalid_request_error", code="invalid_request", param=param)


def model_not_found(name: str, available: Sequence[str]) -> ApiError:
    listed = ", ".join(available) if available else "none (no model is deployed yet)"
    return ApiError(404, f"The model {name!r} does not exist. Available models: {listed}. "
                         "See `llmgw get models`.", type="invalid_request_error",
                    code="model_not_found", param="model")


def embeddings_not_served(name: str, engine: str, flag: str) -> ApiError:
    how = (f"add {flag!r} to its spec.engine_args (and '--pooling', 'mean' for a chat model)" if flag
           else "serve a model that embeds")
    return ApiError(400, f"The model {name!r} does not serve embeddings: its engine ({engine or 'unknown'}) was "
                         f"started without them. To embed with it, {how}; `GET /v1/models` says which models "
                         "embed (llmgw.embeddings).", type="invalid_request_error",
                    code="embeddings_not_supported", param="model")


def no_ready_endpoint(name: str, state: str, message: str) -> ApiError:
    why = f"{state}: {message}" if message else (state or "no replica is Ready")
    return ApiError(503, f"The model {name!r} has no ready replica ({why}). Retry later, or check "
                         "`llmgw get replicas` to see why.", type="service_unavailable",
                    code="model_not_ready")


def table_not_loaded(source: str) -> ApiError:
    # Before the first table arrives every model would look unknown; a 404 then would
    # tell a client its model is gone while the router simply has not looked yet.
    return ApiError(503, f"The router has not received its route table from {source} yet; "
                         "retry in a few seconds, and check that the control plane is running.",
                    type="service_unavailable", code="routes_not_loaded")


def upstream_failed(name: str, attempts: Sequence[str]) -> ApiError:
    return ApiError(502, f"Every attempt to reach an engine for {name!r} failed: {'; '.join(attempts)}. "
                         "Retry, or check `llmgw get replicas`.", type="upstream_error",
                    code="upstream_failed")


def failed_mid_stream(replica_id: str, why: str) -> ApiError:
    # Sent as the last SSE event of a cut stream; the status is not seen by the client
    # (its 200 went out with the first chunk) but keeps the error's meaning in one place.
    return ApiError(502, f"The engine (replica {replica_id}) failed mid-stream: {why}. Retry the request.",
                    type="upstream_error", code="upstream_failed")


def path_not_found(method: str, path: str) -> ApiError:
    return ApiError(404, f"Unknown endpoint {method} {path}. The router serves GET /v1/models, "
                         "POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses and (Anthropic's) "
                         "/v1/messages.",
                    type="invalid_request_error", code="unknown_url")


def method_not_allowed(method: str, path: str, allowed: str) -> ApiError:
    return ApiError(405, f"{method} is not allowed on {path}; use {allowed}.",
                    type="invalid_request_error", code="method_not_allowed")


def body_too_large(limit: int) -> ApiError:
    return ApiError(413, f"The request body is larger than the router's limit of {limit} bytes. Send a "
                         "smaller body, or raise the limit with the router's --max-body-bytes "
                         "(max_body_bytes of RouterApp).", type="invalid_request_error",
                    code="request_too_large")


class ColdStartTimeout(ApiError):
    """503: a model at zero had no replica Ready within its cold-start timeout; Retry-After says when to retry."""

    def __init__(self, name: str, state: str, message: str, *, waited_s: float, retry_after_s: int) -> None:
        why = f"{state}: {message}" if message else (state or "no replica yet")
        super().__init__(503, f"The model {name!r} has no ready replica, and none became ready within its "
                              f"cold-start timeout of {waited_s:g}s ({why}). Retry in {retry_after_s}s, or see "
                              f"`llmgw describe model {name}` for why it is not ready.",
                         type="service_unavailable", code="model_cold")
        self.retry_after_s = retry_after_s

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after_s).encode())]
