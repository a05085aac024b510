from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmgw.testing.fixtures import system, system_args  # noqa: F401 (fixtures, shared with tests/e2e)
from llmgw.testing.postgres import Postgres
from llmgw.testing.system import System
from llmgw.testing.uiclient import Browser, logged_in


@pytest.fixture
def browser(system: System) -> Iterator[Browser]:  # noqa: F811 (the fixture imported above)
    """A web UI client (cookies, no JavaScript) on the test's ``system``, not logged in; closed after the test."""
    b = Browser(system.url)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def admin(system: System) -> Iterator[Browser]:  # noqa: F811 (the fixture imported above)
    """A web UI client logged in as the test system's admin; closed after the test."""
    b = logged_in(system.url, "admin", system.admin_password)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def pg() -> Iterator[Postgres]:
    """One PostgreSQL server for a module's tests (each makes a database of its own on it), stopped by pid at the
    end whatever happened. Not one for the whole run: the supervisor tests' harnesses end every child process of
    the test process (``llmgw.testing.supervised``), a server kept between modules included."""
    with Postgres() as server:
        yield server
