"""Sim engines and standalone routers as processes, for router tests: everything started is stopped after."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmgw.testing.procs import Proc, free_port


class Procs:
    """The processes of one test: sim engines and routers over a static table."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[Proc] = []

    def sim(self, name: str = "m", *extra: str) -> str:
        """A sim engine serving ``name``; its base URL once it answers /health."""
        port = free_port()
        proc = Proc.start([sys.executable, "-m", "llmgw.sim.engine", "--host", "127.0.0.1", "--port", str(port),
                           "--model", name, *extra], log_path=self.tmp_path / f"sim-{port}.log")
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/health", timeout=30)
        return url

    def router(self, models: list[dict[str, Any]], *extra: str) -> str:
        """A standalone router whose table holds ``models`` (endpoints-document entries); its base URL."""
        port = free_port()
        table = self.tmp_path / f"table-{port}.json"
        table.write_text(json.dumps({"version": 1, "models": models}))
        proc = Proc.start([sys.executable, "-m", "llmgw.router.standalone", "--host", "127.0.0.1", "--port",
                           str(port), "--table-file", str(table), *extra],
                          log_path=self.tmp_path / f"router-{port}.log")
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/v1/models", timeout=30)
        return url

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


@contextlib.contextmanager
def started(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.stop_all()
