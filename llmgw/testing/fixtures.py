"""Pytest fixtures shared by the integration and end-to-end tests (imported by their conftest files).

``system`` is a running server with one agent (node1), torn down whatever happens; a test module
overrides ``system_args`` for its own settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing import system as system_mod
from llmgw.testing.system import System


@pytest.fixture
def system_args() -> dict[str, Any]:
    """Keyword arguments for the ``system`` fixture's ``System``; a test module overrides this for its own settings."""
    return {}


@pytest.fixture
def system(tmp_path: Path, system_args: dict[str, Any]) -> Iterator[System]:
    """A running server and one agent (node1), torn down whatever happens."""
    with system_mod.running(tmp_path, **system_args) as s:
        yield s
