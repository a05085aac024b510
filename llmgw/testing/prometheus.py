"""Debian's Prometheus and promtool for tests: ``promtool check``/``test rules``, and a real server of a test's own.

``Prometheus(dir, scrape_configs)`` writes its configuration into ``dir`` (a free port on 127.0.0.1, a scrape and
evaluation interval of 1 s, the TSDB in ``dir``), starts it, waits for ``/-/ready``, and stops it (SIGTERM, then
SIGKILL to its group) however the test ends. ``query`` runs PromQL through its HTTP API.

The binaries come from Debian's ``prometheus`` package (``make prometheus``, which ``make test-e2e`` runs, installs
it with apt when missing, as it does postgresql and chromium).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import yaml

from llmgw.testing import procs


class PrometheusMissing(RuntimeError):
    """The binary is not installed; the message says how to install it."""


def binary(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``."""
    found = shutil.which(name)
    if found is None:
        raise PrometheusMissing(f"{name} was not found on PATH: install Debian's `prometheus` package "
                                "(`make prometheus`, which `make test-e2e` runs, does when apt can be used)")
    return found


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` (argv, no shell), its output captured; the caller checks ``returncode``."""
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, check=False, cwd=cwd,
                          timeout=120)


class Prometheus:
    """One Prometheus server: ``with Prometheus(tmp, [job, ...]) as prom: prom.query("up")``."""

    def __init__(self, directory: Path, scrape_configs: Sequence[Mapping[str, Any]], *, interval: str = "1s",
                 rule_files: Sequence[Path] = ()) -> None:
        self.directory = directory
        self.port = procs.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = directory / "prometheus.yml"
        self.config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [dict(c) for c in scrape_configs]}))
        self.proc: procs.Proc | None = None

    def start(self) -> None:
        self.proc = procs.Proc.start([
            binary("prometheus"), f"--config.file={self.config}", f"--storage.tsdb.path={self.directory / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            log_path=self.directory / "prometheus.log")
        self.proc.wait_http(self.url + "/-/ready", timeout=30)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/PATH``'s ``data``; AssertionError with Prometheus's error when it is not a success."""
        response = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=30, trust_env=False)
        doc = response.json()
        assert doc.get("status") == "success", f"{path} {params}: {response.status_code} {doc}"
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (its vector's samples; a scalar as one sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def log_tail(self) -> str:
        return self.proc.log_tail() if self.proc is not None else ""
