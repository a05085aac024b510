"""A 2,000-line batch with the real ``openai`` SDK (issue 32): the router's batch runner, the control plane's batch
service over a real store and the sim engine, every line counted at the engine by its custom_id.

The output file has each custom_id once, with the body the engine answered it with; the engine answered each
once; the usage of the lines is metered in the key's project under the batch marker (``batch:<user>``).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import openai

from llmgw.router.batchrun import BATCH_USER
from llmgw.testing.batchcluster import SECRET, BatchCluster, batch_cluster, jsonl, line

LINES = 2000


def test_a_2000_line_batch_completes_with_every_line_answered_once(tmp_path: Path) -> None:
    records: list[Any] = []

    async def usage(batch: Any) -> Any:
        from llmgw.api.usage import UsageAck
        records.extend(batch.records)
        return UsageAck(batch.journal, max(r.seq for r in batch.records))

    async def main() -> None:
        async with batch_cluster(tmp_path, concurrency=8, usage=usage) as c:
            await check(c)

    async def check(c: BatchCluster) -> None:
        oai = openai.AsyncOpenAI(base_url=c.url + "/v1", api_key=SECRET, max_retries=0)
        f = await oai.files.create(file=("in.jsonl", jsonl([line(f"id-{i}") for i in range(LINES)])), purpose="batch")
        b = await oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        while (b := await oai.batches.retrieve(b.id)).status not in ("completed", "failed"):  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        assert b.status == "completed" and b.error_file_id is None
        assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (LINES, LINES, 0)
        out = [json.loads(x) for x in (await oai.files.content(b.output_file_id)).text.splitlines()]
        ids = Counter(e["custom_id"] for e in out)
        assert len(out) == LINES and set(ids) == {f"id-{i}" for i in range(LINES)} and set(ids.values()) == {1}
        for e in out:
            assert e["response"]["status_code"] == 200
            assert e["response"]["body"] == c.engine.bodies[e["custom_id"]]
        assert sum(c.engine.count.values()) == LINES and set(c.engine.count.values()) == {1}
        while len(records) < LINES:  # noqa: ASYNC110 (the journal sends every few seconds)
            await asyncio.sleep(0.1)
        assert len(records) == LINES
        assert {(r.project, r.key, r.user) for r in records} == {("team-a", "k1", BATCH_USER + "ann")}
        assert sum(r.completion_tokens for r in records) == sum(e["response"]["body"]["usage"]["completion_tokens"]
                                                               for e in out)

    asyncio.run(asyncio.wait_for(main(), 300))
