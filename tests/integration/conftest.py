from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing.system import System


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    """A running server and one agent (node1), torn down whatever happens."""
    s = System(tmp_path)
    try:
        s.start_server()
        s.start_agent("node1")
        yield s
    finally:
        s.close()
