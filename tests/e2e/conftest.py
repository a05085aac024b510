"""The browser tests' shared fixtures: ``ui_system`` (a real server, agent node1 and sim engines, one per test
module) and ``chrome`` (a headless Chromium per test, with failure screenshots). Log in with
``llmgw.testing.browser.log_in``.

A module that needs models applies them in a module fixture of its own built on ``ui_system`` (the playground
does), so the system's start, most of a module's time, is paid once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmgw.testing import browser
from llmgw.testing import system as system_mod
from llmgw.testing.fixtures import system, system_args  # noqa: F401 (fixtures, shared with tests/integration)


@pytest.fixture(scope="module")
def ui_system(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[system_mod.System]:
    """A running server and one agent (node1) for the module, torn down whatever happens."""
    with system_mod.running(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])) as s:
        yield s


@pytest.fixture
def chrome(request: pytest.FixtureRequest) -> Iterator[browser.Browser]:
    """A headless Chromium for this test; its pages' screenshots go to the test's artifact folder."""
    failed_before = request.session.testsfailed
    with browser.chromium(request.node.name) as b:
        yield b
        # pytest resumes this generator normally after a failed test (the call's report is counted first),
        # so the failure pictures are taken here rather than by chromium()'s own except clause.
        if request.session.testsfailed > failed_before:
            b.screenshot_open_pages()
