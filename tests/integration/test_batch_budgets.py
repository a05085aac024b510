"""A batch's lines are charged to their key's budgets of a day or longer, not its per-minute rates (issue 32's left
item): the real ``openai`` SDK, the router's batch runner, the control plane's batch service over a real store, and
the in-memory ledger (``sim.ledger``) as the control plane's budget service.

Before, a key held to 10 requests a day ran a whole batch of any size: a team could spend past its budget by
submitting its work as a batch.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai

from llmgw.sim.ledger import SimLedger
from llmgw.testing.batchcluster import SECRET, BatchCluster, batch_cluster, jsonl, line

PER_DAY = 10


def test_a_batch_stops_at_its_keys_daily_budget_and_not_at_its_per_minute_rate(tmp_path: Path) -> None:
    # 2 a minute would refuse all but 2 lines if batches paid it; 10 a day is what the key may spend.
    limits = {"requests_per_day": PER_DAY, "requests_per_minute": 2}
    ledger = SimLedger({("key:k1", "requests_per_day"): PER_DAY, ("key:k1", "requests_per_minute"): 2})

    async def main() -> None:
        async with batch_cluster(tmp_path, quota=ledger.sync, key_limits=limits) as c:
            await test(c)

    async def test(c: BatchCluster) -> None:
        oai = openai.AsyncOpenAI(base_url=c.url + "/v1", api_key=SECRET, max_retries=0)
        f = await oai.files.create(file=("in.jsonl", jsonl([line(f"r{i}") for i in range(25)])), purpose="batch")
        b = await oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        while (done := await oai.batches.retrieve(b.id)).status not in ("completed", "failed"):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        assert done.status == "completed"  # the batch goes on past refused lines, as past invalid ones
        assert (done.request_counts.completed, done.request_counts.failed) == (PER_DAY, 25 - PER_DAY)
        assert len(c.engine.count) == PER_DAY  # the engine saw only what the budget allowed
        out = [json.loads(x) for x in (await oai.files.content(done.output_file_id)).text.splitlines()]
        refused = [json.loads(x) for x in (await oai.files.content(done.error_file_id)).text.splitlines()]
        assert sorted(e["custom_id"] for e in out) == sorted(c.engine.count)
        assert {e["custom_id"] for e in out} | {e["custom_id"] for e in refused} == {f"r{i}" for i in range(25)}
        for e in refused:  # the budget's own 429, naming it
            assert e["response"]["status_code"] == 429, e
            body: dict[str, Any] = e["response"]["body"]
            assert "requests_per_day" in body["error"]["message"], body

        # An interactive request of the key finds the day's budget spent by the batch.
        try:
            await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        except openai.RateLimitError as e:
            assert "requests_per_day" in str(e)
        else:
            raise AssertionError("the key's daily budget was spent by its batch; this request must be refused")

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_batch_spends_its_projects_daily_tokens_and_no_more(tmp_path: Path) -> None:
    """Tokens are reserved as an interactive request's are and charged as each line used them (its usage): the lines
    that ran fit the project's budget, and the rest are refused naming it."""
    budget = 60  # a line of the echoing sim uses 3 tokens: some 20 of the 40 run
    ledger = SimLedger({("project:team-a", "tokens_per_day"): budget})

    async def main() -> None:
        async with batch_cluster(tmp_path, quota=ledger.sync, project_limits={"tokens_per_day": budget},
                                 concurrency=1) as c:
            oai = openai.AsyncOpenAI(base_url=c.url + "/v1", api_key=SECRET, max_retries=0)
            f = await oai.files.create(file=("in.jsonl", jsonl([line(f"r{i}") for i in range(40)])), purpose="batch")
            b = await oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
            while (done := await oai.batches.retrieve(b.id)).status not in ("completed", "failed"):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            assert done.status == "completed"
            out = [json.loads(x) for x in (await oai.files.content(done.output_file_id)).text.splitlines()]
            refused = [json.loads(x) for x in (await oai.files.content(done.error_file_id)).text.splitlines()]
            used = [e["response"]["body"]["usage"]["total_tokens"] for e in out]
            assert out and refused and len(out) + len(refused) == 40
            # Never past the budget; refused only once what is left is less than a line's reservation (the prompt's
            # estimate plus max_tokens, ``budgets.needs``) and what a line uses.
            reserve = len(json.dumps(line("r10")["body"]).encode()) // 4 + 8
            assert sum(used) <= budget < sum(used) + reserve + max(used)
            assert all("tokens_per_day" in e["response"]["body"]["error"]["message"] for e in refused)

    asyncio.run(asyncio.wait_for(main(), 120))
