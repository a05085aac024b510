"""Priority classes and weighted fair queuing through a real router process (issue 32).

A sim engine behind standalone routers whose table allows the model one request at a time and lists keys in two
projects, ``heavy`` and ``light``, and a ``batch``-class key. A long stream holds the slot; requests queue in a
known order; the stream ends and the order the sim served them in (each answer's completion, one at a time) shows
the queue's decision: the light project's requests are not behind the heavy one's, and batch goes last.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.core.priorities import HEADER
from llmgw.testing.procs import wait_for
from llmgw.testing.routed import Procs, started

SECRETS = {"heavy": "sk-heavy-0123456789", "light": "sk-light-0123456789", "bulk": "sk-bulk-0123456789",
           "holder": "sk-holder-0123456789"}
PROJECTS = {"heavy": "heavy", "light": "light", "bulk": "heavy", "holder": "other"}


def _table(sim: str) -> dict[str, Any]:
    keys = [{"id": name, "sha256": hashlib.sha256(secret.encode()).hexdigest(), "project": PROJECTS[name],
             **({"priority_class": "batch"} if name == "bulk" else {})} for name, secret in SECRETS.items()]
    return {"version": 1, "auth": {"required": True, "keys": keys,
                                   "projects": [{"name": "light", "limits": {}, "weight": 1.0}]},
            "models": [{"name": "m", "state": "Ready", "routing": "round_robin", "limits": {"concurrency": 1},
                        "endpoints": [{"replica_id": "m-0", "url": sim}]}]}


@pytest.fixture(scope="module")
def routers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    tmp: Path = tmp_path_factory.mktemp("fairq")
    with started(tmp) as procs:
        yield _start(procs)


def _start(procs: Procs) -> tuple[str, str, str]:
    sim = procs.sim("m", "--decode-tps", "100")
    table = _table(sim)
    keyed = lambda status, _body: status == 401  # noqa: E731  (the table is served: it requires a key)
    fair = procs.spawn_router("--admission-wait", "60", table=table, expect=keyed)
    fifo = procs.spawn_router("--admission-wait", "60", "--admission-order", "fifo", table=table, expect=keyed)
    return fair, fifo, sim


def _queued(router: str) -> int:
    found = re.search(r"^llmgw_router_queued_requests (\S+)$", httpx.get(router + "/metrics", timeout=5).text, re.M)
    return int(float(found.group(1))) if found else 0


def _served_order(router: str, sim: str, sends: list[tuple[str, str, dict[str, str]]]) -> list[str]:
    """Holds the slot with a stream, queues ``sends`` (label, key, headers) in order, frees the slot; the labels
    (each request's prompt) in the order the engine received them."""
    before = len(httpx.get(sim + "/sim/stats", timeout=5).json()["requests"])

    def post(label: str, key: str, headers: dict[str, str]) -> None:
        answer = httpx.post(router + "/v1/completions", timeout=60,
                            headers={"Authorization": f"Bearer {SECRETS[key]}", **headers},
                            json={"model": "m", "prompt": label, "max_tokens": 2})
        assert answer.status_code == 200, answer.text

    holder = {"model": "m", "prompt": "x", "max_tokens": 100000, "stream": True}
    with httpx.Client(timeout=60) as client, concurrent.futures.ThreadPoolExecutor(len(sends)) as pool, \
            client.stream("POST", router + "/v1/completions", json=holder,
                          headers={"Authorization": f"Bearer {SECRETS['holder']}"}) as stream:
        assert stream.status_code == 200
        reader = stream.iter_bytes()  # kept: an iterator dropped mid-stream is finalized, closing the response
        next(reader)  # generating: the model's one slot is taken
        futures = []
        for n, (label, key, headers) in enumerate(sends, start=1):
            futures.append(pool.submit(post, label, key, headers))
            wait_for(lambda n=n: _queued(router) == n, timeout=10, what=f"{label} queued")
        stream.close()
        for f in futures:
            f.result(timeout=60)
    received = httpx.get(sim + "/sim/stats", timeout=5).json()["requests"][before:]
    return [body["prompt"] for body in received if body["prompt"] != "x"]


SENDS = [*((f"heavy{i}", "heavy", {}) for i in range(4)), ("bulk", "bulk", {}), ("light0", "light", {}),
         ("lowered", "light", {HEADER: "batch"}), ("light1", "light", {HEADER: "interactive"})]


def test_the_light_project_is_not_behind_the_heavy_queue_and_batch_goes_last(routers: tuple[str, str, str]) -> None:
    fair, _, sim = routers
    order = _served_order(fair, sim, SENDS)
    # Interactive first: the two projects alternate (heavy's first came first), then heavy's rest;
    # then batch, first come first served: the batch key's, then the request that lowered itself.
    assert order == ["heavy0", "light0", "heavy1", "light1", "heavy2", "heavy3", "bulk", "lowered"]
    metrics = httpx.get(fair + "/metrics", timeout=5).text
    assert 'llmgw_router_queue_wait_seconds_count{class="interactive",project="light"} 2.0' in metrics
    assert 'llmgw_router_queue_wait_seconds_count{class="batch",project="heavy"} 1.0' in metrics
    assert 'llmgw_router_queued_requests_by_class{class="batch"} 0.0' in metrics


def test_first_come_first_served_keeps_arrival_order_within_a_class(routers: tuple[str, str, str]) -> None:
    _, fifo, sim = routers
    order = _served_order(fifo, sim, SENDS)
    assert order == ["heavy0", "heavy1", "heavy2", "heavy3", "light0", "light1", "bulk", "lowered"]


def test_a_class_the_cluster_does_not_have_is_refused_naming_the_header(routers: tuple[str, str, str]) -> None:
    fair, _, _ = routers
    answer = httpx.post(fair + "/v1/completions", timeout=30, json={"model": "m", "prompt": "x", "max_tokens": 2},
                        headers={"Authorization": f"Bearer {SECRETS['light']}", HEADER: "urgent"})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "unknown_priority_class" and HEADER in error["message"]
    assert "interactive, batch" in error["message"]
