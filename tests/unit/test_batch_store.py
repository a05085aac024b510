"""The batch lines' state in the store (issue 32), on a real SQLite store: each line held by one router at a time
(until its lease runs out), answered once (a second answer is dropped), given back unrun; and a batch past its
completion window expires with its unrun lines in the error file as ``batch_expired``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from llmgw.api import batches as wire
from llmgw.control.batches.config import FilesConfig
from llmgw.control.batches.service import BatchService
from llmgw.control.store.batches import LineResult, NewLine, StoredBatch
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store


def _batch(store: Store, n: int) -> StoredBatch:
    b = StoredBatch("batch_x", "default", "", "", "/v1/completions", "file-x", "24h", None, "in_progress", 0.0,
                    86400.0, {"in_progress": 0.0})
    store.add_batch(b, [NewLine(i, f"c{i}", "m", '{"model":"m"}') for i in range(n)])
    return b


def test_a_line_is_held_by_one_router_answered_once_and_given_back_unrun(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    try:
        _batch(store, 5)
        first = store.claim_lines("r1", ["m"], limit=3, now=100.0, lease_s=60.0)
        assert [c.idx for c in first] == [0, 1, 2] and first[0].custom_id == "c0" and first[0].endpoint == \
            "/v1/completions"
        assert [c.idx for c in store.claim_lines("r2", ["m"], limit=10, now=101.0, lease_s=60.0)] == [3, 4]
        assert store.claim_lines("r2", ["m"], limit=10, now=120.0, lease_s=60.0) == []  # all held
        assert store.claim_lines("r2", ["other"], limit=10, now=500.0, lease_s=60.0) == []  # not its model
        assert store.finish_lines([LineResult("batch_x", 0, 200, '{"a":1}')]) == 1
        assert store.finish_lines([LineResult("batch_x", 0, 500, '{"b":2}')]) == 0  # answered already: kept
        assert store.release_lines("r2", [("batch_x", 1)]) == 0  # r1's, not r2's to give back
        assert store.release_lines("r1", [("batch_x", 1)]) == 1
        again = store.claim_lines("r2", ["m"], limit=10, now=130.0, lease_s=60.0)
        assert [c.idx for c in again] == [1]
        # r1's lease on line 2 ran out (r1 gone), and r2's on 3 and 4: another router takes them; 1 is still r2's.
        assert [c.idx for c in store.claim_lines("r3", ["m"], limit=10, now=180.0, lease_s=60.0)] == [2, 3, 4]
        done = store.finished_lines("batch_x")
        assert [(d.idx, d.status_code, d.response) for d in done] == [(0, 200, '{"a":1}')]
        assert store.batch_counts(["batch_x"]) == {"batch_x": (5, 1, 0)}
    finally:
        store.close()


def test_a_batch_past_its_window_expires_with_the_unrun_lines_in_the_error_file(tmp_path: Path) -> None:
    now = [0.0]
    store = Store.open(tmp_path)
    db = StoreThread(store)

    async def main() -> None:
        service = BatchService(db, FilesConfig(dir=tmp_path / "files"), clock=lambda: now[0])
        _batch(store, 3)
        claimed = await service.claim(wire.LineClaim("r1", ("m",), 1))
        await service.results(wire.LineResults("r1", (wire.Result("batch_x", claimed.lines[0].idx, 200, "{}"),)))
        now[0] = 86401.0
        await service.step()  # past the window: cancelling, no line held
        await service.step()  # then expired, the files written
        b = await service.get("default", "batch_x")
        assert b.status == "expired" and b.expired_at == 86401 and b.request_counts.completed == 1
        errors = [json.loads(x) for x in (await service.content("default", b.error_file_id)).splitlines()]
        assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("c1", "batch_expired"),
                                                                         ("c2", "batch_expired")]
        out = [json.loads(x) for x in (await service.content("default", b.output_file_id)).splitlines()]
        assert [e["custom_id"] for e in out] == ["c0"]
        # Lines of an expired batch are never claimed again.
        assert (await service.claim(wire.LineClaim("r1", ("m",), 10))).lines == ()

    try:
        asyncio.run(main())
    finally:
        db.close()
        store.close()
