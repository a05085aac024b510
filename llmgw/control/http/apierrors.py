"""The REST API's refusals, one class per kind, each writing its sentence in its constructor.

A handler raises ``NotFound("model", name, "`llmgw get models` lists them")`` rather than a status and a
sentence composed on the spot, so the same thing refused in two places reads the same, and the CLI and the
UI (which print the body's ``message``) say what the API said. The body's shape is ``errors.error_body``'s.
"""

from __future__ import annotations

import json

from llmgw.control.auth import principals
from llmgw.control.auth.middleware import forbidden_message
from llmgw.control.http.errors import ApiError

__all__ = ["ApiError", "BadRequest", "Conflict", "Forbidden", "InvalidJson", "LoginFailed", "NotFound",
           "TooLarge", "TooManyLogins", "Unavailable", "Unprocessable"]


class NotFound(ApiError):
    """404: ``{kind} {name!r} {says}; {hint}`` (``says``: "does not exist"); ``code``: ``{kind}_not_found``.

    An empty ``name`` is left out of the sentence (``kind`` then says what is missing on its own).
    """

    def __init__(self, kind: str, name: str, hint: str, *, says: str = "does not exist",
                 code: str | None = None) -> None:
        what = f"{kind} {name!r}" if name else kind
        super().__init__(404, f"{what} {says}; {hint}", code=code or f"{kind}_not_found")

    @classmethod
    def said(cls, message: str, *, code: str) -> ApiError:
        """A 404 whose sentence a lower layer wrote (a node's agent saying why its log cannot be read)."""
        return ApiError(404, message, code=code)


class Forbidden(ApiError):
    """403: who the caller is, what the action needs, and how the caller could get it."""

    def __init__(self, who: principals.Principal, need: principals.Need, method: str, path: str) -> None:
        super().__init__(403, forbidden_message(who, need, method, path), code="forbidden", type_="permission_error")

    @classmethod
    def said(cls, message: str, *, code: str) -> ApiError:
        """A 403 whose sentence a lower layer wrote (the auth module's refusal of a cross-site login)."""
        return ApiError(403, message, code=code, type_="permission_error")


class Conflict(ApiError):
    """409: the request is valid but the cluster's state refuses it; the sentence says what to do instead."""

    def __init__(self, message: str, *, code: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(409, message, code=code, param=param, headers=headers)


class BadRequest(ApiError):
    """400: the request itself is malformed (a name breaking its rule, a URL and body that disagree)."""

    def __init__(self, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(400, message, code=code, param=param)


class Unprocessable(ApiError):
    """422: the body is well formed but a value in it is refused; ``param`` names the field."""

    def __init__(self, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(422, message, code=code, param=param)


class InvalidJson(BadRequest):
    """400 ``invalid_json``: the body could not be read as JSON (``error``: the parser's reason)."""

    def __init__(self, error: ValueError | RecursionError) -> None:
        if isinstance(error, RecursionError):  # 100,000 "[" (100 kB) was a 500 with a traceback
            super().__init__("body is nested too deeply to read; a model file is a few levels deep",
                             code="invalid_json")
        else:
            super().__init__(f"body is not valid JSON: {error}", code="invalid_json")


class TooLarge(ApiError):
    """413: the body is over the API's limit."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(413, f"body is {size} bytes; the limit is {limit}", code="too_large")


class Unavailable(ApiError):
    """503: the server could not do it now; trying again may work."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(503, message, code=code)


class LoginFailed(ApiError):
    """401 ``login_failed``: a wrong user name or password (the sentence is the auth module's)."""

    def __init__(self, message: str) -> None:
        super().__init__(401, message, code="login_failed", type_="authentication_error")


class TooManyLogins(ApiError):
    """429 ``too_many_logins`` with ``Retry-After``: too many failed logins from one address or for one user."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(429, message, code="too_many_logins", type_="rate_limit_error",
                         headers={"Retry-After": str(int(retry_after) + 1)})


def read_json(body: bytes, *, limit: int | None) -> object:
    """``body`` as JSON, or the refusal: ``TooLarge`` over ``limit`` bytes, ``InvalidJson`` when it is not JSON."""
    if limit is not None and len(body) > limit:
        raise TooLarge(len(body), limit)
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise InvalidJson(e) from None
