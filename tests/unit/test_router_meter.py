"""Metering (``router.metering``) and the usage journal (``router.usagejournal``): usage found in streams and
whole answers, the usage the router asked for stripped from what the client gets, a client that left charged for
what was generated, and records that survive a crash (replayed with the same seqs) and go once acknowledged."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from llmgw.api import usage as wire
from llmgw.core import quota
from llmgw.router import metering, metrics, request, usagejournal
from llmgw.router.auth import KeyInfo
from llmgw.router.table import Endpoint, ModelRoute
from llmgw.sim.ledger import SimLedger

KEY = KeyInfo(id="k1", project="team-a", user="ann")
ROUTE = ModelRoute(name="m", served_name="m", prices=quota.Prices(input_per_1m=1.0, cached_input_per_1m=0.5,
                                                                  output_per_1m=2.0))


def sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def chunk(i: int, usage: dict[str, Any] | None = None, *, choices: bool = True) -> bytes:
    doc: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk",
                           "choices": [{"index": 0, "delta": {"content": f" tok{i}"}}] if choices else []}
    if usage is not None:
        doc["usage"] = usage
    return sse(doc)


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def stream_req(options: dict[str, Any] | None = None) -> request.CompletionRequest:
    doc: dict[str, Any] = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    if options is not None:
        doc["stream_options"] = options
    return request.parse(json.dumps(doc).encode())


def meter() -> tuple[metering.Meter, list[wire.UsageRecord]]:
    kept: list[wire.UsageRecord] = []
    return metering.Meter(lambda record: kept.append(wire.UsageRecord(1, *record))), kept


def test_a_stream_without_include_usage_is_asked_for_it_and_the_client_never_sees_it() -> None:
    m, kept = meter()
    metered = m.start(KEY, ROUTE)
    req = stream_req()
    body = json.loads(metered.ask_usage(req, "/v1/chat/completions", req.body))
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    relayed = [metered.feed(chunk(i, usage(12, i + 1, cached=8))) for i in range(3)]
    assert relayed[:3] == [chunk(i) for i in range(3)]  # the usage asked for is not the client's
    final = chunk(0, usage(12, 3, cached=8), choices=False) + b"data: [DONE]\n\n"
    relayed.append(metered.feed(final))
    assert relayed[-1] == b"data: [DONE]\n\n"  # the usage-only chunk is gone, [DONE] stays
    metered.served_by(Endpoint(replica_id="m-1", url="http://x", node="node-a"))
    metered.ended(200, "m-1", 0.05, 0.2)
    m.close(metered)
    record, = kept
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (12, 8, 3)
    assert record.spend_micros == 4 * 1 + 8 * 0.5 + 3 * 2
    assert (record.project, record.key, record.user, record.model) == ("team-a", "k1", "ann", "m")
    assert (record.node, record.replica, record.status, record.ttft_ms) == ("node-a", "m-1", 200, 50.0)


def test_stream_options_without_include_usage_are_kept_and_completed() -> None:
    metered = meter()[0].start(KEY, ROUTE)
    req = stream_req({"continuous_usage_stats": False})
    body = json.loads(metered.ask_usage(req, "/v1/chat/completions", req.body))
    assert body["stream_options"]["include_usage"] is True and body["messages"][0]["content"] == "hi"


def test_a_client_that_asked_for_usage_gets_the_stream_as_the_engine_wrote_it() -> None:
    m, kept = meter()
    metered = m.start(KEY, ROUTE)
    req = stream_req({"include_usage": True})
    assert metered.ask_usage(req, "/v1/chat/completions", req.body) == req.body
    final = chunk(0, usage(5, 2), choices=False) + b"data: [DONE]\n\n"
    assert metered.feed(chunk(0, None)) == chunk(0, None)
    assert metered.feed(final) == final
    metered.ended(200, "m-1", 0.01, 0.02)
    m.close(metered)
    assert (kept[0].prompt_tokens, kept[0].completion_tokens) == (5, 2)


def test_a_client_that_leaves_is_charged_the_last_usage_seen() -> None:
    m, kept = meter()
    metered = m.start(KEY, ROUTE)
    for i in range(4):
        metered.feed(chunk(i, usage(30, i + 1)))
    metered.ended(200, "m-1", 0.01, 0.5)  # cancelled mid-stream: no final chunk, no [DONE]
    m.close(metered)
    assert (kept[0].prompt_tokens, kept[0].completion_tokens) == (30, 4)


def test_a_client_that_leaves_a_stream_without_usage_is_charged_one_token_per_event() -> None:
    m, kept = meter()
    metered = m.start(KEY, ROUTE)
    for i in range(3):
        metered.feed(chunk(i, None))
    metered.ended(499, "m-1", 0.01, 0.5)
    m.close(metered)
    assert (kept[0].prompt_tokens, kept[0].completion_tokens, kept[0].status) == (0, 3, 499)


def test_a_whole_answer_s_usage_is_found_from_its_end() -> None:
    m, kept = meter()
    metered = m.start(KEY, ROUTE)
    body = json.dumps({"id": "x", "choices": [{"message": {"content": 'say "usage": 99'}}],
                       "usage": usage(7, 9, cached=4)}).encode()
    metered.whole(body)
    metered.ended(200, "m-1", 0.1, 0.1)
    m.close(metered)
    assert (kept[0].prompt_tokens, kept[0].cached_tokens, kept[0].completion_tokens) == (7, 4, 9)


def test_a_request_never_forwarded_has_no_record_and_counters_are_bounded() -> None:
    m, kept = meter()
    m.close(m.start(KEY, ROUTE))
    assert kept == []
    for i in range(metrics.MAX_USAGE_PAIRS + 5):
        metrics.count_usage(f"p{i}", "m", 1, 1)
    assert len(metrics._usage) <= metrics.MAX_USAGE_PAIRS + 1 and metrics.OTHER in metrics._usage
    assert b"llmgw_router_project_tokens_total" in metrics.render()[0]


def _record(i: int) -> tuple[Any, ...]:
    return (1.0 + i, "team-a", "k1", "", "m", "", "r", i, 0, 1, 0, 200, 1.0, 2.0)


def test_a_journal_replays_after_a_crash_with_the_same_seqs_and_is_counted_once(tmp_path: Path) -> None:
    ledger = SimLedger()

    async def main() -> None:
        first = usagejournal.UsageJournal("r1", ledger.ingest, tmp_path)
        for i in range(5):
            first.append(_record(i))
        await first.flush()  # stored: 1-5
        for i in range(5, 8):
            first.append(_record(i))
        crashed = first.journal_id
        await asyncio.sleep(0)  # the turn of the event loop that ended those requests ends: they are written
        del first  # kill -9: never stopped, 6-8 never acknowledged
        second = usagejournal.UsageJournal("r1", ledger.ingest, tmp_path)
        assert second.journal_id != crashed and second.pending == 3
        second.append(_record(100))
        await second.flush()
        assert second.pending == 0
        await second.stop()
        third = usagejournal.UsageJournal("r1", ledger.ingest, tmp_path)
        assert third.pending == 0  # acknowledged segments were deleted; only the open one's acked lines remain
        await third.flush()
        assert [(r.seq, r.prompt_tokens) for r in ledger.records if r.at < 50] == \
            [(i + 1, i) for i in range(8)]
        assert ledger.marks[crashed] == 8

    asyncio.run(asyncio.wait_for(main(), 30))
    assert len(ledger.records) == 9  # 8 from the crashed journal, once each, and the new one's


def test_a_batch_sent_again_is_not_counted_twice(tmp_path: Path) -> None:
    ledger = SimLedger()
    sent: list[wire.UsageBatch] = []

    async def lossy(batch: wire.UsageBatch) -> wire.UsageAck:
        sent.append(batch)
        ack = await ledger.ingest(batch)
        if len(sent) == 1:
            raise ConnectionError("the ack was lost")
        return ack

    async def main() -> None:
        journal = usagejournal.UsageJournal("r1", lossy, None)
        for i in range(3):
            journal.append(_record(i))
        try:
            await journal.flush()
        except ConnectionError:
            pass
        await journal.flush()
        assert journal.pending == 0

    asyncio.run(asyncio.wait_for(main(), 30))
    assert [r.seq for r in sent[0].records] == [r.seq for r in sent[1].records] == [1, 2, 3]
    assert len(ledger.records) == 3


def test_a_journal_s_rows_make_the_same_document_as_records() -> None:
    """The journal hands ``UsageRow``s (no object per record); on the wire they are ``UsageRecord``s' documents,
    byte for byte, and the control plane reads them back strictly as ``UsageRecord``s."""
    from llmgw.router import usagehttp

    sent: list[wire.UsageBatch] = []

    async def keep(batch: wire.UsageBatch) -> wire.UsageAck:
        sent.append(batch)
        return wire.UsageAck(batch.journal, batch.records[-1].seq)

    async def main() -> None:
        journal = usagejournal.UsageJournal("r1", keep, None)
        for i in range(3):
            journal.append(_record(i))
        await journal.flush()

    asyncio.run(asyncio.wait_for(main(), 30))
    (batch,) = sent
    assert all(type(r) is wire.UsageRow for r in batch.records)
    records = tuple(wire.UsageRecord(*r) for r in batch.records)
    as_records = wire.UsageBatch(batch.router_id, batch.journal, records)
    expected = json.dumps(as_records.to_doc())
    assert json.dumps(batch.to_doc()) == json.dumps(usagehttp.batch_doc(batch)) == expected
    assert json.dumps(usagehttp.batch_doc(as_records)) == expected
    assert wire.UsageBatch.from_doc(json.loads(expected)) == as_records
    assert [(r.seq, r.at, r.prompt_tokens, r.ttft_ms) for r in batch.records] == \
        [(r.seq, r.at, r.prompt_tokens, r.ttft_ms) for r in records]
