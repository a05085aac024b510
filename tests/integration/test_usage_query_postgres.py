"""The usage views' store tests (``tests/unit/test_usage_query.py``) again on a real PostgreSQL: the JSON path
per histogram bucket, the integer division of the day and hour buckets and the GROUP BY that repeats them
must read the same there as on SQLite."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmgw.control.store.store import Store
from llmgw.testing.postgres import Postgres

_spec = importlib.util.spec_from_file_location("usage_query_cases",
                                               Path(__file__).parents[1] / "unit" / "test_usage_query.py")
assert _spec is not None and _spec.loader is not None
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)
#: The unit tests that take a store, by name.
STORE_TESTS: dict[str, Callable[[Store], Any]] = {
    name: fn for name, fn in vars(cases).items()
    if name.startswith("test_") and list(inspect.signature(fn).parameters) == ["store"]}


def test_the_cases_are_found() -> None:
    assert len(STORE_TESTS) >= 5, sorted(STORE_TESTS)


@pytest.mark.parametrize("name", sorted(STORE_TESTS))
def test_on_postgresql(pg: Postgres, name: str) -> None:
    store = Store.open_url(pg.create_database(f"u{sorted(STORE_TESTS).index(name)}"))
    try:
        STORE_TESTS[name](store)
    finally:
        store.close()
