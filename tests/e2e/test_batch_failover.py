"""A batch across two control planes on one PostgreSQL, the leader killed with SIGKILL mid-batch (issue 32).

Two control planes (A leads, B stands by) on a real PostgreSQL, an agent with a sim model, and a standalone
router told of both, which runs the batch's lines (the control planes' own routers run none here:
``--batch-concurrency 0``, so that the one killed holds no line). Through the router, with the real ``openai``
SDK: a file of 2,000 lines uploaded, a batch created; once a few hundred lines are answered, A is killed. The
router's claims and results go to B from then on, B's leader step finishes the batch, and the output file has
each custom_id once; the sim engine, which tags each request by its ``user`` field (the line's custom_id), answered
each line once.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmgw.testing.burst import StandaloneRouter
from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model

LEASE = ("--lease", "2s", "--lease-renew", "0.25s", "--batch-concurrency", "0")
MODEL = "bm"
LINES = 2000
_names = itertools.count(1)


@pytest.fixture(scope="module")
def pg() -> Iterator[Postgres]:
    with Postgres() as server:
        yield server


@pytest.fixture
def ha(tmp_path: Path, pg: Postgres) -> Iterator[tuple[System, System, StandaloneRouter, str]]:
    url = pg.create_database(f"batch{next(_names)}")
    a = System(tmp_path / "a", database=url, server_args=LEASE, node_grace_s=60)
    b = System(tmp_path / "b", database=url, ca_from=tmp_path / "a" / "data" / "pki", server_args=LEASE,
               node_grace_s=60)
    router: StandaloneRouter | None = None
    try:
        a.start_server()
        b.token = a.token
        b.start_server()
        a.start_agent("node1")
        a.apply(sim_model(MODEL, replicas=1, args=["--decode-tps", "2000", "--parallel", "16"]))
        a.wait_model(MODEL, timeout=60)
        made = a.request("POST", "/api/v1/keys", json={"name": "batcher"})
        assert made.status_code == 201, made.text
        router = StandaloneRouter(a, tmp_path, "r1", controls=(a.url, b.url))
        router.start()
        yield a, b, router, made.json()["key"]
    finally:
        if router is not None:
            router.stop()
        b.close()
        a.close()


def _line(i: int) -> dict[str, Any]:
    return {"custom_id": f"id-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "user": f"id-{i}", "max_tokens": 4,
                     "messages": [{"role": "user", "content": f"line {i}"}]}}


def test_the_leader_killed_mid_batch_answers_no_line_twice(ha: Any) -> None:
    a, b, router, key = ha
    oai = openai.OpenAI(base_url=router.url + "/v1", api_key=key, max_retries=3, timeout=30)
    wait_for(lambda: httpx.get(router.url + "/v1/models", headers={"Authorization": f"Bearer {key}"},
                               timeout=5).status_code == 200, timeout=30, what="the router serving")
    data = b"\n".join(json.dumps(_line(i)).encode() for i in range(LINES))
    f = oai.files.create(file=("in.jsonl", data), purpose="batch")
    batch = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(lambda: oai.batches.retrieve(batch.id).request_counts.completed >= 300, timeout=120, interval=0.2,
             what="300 lines answered")
    assert a.server is not None
    a.server.signal(signal.SIGKILL)
    a.server.stop(timeout=5)
    a.server = None
    killed_at = oai.batches.retrieve(batch.id).request_counts.completed
    assert killed_at < LINES, "the batch finished before the kill: nothing was tested"

    def done() -> bool:
        try:
            return oai.batches.retrieve(batch.id).status == "completed"
        except openai.APIError:
            return False  # B taking over: the router's next try reaches it

    wait_for(done, timeout=240, interval=0.5, what="the batch completed by B")
    final = oai.batches.retrieve(batch.id)
    counts = final.request_counts
    assert (counts.total, counts.completed, counts.failed) == (LINES, LINES, 0)
    out = [json.loads(x) for x in oai.files.content(final.output_file_id).text.splitlines()]
    ids = Counter(e["custom_id"] for e in out)
    assert set(ids) == {f"id-{i}" for i in range(LINES)} and set(ids.values()) == {1}
    assert all(e["response"]["status_code"] == 200 for e in out)
    # The engine's own count, by the custom_id each request carried as its user.
    (replica,) = b.replicas(MODEL)
    stats = httpx.get(str(replica["endpoint"]) + "/sim/stats", timeout=10, trust_env=False).json()
    at_engine = Counter(x["user"] for x in stats["arrivals"] if x["user"].startswith("id-"))
    assert len(at_engine) == LINES and set(at_engine.values()) == {1}, at_engine.most_common(3)
    print(f"\nleader killed with {killed_at} of {LINES} lines answered; completed by B at {time.strftime('%X')}, "
          "each line answered once at the engine")

