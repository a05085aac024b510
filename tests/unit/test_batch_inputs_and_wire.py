"""A batch's input read line by line, and the batch documents on the control plane <-> router wire (issue 32).

Each kind of invalid line is reported with its custom_id (when it had one) and a code, never failing the others;
the wire documents are read strictly, a bad field named.
"""

from __future__ import annotations

import json

import pytest

from llmgw.api import batches as wire
from llmgw.api.reports import BadReport
from llmgw.control.batches.inputs import read_lines


def _line(cid: object, **over: object) -> bytes:
    doc = {"custom_id": cid, "method": "POST", "url": "/v1/embeddings", "body": {"model": "e", "input": "x"}}
    doc.update(over)
    return json.dumps(doc).encode()


def test_valid_lines_keep_their_order_and_body_and_invalid_ones_say_why() -> None:
    data = b"\n".join([
        _line("a"), b"", b"{oops", json.dumps([1]).encode(), _line(""), _line("a"), _line("b", method="GET"),
        _line("c", url="/v1/chat/completions"), _line("d", body="text"), _line("e", body={"input": "x"}),
        _line("f", body={"model": "e", "stream": True}), _line("g")])
    got = read_lines(data, "/v1/embeddings")
    assert [(n.idx, n.custom_id, json.loads(n.error)["code"] if n.error else "") for n in got] == [
        (0, "a", ""), (2, None, "invalid_json"), (3, None, "invalid_request"), (4, None, "missing_custom_id"),
        (5, "a", "duplicate_custom_id"), (6, "b", "invalid_method"), (7, "c", "invalid_url"), (8, "d", "missing_body"),
        (9, "e", "missing_model"), (10, "f", "invalid_request"), (11, "g", "")]
    assert json.loads(got[0].body) == {"model": "e", "input": "x"} and got[0].model == "e"
    assert "line 8: url '/v1/chat/completions' is not the batch's endpoint /v1/embeddings" in got[6].error


def test_the_wire_documents_round_trip_and_refuse_a_bad_field() -> None:
    claim = wire.LineClaim("r1", ("m", "alias"), 8)
    assert wire.LineClaim.from_doc(claim.to_doc()) == claim
    line = wire.Line("batch_1", 3, "c3", "m", "/v1/completions", '{"model":"m"}', "team", "k1", "ann")
    lines = wire.ClaimedLines((line,), 600.0)
    assert wire.ClaimedLines.from_doc(lines.to_doc()) == lines
    results = wire.LineResults("r1", (wire.Result("batch_1", 3, 200, "{}"),), (("batch_1", 4),), ("batch_1",))
    assert wire.LineResults.from_doc(json.loads(json.dumps(results.to_doc()))) == results
    assert wire.ResultsAck.from_doc({"written": 1, "stopped": ["batch_1"], "newer": True}) == \
        wire.ResultsAck(1, ("batch_1",))
    with pytest.raises(BadReport, match=r"^claim.max_lines must be a whole number from 0 to 1000"):
        wire.LineClaim.from_doc({"router": "r1", "models": ["m"], "max_lines": 5000})
    with pytest.raises(BadReport, match=r"^results.released must be \[batch, line\] pairs"):
        wire.LineResults.from_doc({"router": "r1", "results": [], "released": [["b", -1]]})
    with pytest.raises(BadReport, match=r"^result.status_code must be a whole number"):
        wire.LineResults.from_doc({"router": "r1", "results": [{"batch": "b", "idx": 0, "status_code": "200"}]})


@pytest.mark.parametrize(("path", "served"), [
    ("/v1/files", True), ("/v1/files/file-1/content", True), ("/v1/batches/batch_1/cancel", True),
    ("/v1/filesystem", False), ("/v1/chat/completions", False), ("/api/v1/files", False)])
def test_the_control_plane_serves_files_and_batches_only(path: str, served: bool) -> None:
    assert wire.openai_path(path) is served
