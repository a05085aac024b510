"""/v1/messages when the model's admission queue is full: a 429 ``overloaded_error`` with Retry-After.

A router process over two sim engines allowing one request each (as ``tests/integration/
test_replica_limits_routed.py``), both taken by streams; the Messages request waits past ``--admission-wait``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx

from llmgw.testing import anthropic_schema
from llmgw.testing.routed import started


def test_a_full_admission_queue_is_an_overloaded_error(tmp_path: Path) -> None:
    """Both replicas' one slot taken (as ``test_replica_limits_routed``): a Messages request past the wait is 429."""
    with started(tmp_path) as p:
        sims = [p.sim("m", "--decode-tps", "20") for _ in range(2)]
        router = p.router([{"name": "m", "state": "Ready", "routing": "round_robin",
                            "limits": {"concurrency_per_replica": 1},
                            "endpoints": [{"replica_id": f"m-{i}", "url": u} for i, u in enumerate(sims)]}],
                          "--admission-wait", "0.5")
        long = {"model": "m", "prompt": "x", "max_tokens": 400, "stream": True}
        with httpx.Client(timeout=30) as client, contextlib.ExitStack() as stack:
            opened = [stack.enter_context(client.stream("POST", router + "/v1/completions", json=long))
                      for _ in sims]
            readers = [r.iter_bytes() for r in opened]  # kept: a dropped iterator closes its response
            for reader in readers:
                next(reader)  # generating: that replica's one slot is taken
            refused = client.post(router + "/v1/messages", json={
                "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
        assert refused.status_code == 429, refused.text
        anthropic_schema.validate("error", refused.json())
        assert refused.json()["error"]["type"] == "overloaded_error" and int(refused.headers["retry-after"]) >= 1
