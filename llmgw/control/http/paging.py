"""The bounds of every paging query parameter (``offset``, ``limit``, ``since``, ``after``), in one place.

Found by an attacker's probe: ``GET /api/v1/nodes?offset=9999999999999999999`` reached the database,
whose integers hold 64 bits, and answered 500 to any viewer. Each parameter is declared with
``fastapi.Query`` bounds, so a value out of range is refused with 422 and a sentence before a handler
runs, and the bounds are in the OpenAPI document (the REST fuzz generates from them).
"""

from __future__ import annotations

from typing import Any

from fastapi import Query

#: The largest offset into a list: far past any cluster's size, and a 32-bit count every database holds.
MAX_OFFSET = 2**31
#: The largest id to page after: the store's ids are 64-bit integers (SQLite INTEGER, PostgreSQL BIGINT).
MAX_ID = 2**63 - 1
#: The largest time to read after, in seconds since the epoch: the year 33658, past any clock's reading.
MAX_TIME = 2.0**40
#: The most items one page may ask for.
MAX_LIMIT = 10_000


def offset(description: str = "Items to skip") -> Any:
    return Query(default=0, ge=0, le=MAX_OFFSET, description=description)


def limit(*, default: int, low: int = 1, description: str = "The most items to answer") -> Any:
    return Query(default=default, ge=low, le=MAX_LIMIT, description=description)


def after_id(description: str = "Items after this id") -> Any:
    return Query(default=0, ge=0, le=MAX_ID, description=description)


def since_time(description: str = "Items after this time (seconds since the epoch)") -> Any:
    return Query(default=None, ge=0, le=MAX_TIME, allow_inf_nan=False, description=description)
