"""``/v1/files`` and ``/v1/batches`` as OpenAI serves them, on the OpenAI API's port, with llmgw API keys.

Served by the control plane (``llmgw server`` sends these paths here rather than to its router; a router worker
passes them to the server, a standalone router to the control plane it follows): files and batches live in the
store, which only control planes reach, and none of it is on the path of a completion. Any control plane answers
(each write is conditional, ``service``), so a standby serves them during a failover too.

A key sees its own project's files and batches only (another project's are "No such File object", as unknown
ones); with no key at all in the cluster the API is open, as the routers' is, in the ``default`` project.
Every refusal is OpenAI's error object.
"""

from __future__ import annotations

import email.parser
import email.policy
import hashlib
import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmgw.api import batches as wire
from llmgw.control.batches import objects
from llmgw.control.batches.service import BatchService, Refused
from llmgw.core import quota

HOW_TO = "Create one with `llmgw key create NAME` and send it as `Authorization: Bearer <key>`."


serves = wire.openai_path


def _json(model: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(objects.dump(model) if not isinstance(model, dict) else model, status_code=status)


def _limit(request: Request, default: int, high: int) -> int:
    raw = request.query_params.get("limit", str(default))
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 1 <= value <= high:
        raise Refused(400, f"limit must be a whole number from 1 to {high}", code="invalid_value", param="limit")
    return value


def create_app(service: BatchService) -> Starlette:
    async def caller(request: Request) -> tuple[str, str, str]:
        """(key id, project, user) of the request's key; Refused 401 when it has none that is valid."""
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        secret = secret.strip() if scheme.lower() == "bearer" else ""
        found = await service.db.call(service.db.store.key_by_hash, hashlib.sha256(secret.encode()).hexdigest())
        if found is False:
            return "", quota.DEFAULT_PROJECT, ""
        if not found:
            said = "carried none" if not secret else "is not valid (unknown, deleted or disabled)"
            raise Refused(401, f"This endpoint needs an API key and the request's {said}. " + HOW_TO,
                          code="invalid_api_key", type="invalid_request_error")
        return found  # type: ignore[return-value]

    async def files(request: Request) -> Response:
        _, project, _ = await caller(request)
        if request.method == "POST":
            filename, purpose, data = await _multipart(request, service.config.max_file_bytes)
            return _json(objects.file_object(await service.upload(project, filename, purpose, data)))
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise Refused(400, "order must be asc or desc", code="invalid_value", param="order")
        limit = _limit(request, 10000, 10000)
        found = await service.list_files(project, purpose=request.query_params.get("purpose", ""),
                                         after=request.query_params.get("after", ""), limit=limit + 1,
                                         ascending=order == "asc")
        page = [objects.file_object(f) for f in found[:limit]]
        return _json(objects.FileList(data=page, first_id=page[0].id if page else None,
                                      last_id=page[-1].id if page else None, has_more=len(found) > limit))

    async def one_file(request: Request) -> Response:
        _, project, _ = await caller(request)
        file_id = request.path_params["file_id"]
        if request.method == "DELETE":
            return _json(objects.FileDeleted(id=await service.delete_file(project, file_id), deleted=True))
        return _json(objects.file_object(await service.get_file(project, file_id)))

    async def content(request: Request) -> Response:
        _, project, _ = await caller(request)
        data = await service.content(project, request.path_params["file_id"])
        return Response(data, media_type="application/octet-stream")

    async def batches(request: Request) -> Response:
        key_id, project, user = await caller(request)
        if request.method == "POST":
            try:
                doc = json.loads(await request.body())
            except ValueError:
                raise Refused(400, "the body is not JSON: send the batch as a JSON object", code="invalid_json") \
                    from None
            return _json(await service.create(project, key_id, user, doc))
        page, more = await service.list(project, after=request.query_params.get("after", ""),
                                        limit=_limit(request, 20, 100))
        return _json(objects.BatchList(data=page, first_id=page[0].id if page else None,
                                       last_id=page[-1].id if page else None, has_more=more))

    async def one_batch(request: Request) -> Response:
        _, project, _ = await caller(request)
        return _json(await service.get(project, request.path_params["batch_id"]))

    async def cancel(request: Request) -> Response:
        _, project, _ = await caller(request)
        return _json(await service.cancel(project, request.path_params["batch_id"]))

    async def refused(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        return JSONResponse(exc.doc(), status_code=exc.status)

    async def not_found(request: Request, _exc: Exception) -> Response:
        return JSONResponse(Refused(404, f"{request.method} {request.url.path} is not an endpoint here",
                                    code="unknown_url").doc(), status_code=404)

    async def not_allowed(request: Request, _exc: Exception) -> Response:
        return JSONResponse(Refused(405, f"{request.method} is not allowed on {request.url.path}",
                                    code="method_not_allowed").doc(), status_code=405)

    return Starlette(routes=[
        Route("/v1/files", files, methods=["GET", "POST"]),
        Route("/v1/files/{file_id}", one_file, methods=["GET", "DELETE"]),
        Route("/v1/files/{file_id}/content", content, methods=["GET"]),
        Route("/v1/batches", batches, methods=["GET", "POST"]),
        Route("/v1/batches/{batch_id}", one_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", cancel, methods=["POST"]),
    ], exception_handlers={Refused: refused, 404: not_found, 405: not_allowed})


async def _multipart(request: Request, max_bytes: int) -> tuple[str, str, bytes]:
    """(filename, purpose, bytes) of a ``multipart/form-data`` upload (fields ``file`` and ``purpose``)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise Refused(400, "upload the file as multipart/form-data with the fields file and purpose",
                      code="invalid_request", param="file")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes + (64 << 10):
            raise Refused(413, f"the upload is past the limit of {max_bytes} bytes (--files-max-bytes); split it "
                               "into several batches", code="file_too_large", param="file")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + bytes(body))
    filename, purpose, data = "", "", None
    for part in message.iter_parts() if message.is_multipart() else ():
        name = part.get_param("name", header="content-disposition")
        if name == "file":
            filename = part.get_filename() or "upload.jsonl"
            data = part.get_payload(decode=True) or b""
        elif name == "purpose":
            purpose = (part.get_payload(decode=True) or b"").decode("utf-8", "replace").strip()
    if data is None:
        raise Refused(400, "the upload has no file field: send the file as the form field file", code="invalid_request",
                      param="file")
    return filename, purpose, data
