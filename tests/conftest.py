"""Temporary directories engines of other users can reach.

The agent runs engines as users of their own (``llmgw.agent.supervisor.identity``), never as root, and
the tests run as root here and in CI. pytest makes ``/tmp/pytest-of-root`` and every ``tmp_path`` 0700, so
an engine could not read weights, nor reach the run dir, that a test put there. So, unless ``--basetemp``
is given: the base is a directory of ours under the system temp dir, 0711 (searchable, not listable),
and every directory pytest makes under it for a test is 0755. Only directories pytest made for these
tests change mode; what a test makes inside keeps its own (a 0700 work dir, a 0600 key).

The base is removed at the end when every test passed, and kept (and named) when one failed: the
agents' and engines' logs in it are how a failure is read. A kept one goes at a later session's start
once nothing has been written in it for an hour (every test writes there, so a session still running has
written within minutes).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# A router started by a test (``python -m llmgw.router.standalone``, ``llmgw router``) serves from one process,
# as every test but the workers' own was written for: ``--workers`` defaults to one per core, and a hub with
# workers would make each such test start several processes and read its router's /metrics from any one of
# them. The workers' tests give ``--workers`` themselves (a flag beats the variable).
os.environ.setdefault("LLMGW_ROUTER_WORKERS", "1")
# The same for `llmgw server`: with ``--router-workers`` at its default (one process per core) every test's server
# would start several router processes on a machine the tests already share; its /metrics would be the server's
# in-process router's alone while the workers serve part of the traffic. The tests of the server's router workers
# give the flag themselves.
os.environ.setdefault("LLMGW_SERVER_ROUTER_WORKERS", "1")
# Every `llmgw server` of the tests listens for tunnels on a free port, as for its other ports (the tests give those
# as flags): the default, 8083, would collide between the servers a test runs side by side.
os.environ.setdefault("LLMGW_SERVER_TUNNEL_PORT", "0")

_OURS: Path | None = None
_FAILED = False
_PREFIX = "llmgw-tests-"
_KEEP_S = 3600.0


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    global _OURS
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        _prune(Path(tempfile.gettempdir()))
        _OURS = Path(tempfile.mkdtemp(prefix=_PREFIX))
        config.option.basetemp = str(_OURS)


def _prune(temp: Path) -> None:
    """Remove the bases of earlier failed sessions of this user untouched for an hour."""
    now = time.time()
    for old in temp.glob(f"{_PREFIX}*"):
        try:
            st = old.lstat()
        except OSError:
            continue
        if old.is_dir() and not old.is_symlink() and st.st_uid == os.getuid() and now - st.st_mtime > _KEEP_S:
            shutil.rmtree(old, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _FAILED
    _FAILED = exitstatus != 0


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OURS is None or not _OURS.exists():
        return
    if _FAILED:
        print(f"\nthe tests' temporary files are kept in {_OURS}")
        return
    shutil.rmtree(_OURS, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _reachable_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The base 0711 and each directory pytest makes under it 0755, for the engines' users."""
    if _OURS is None:
        yield
        return
    base = tmp_path_factory.getbasetemp()  # pytest made it again, 0700
    os.chmod(base, 0o711)
    made = tmp_path_factory.mktemp

    def mktemp(basename: str, numbered: bool = True) -> Path:
        path = made(basename, numbered)
        os.chmod(path, 0o755)
        return path

    # Both tmp_path and tmp_path_factory.mktemp make their directories through this method.
    tmp_path_factory.mktemp = mktemp  # type: ignore[method-assign]
    yield
