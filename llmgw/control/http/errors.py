"""REST errors in the same shape as the OpenAI API's, so one client-side parser reads both.

``ApiError`` is the base of the refusals handlers raise (``apierrors`` holds the family, each with its
sentence written in its constructor); ``install`` answers every one, and FastAPI's own refusals, as
``{"error": {"message", "type", "code", "param"}}``: the CLI (``cli.client``) and the UI print ``message``.
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class ApiError(Exception):
    """A refusal: its status, its sentence, the body's ``code``, ``type`` and ``param``, and ``headers`` to send."""

    def __init__(self, status: int, message: str, *, code: str, type_: str = "invalid_request_error",
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.type, self.param = status, message, code, type_, param
        self.headers = headers


class ErrorDetail(pydantic.BaseModel):
    message: str = pydantic.Field(description="The sentence the CLI and the UI show")
    type: str
    code: str | None
    param: str | None = pydantic.Field(description="The field or parameter refused, when one is")


class ErrorBody(pydantic.BaseModel):
    """Every refusal's body (``error_body``), as the OpenAI API's."""

    error: ErrorDetail


#: What every operation's document says of a 4xx answer (FastAPI's own 422 schema is not what is answered).
REFUSALS: dict[int | str, dict[str, Any]] = {"4XX": {"model": ErrorBody, "description": "Refused: "
                                                     "``error.message`` says why"}}


def error_body(message: str, *, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, type_=exc.type, code=exc.code, param=exc.param),
                            status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(error_body(str(exc.detail), type_="invalid_request_error", code=code),
                            status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = tuple(first.get("loc", ()))
        if loc[:1] == ("query",) and len(loc) > 1:
            # A query parameter out of its range (``offset=9999999999999999999`` was a 500 from the database):
            # 422 with the parameter, the rule it broke and the value as given.
            name = str(loc[1])
            return JSONResponse(error_body(f"query parameter {name}: {first.get('msg', 'invalid value')}; got "
                                           f"{str(first.get('input'))[:40]!r}", type_="invalid_request_error",
                                           code="invalid_parameter", param=name), status_code=422)
        where = ".".join(str(x) for x in loc if x != "body")
        return JSONResponse(error_body(f"{where}: {first.get('msg', 'invalid request')}",
                                       type_="invalid_request_error", code="invalid_request", param=where or None),
                            status_code=400)
