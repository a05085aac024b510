"""OpenAI Files and Batches with the real ``openai`` SDK (issue 32): the router's batch runner, the control plane's
batch service over a real store, the sim engine counting every line it answers.

A batch's lines are each answered once with the engine's own body in the output file; invalid lines (bad JSON,
missing fields, another url, a duplicate custom_id) are in the error file with their custom_id and the batch still
completes; a cancel stops the batch and writes what was done; a key sees only its own project's files and
batches; errors are OpenAI's error object. No timed assertion: each test waits for a status, bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.testing.batchcluster import OTHER, SECRET, BatchCluster, Engine, batch_cluster, jsonl, line


def run(test: Any, tmp_path: Path, **kw: Any) -> None:
    async def main() -> None:
        async with batch_cluster(tmp_path, **kw) as c:
            await test(c)
    asyncio.run(asyncio.wait_for(main(), 120))


def client(c: BatchCluster, key: str = SECRET) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=c.url + "/v1", api_key=key, max_retries=0)


async def until(client: openai.AsyncOpenAI, batch_id: str, *statuses: str) -> Any:
    while (b := await client.batches.retrieve(batch_id)).status not in statuses:  # noqa: ASYNC110 (the API's state)
        await asyncio.sleep(0.05)
    return b


def entries(text: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def test_a_batch_completes_with_each_line_answered_once_and_invalid_lines_in_the_error_file(tmp_path: Path) -> None:
    async def test(c: BatchCluster) -> None:
        oai = client(c)
        good = [line(f"r{i}") for i in range(60)]
        bad = [b"{not json", json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}),
               json.dumps(line("r5")),  # a duplicate custom_id
               json.dumps(line("wrong-url", url="/v1/embeddings")),
               json.dumps({"custom_id": "no-body", "method": "POST", "url": "/v1/chat/completions"})]
        f = await oai.files.create(file=("in.jsonl", jsonl([*good[:30], *bad, *good[30:]])), purpose="batch")
        assert f.purpose == "batch" and f.bytes > 0 and f.filename == "in.jsonl"
        b = await oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                                     metadata={"job": "eval"})
        assert b.status == "validating" and b.metadata == {"job": "eval"}
        done = await until(oai, b.id, "completed", "failed")
        assert done.status == "completed"
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (65, 60, 5)
        assert done.in_progress_at and done.finalizing_at and done.completed_at
        out = entries((await oai.files.content(done.output_file_id)).text)
        assert sorted(e["custom_id"] for e in out) == sorted(f"r{i}" for i in range(60))
        for e in out:  # the engine's own answer, once each
            assert e["response"]["status_code"] == 200 and e["error"] is None
            assert e["response"]["body"] == c.engine.bodies[e["custom_id"]]
        assert set(c.engine.count.values()) == {1} and len(c.engine.count) == 60
        errors = entries((await oai.files.content(done.error_file_id)).text)
        assert sorted((str(e["custom_id"]), e["error"]["code"]) for e in errors) == sorted([
            ("None", "invalid_json"), ("None", "missing_custom_id"), ("r5", "duplicate_custom_id"),
            ("wrong-url", "invalid_url"), ("no-body", "missing_body")])
        assert all(e["response"] is None for e in errors)
        listed = [x.id async for x in oai.batches.list(limit=10)]
        assert listed == [b.id]
        out_file = await oai.files.retrieve(done.output_file_id)
        assert out_file.purpose == "batch_output"

    run(test, tmp_path)


def test_cancel_stops_the_batch_and_writes_what_was_done(tmp_path: Path) -> None:
    engine = Engine(decode_tps=5000, prefill_tps=10**6)
    engine.gate = asyncio.Event()

    async def test(c: BatchCluster) -> None:
        oai = client(c)
        f = await oai.files.create(file=("in.jsonl", jsonl([line(f"c{i}") for i in range(200)])), purpose="batch")
        b = await oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        await until(oai, b.id, "in_progress")
        while len(c.router.batches._tasks) < 2:  # type: ignore[union-attr]  # noqa: ASYNC110 (the runner's state)
            await asyncio.sleep(0.02)
        engine.gate.set()  # the lines started run; then the cancel
        while len(engine.count) < 5:  # noqa: ASYNC110 (the engine's state)
            await asyncio.sleep(0.01)
        engine.gate.clear()  # the lines sent from now on wait at the engine: the cancel lands mid-batch
        cancelling = await oai.batches.cancel(b.id)
        assert cancelling.status in ("cancelling", "cancelled")
        engine.gate.set()  # the lines already sent are answered and written; no other is sent
        done = await until(oai, b.id, "cancelled")
        answered = set(engine.count)
        assert 5 <= len(answered) < 200 and set(engine.count.values()) == {1}
        out = entries((await oai.files.content(done.output_file_id)).text)
        assert {e["custom_id"] for e in out} == answered
        assert done.request_counts.completed == len(answered) and done.request_counts.total == 200
        await asyncio.sleep(0.5)  # nothing more runs
        assert set(engine.count) == answered
        assert (await oai.batches.cancel(b.id)).status == "cancelled"  # cancelled again: answered as it is

    run(test, tmp_path, engine=engine, concurrency=2)


def test_a_key_sees_only_its_projects_files_and_batches_and_errors_are_openai_shaped(tmp_path: Path) -> None:
    async def test(c: BatchCluster) -> None:
        mine, theirs = client(c), client(c, OTHER)
        f = await mine.files.create(file=("in.jsonl", jsonl([line("a")])), purpose="batch")
        with pytest.raises(openai.NotFoundError) as seen:
            await theirs.files.retrieve(f.id)
        assert seen.value.body == {"message": f"No such File object: {f.id}", "type": "invalid_request_error",
                                   "param": "file_id", "code": "not_found"}
        assert [x.id async for x in theirs.files.list()] == []
        with pytest.raises(openai.NotFoundError):
            await theirs.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        with pytest.raises(openai.BadRequestError) as bad:
            await mine.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                      completion_window="1h")  # type: ignore[arg-type]
        assert bad.value.body["param"] == "completion_window" and "24h" in bad.value.body["message"]
        with pytest.raises(openai.BadRequestError) as bad:
            await mine.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
        assert bad.value.body["param"] == "purpose"
        with pytest.raises(openai.AuthenticationError) as unauth:
            await client(c, "sk-nobody").files.list()
        assert "llmgw key create" in unauth.value.body["message"]
        with pytest.raises(openai.APIStatusError) as big:
            await mine.files.create(file=("big.jsonl", b"x" * (9 << 20)), purpose="batch")
        assert big.value.status_code == 413 and "--files-max-bytes" in big.value.body["message"]
        gone = await mine.files.delete(f.id)
        assert gone.deleted and gone.id == f.id
        with pytest.raises(openai.NotFoundError):
            await mine.files.content(f.id)

    run(test, tmp_path)
