"""Files and batches on ``llmgw server``'s own port, run by its in-process router (issue 32), with the real ``openai``
SDK: a real server (SQLite), an agent, a sim model. The batch completes with each line answered once, the files'
bytes are 0600 files of the data directory named by their ids, and a deleted file's bytes are gone.
"""

from __future__ import annotations

import json
import stat
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model

MODEL = "bsm"
LINES = 120


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    s = System(tmp_path / "s")
    try:
        s.start_server()
        s.start_agent("node1")
        s.apply(sim_model(MODEL, replicas=1, args=["--decode-tps", "2000"]))
        s.wait_model(MODEL, timeout=60)
        yield s
    finally:
        s.close()


def test_a_batch_on_the_servers_port_runs_in_its_router(system: System) -> None:
    made = system.request("POST", "/api/v1/keys", json={"name": "batcher"})
    assert made.status_code == 201, made.text
    oai = openai.OpenAI(base_url=system.url + "/v1", api_key=made.json()["key"], max_retries=2, timeout=30)
    lines = [{"custom_id": f"s{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": f"line {i}", "max_tokens": 4}} for i in range(LINES)]
    f = oai.files.create(file=("in.jsonl", "\n".join(json.dumps(x) for x in lines).encode()), purpose="batch")
    stored = system.data_dir / "files" / f.id
    assert stored.read_bytes().count(b"\n") == LINES - 1
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600 and stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
    batch = oai.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
    wait_for(lambda: oai.batches.retrieve(batch.id).status == "completed", timeout=120, interval=0.3,
             what="the batch completed")
    done = oai.batches.retrieve(batch.id)
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (LINES, LINES, 0)
    out = [json.loads(x) for x in oai.files.content(done.output_file_id).text.splitlines()]
    assert Counter(e["custom_id"] for e in out) == Counter(f"s{i}" for i in range(LINES))
    assert all(e["response"]["body"]["object"] == "text_completion" for e in out)
    assert oai.files.delete(f.id).deleted and not stored.exists()
    assert [b.id for b in oai.batches.list()] == [batch.id]
