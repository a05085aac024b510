from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing import system as system_mod
from llmgw.testing.system import System
from llmgw.testing.uiclient import Browser


@pytest.fixture
def system_args() -> dict[str, Any]:
    """Keyword arguments for the ``system`` fixture's ``System``; a test module overrides this for its own settings."""
    return {}


@pytest.fixture
def system(tmp_path: Path, system_args: dict[str, Any]) -> Iterator[System]:
    """A running server and one agent (node1), torn down whatever happens."""
    with system_mod.running(tmp_path, **system_args) as s:
        yield s


@pytest.fixture
def browser(system: System) -> Iterator[Browser]:
    """A web UI client (cookies, no JavaScript) on the test's ``system``, not logged in; closed after the test."""
    b = Browser(system.url)
    try:
        yield b
    finally:
        b.close()
