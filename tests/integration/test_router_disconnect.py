"""Clients that leave cancel their request at the engine: mid-stream and before the first token, many at once.

A router process over one sim engine. Each client tags its request with the
OpenAI ``user`` field (relayed to the engine untouched); the sim lists the tags
of the requests it aborted in ``/sim/stats``, so the test asserts that every
client that left was aborted at the engine, and that none ran to the end. How
soon after the disconnect is a timing, measured by ``bench/disconnect_abort.py``.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.testing.procs import Proc, free_port, wait_for

N = 6  # clients of each kind


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[str, str]]:
    procs: list[Proc] = []
    try:
        sim_port, router_port = free_port(), free_port()
        # prefill 20 tokens/s: a 400-character prompt (100 tokens) waits 5 s for its first token.
        procs.append(Proc.start([sys.executable, "-m", "llmgw.sim.engine", "--host", "127.0.0.1", "--port",
                                 str(sim_port), "--model", "m", "--decode-tps", "20", "--prefill-tps", "20",
                                 "--parallel", str(2 * N)], log_path=tmp_path / "sim.log"))
        sim = f"http://127.0.0.1:{sim_port}"
        procs[-1].wait_http(sim + "/health", timeout=30)
        table = tmp_path / "table.json"
        table.write_text(json.dumps({"version": 1, "models": [
            {"name": "m", "state": "Ready", "endpoints": [{"replica_id": "m-1", "url": sim}]}]}))
        procs.append(Proc.start([sys.executable, "-m", "llmgw.router.standalone", "--host", "127.0.0.1", "--port",
                                 str(router_port), "--table-file", str(table)], log_path=tmp_path / "router.log"))
        router = f"http://127.0.0.1:{router_port}"
        procs[-1].wait_http(router + "/v1/models", timeout=30)
        yield router, sim
    finally:
        for proc in reversed(procs):
            proc.stop()


def _mid_stream(router: str, tag: str) -> None:
    body = {"model": "m", "prompt": "x", "max_tokens": 400, "stream": True, "user": tag}  # 20 s if not cut
    with httpx.Client(timeout=30) as client, client.stream("POST", router + "/v1/completions", json=body) as r:
        reader = r.iter_bytes()
        assert r.status_code == 200
        next(reader)  # a token arrived: the engine is generating; now leave
        r.close()


def _before_first_token(router: str, tag: str, *, stream: bool) -> None:
    body = {"model": "m", "prompt": "y" * 400, "max_tokens": 50, "stream": stream, "user": tag}
    with pytest.raises(httpx.ReadTimeout):  # headers never came: the client gives up and closes
        httpx.post(router + "/v1/completions", json=body, timeout=httpx.Timeout(10, read=1.0))


def test_every_client_that_leaves_is_aborted_at_the_engine(setup: tuple[str, str]) -> None:
    """Mid-stream and before-first-token disconnects, streamed and not: each one aborted, none completed."""
    router, sim = setup
    jobs = [(_mid_stream, f"mid-{i}", {}) for i in range(N)]
    jobs += [(_before_first_token, f"early-{i}", {"stream": i % 2 == 0}) for i in range(N)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        for future in [pool.submit(fn, router, tag, **kw) for fn, tag, kw in jobs]:
            future.result(timeout=60)
    tags = {tag for _, tag, _ in jobs}
    stats = wait_for(lambda: (s := httpx.get(sim + "/sim/stats", timeout=5).json())["aborted"] >= len(tags) and s,
                     timeout=15, what="every request aborted at the engine")
    assert isinstance(stats, dict)
    assert {a["user"] for a in stats["aborts"]} == tags
    assert stats["aborted"] == len(tags) and stats["completed"] == 0
    assert stats["running"] == 0 and stats["waiting"] == 0
