"""Sim engines and standalone routers as processes, for router tests: everything started is stopped after."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llmgw.testing.procs import Proc, free_port


class Spawner:
    """Starts sim engines and routers on free ports for one test; ``stop_all`` ends them, newest first."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[Proc] = []

    def spawn_sim(self, name: str, *extra: str) -> tuple[Proc, str]:
        """A sim engine serving ``name``, started but not waited for; and its base URL."""
        port = free_port()
        proc = Proc.start([sys.executable, "-m", "llmgw.sim.engine", "--host", "127.0.0.1", "--port", str(port),
                           "--model", name, *extra], log_path=self.tmp_path / f"sim-{port}.log")
        self.procs.append(proc)
        return proc, f"http://127.0.0.1:{port}"

    def spawn_router(self, *args: str, table: dict[str, Any] | None = None,
                     expect: Callable[[int, bytes], bool] | None = None) -> str:
        """A standalone router given ``args`` (and ``table`` as its --table-file); its URL once /v1/models answers.

        ``expect`` decides which answer counts (default: 200, the table is served).
        """
        port = free_port()
        argv = [sys.executable, "-m", "llmgw.router.standalone", "--host", "127.0.0.1", "--port", str(port),
                "--workers", "1"]
        if table is not None:
            table_file = self.tmp_path / f"table-{port}.json"
            table_file.write_text(json.dumps(table))
            argv += ["--table-file", str(table_file)]
        proc = Proc.start([*argv, *args], log_path=self.tmp_path / f"router-{port}.log")
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        if expect is None:
            proc.wait_http(url + "/v1/models", timeout=30)
        else:
            proc.wait_http(url + "/v1/models", timeout=30, expect=expect)
        return url

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


class Procs(Spawner):
    """The plain case: one sim at a time, a router over a list of endpoints-document models."""

    def sim(self, name: str = "m", *extra: str) -> str:
        """A sim engine serving ``name``; its base URL once it answers /health."""
        proc, url = self.spawn_sim(name, *extra)
        proc.wait_http(url + "/health", timeout=30)
        return url

    def router(self, models: list[dict[str, Any]], *extra: str) -> str:
        """A standalone router whose table holds ``models`` (endpoints-document entries); its base URL."""
        return self.spawn_router(*extra, table={"version": 1, "models": models})


@contextlib.contextmanager
def started(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.stop_all()
