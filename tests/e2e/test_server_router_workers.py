"""``llmgw server --router-workers 2`` (issue 27): the server and a router worker on one HTTP port, as real processes.

A real server (secure: the admin logs in) with a sim agent and model. Each request below is made on a new
connection, and the process that accepted it is found from the kernel's table (``accepted_by``), so the test
knows the worker took its share:

- OpenAI requests, REST calls (the admin's ``GET /api/v1/models``, a login, ``/healthz``) are answered alike
  whichever process accepted them, and a key's usage is metered exactly across the two;
- ``/metrics``, whichever process accepted the scrape, counts both processes' requests (the worker's pushed);
- a REST stream (a node's log, followed) runs through the worker, its first batch arriving while it is open;
- the worker, killed with SIGKILL, is started again and serves;
- SIGTERM to the server: a stream in flight on the worker finishes, and every process exits within the grace.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model

MODEL = "m"
WAIT_S = 15.0


def workers_of(system: System) -> list[int]:
    """The server's children that are router workers."""
    assert system.server is not None
    try:
        kids = psutil.Process(system.server.pid).children()
        return sorted(p.pid for p in kids if p.status() != psutil.STATUS_ZOMBIE
                      and "llmgw.router.standalone" in " ".join(p.cmdline()))
    except psutil.Error:
        return []


def accepted_by(port: int, client_port: int, pids: list[int]) -> int:
    """Which of ``pids`` holds the server side of the connection from ``client_port`` to ``port``."""
    def find() -> int | None:
        for pid in pids:
            try:
                for c in psutil.Process(pid).net_connections(kind="tcp"):
                    if c.laddr and c.raddr and c.laddr.port == port and c.raddr.port == client_port:
                        return pid
            except psutil.Error:
                continue
        return None

    return int(wait_for(find, timeout=5, interval=0.02, what=f"the process that accepted :{client_port}"))


class Call:
    """One HTTP request on a new connection to the server's port, and which process accepted it."""

    def __init__(self, system: System, pids: list[int]) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", system.http_port, timeout=30)
        self.conn.connect()
        self.pid = accepted_by(system.http_port, self.conn.sock.getsockname()[1], pids)

    def send(self, method: str, path: str, body: Any = None, token: str = "") -> http.client.HTTPResponse:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        return self.conn.getresponse()

    def close(self) -> None:
        self.conn.close()


def once(system: System, pids: list[int], method: str, path: str, body: Any = None,
         token: str = "") -> tuple[int, int, bytes]:
    """(the process that accepted it, status, body) of one request on a new connection."""
    call = Call(system, pids)
    try:
        resp = call.send(method, path, body, token)
        return call.pid, resp.status, resp.read()
    finally:
        call.close()


def on_worker(system: System, pids: list[int], worker: int) -> Call:
    """A new connection the worker accepted (the kernel spreads them: a few tries)."""
    for _ in range(60):
        call = Call(system, pids)
        if call.pid == worker:
            return call
        call.close()
    raise AssertionError("60 connections and none accepted by the worker")


def scraped_requests(text: str) -> float:
    """``llmgw_router_requests_total`` for the model in one exposition (each family at most once in it)."""
    names = [family.name for family in text_string_to_metric_families(text)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "llmgw_router_requests_total" and sample.labels.get("model") == MODEL)


def chat(max_tokens: int = 4, stream: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "stream": stream}


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    made = System(tmp_path / "cp", server_args=["--router-workers", "2"])
    try:
        made.start_server()
        made.start_agent("node1")
        # 50 tokens/s: a 60-token stream takes 1.2 s, in flight while the server is stopped, within its 3 s.
        made.apply(sim_model(MODEL, args=["--decode-tps", "50", "--prefill-tps", "1e6"]))
        made.wait_model(MODEL, timeout=60)
        yield made
    finally:
        made.close()


def test_the_server_and_its_worker_share_the_port_rest_and_openai_alike(system: System) -> None:
    assert system.server is not None
    server = system.server.pid
    ports = json.loads((system.root / "ports.json").read_text())
    assert ports["router_processes"] == 2
    worker = wait_for(lambda: (w := workers_of(system)) and len(w) == 1 and w[0], timeout=WAIT_S,
                      what="the router worker")
    assert isinstance(worker, int) and psutil.Process(worker).ppid() == server
    wait_for(lambda: "[server-" in system.server.log_tail(400) and "]: router on" in system.server.log_tail(400),
             timeout=WAIT_S, what="the worker listening")
    pids = [server, worker]
    made = system.request("POST", "/api/v1/keys", json={"name": "k", "limits": {"requests_per_day": 1000}})
    assert made.status_code == 201, made.text
    key, key_id = made.json()["key"], made.json()["id"]
    wait_for(lambda: once(system, pids, "GET", "/v1/models", token=key)[1] == 200
             and once(system, pids, "GET", "/v1/models", token=key)[1] == 200, timeout=WAIT_S,
             what="the key known to both routers")

    seen: dict[str, set[int]] = {"openai": set(), "rest": set(), "login": set(), "healthz": set()}
    for _ in range(30):
        pid, status, body = once(system, pids, "POST", "/v1/chat/completions", chat(), token=key)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4, (pid, status, body)
        seen["openai"].add(pid)
        pid, status, body = once(system, pids, "GET", "/api/v1/models", token=system.token)
        assert status == 200 and [m["metadata"]["name"] for m in json.loads(body)["items"]] == [MODEL], body
        seen["rest"].add(pid)
        pid, status, body = once(system, pids, "GET", "/healthz")
        assert status == 200, body
        seen["healthz"].add(pid)
    for _ in range(10):
        pid, status, body = once(system, pids, "POST", "/api/v1/login",
                                 {"username": "admin", "password": system.admin_password})
        assert status == 200 and json.loads(body)["token"], body
        seen["login"].add(pid)
        pid, status, _ = once(system, pids, "GET", "/api/v1/models", token="not-a-token")
        assert status == 401
    assert seen["openai"] == seen["rest"] == set(pids), seen  # both processes served both APIs
    assert seen["login"] | seen["healthz"] == set(pids), seen

    # Metered exactly across the processes: the 30 requests stored once each.
    def stored() -> int:
        rows = system.get("/api/v1/usage?since=1d&by=key")["rows"]
        return int(next((r for r in rows if r.get("group") == key_id), {}).get("requests", 0))

    wait_for(lambda: stored() == 30, timeout=30, interval=0.5, what="30 requests stored")

    # The server's /metrics: the in-process router's and the worker's requests summed, one family each.
    time.sleep(3.0)  # a push interval (2 s) and some
    scraped: set[int] = set()
    for _ in range(12):
        pid, status, body = once(system, pids, "GET", "/metrics", token=system.token)
        assert status == 200, body[:300]
        assert scraped_requests(body.decode()) == 30, body.decode()[:2000]
        scraped.add(pid)
    assert scraped == set(pids), scraped

    # A REST stream through the worker: the follow of a node's log, its first batch while it stays open.
    call = on_worker(system, pids, worker)
    try:
        resp = call.send("GET", "/api/v1/nodes/node1/logs?follow=true&lines=5", token=system.token)
        assert resp.status == 200 and resp.getheader("content-type", "").startswith("application/x-ndjson")
        first = json.loads(resp.readline())
        assert isinstance(first["lines"], list) and first["lines"], first
        assert not resp.isclosed()
    finally:
        call.close()

    # SIGKILL to the worker: started again, and serving.
    os.kill(worker, signal.SIGKILL)
    again = wait_for(lambda: (w := workers_of(system)) and len(w) == 1 and w[0] != worker and w[0],
                     timeout=WAIT_S, what="the worker started again")
    assert isinstance(again, int)
    assert f"(pid {worker}) ended (SIGKILL)" in system.server.log_tail(400)
    wait_for(lambda: system.server.log_tail(400).count("]: router on") == 2, timeout=WAIT_S,
             what="the new worker listening")
    pids = [server, again]
    wait_for(lambda: once(system, pids, "GET", "/v1/models", token=key)[1] == 200, timeout=WAIT_S, what="serving")
    served = set()
    for _ in range(20):
        pid, status, _ = once(system, pids, "POST", "/v1/chat/completions", chat(), token=key)
        assert status == 200
        served.add(pid)
    assert served == set(pids), served

    # SIGTERM: a stream in flight on the worker finishes; every process exits within the grace (3 s, and a little).
    call = on_worker(system, pids, again)
    resp = call.send("POST", "/v1/chat/completions", chat(max_tokens=60, stream=True), token=key)
    assert resp.status == 200
    text = resp.readline().decode()
    t0 = time.monotonic()
    os.kill(server, signal.SIGTERM)
    text += resp.read().decode()
    call.close()
    assert "data: [DONE]" in text, text[-300:]
    assert system.server.popen.wait(15) == 0, system.server.log_tail(40)
    took = time.monotonic() - t0
    assert not psutil.pid_exists(again) or psutil.Process(again).status() == psutil.STATUS_ZOMBIE
    assert took < 8.0, took
    print(f"\n--router-workers 2: accepted by {seen}; stopped in {took:.1f}s", file=sys.stderr)
