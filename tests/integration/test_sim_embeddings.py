"""The sim engine's /v1/embeddings as a process: what the openai client sends, deterministic vectors, refusals."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmgw.sim import engine as sim_engine
from llmgw.testing import openai_schema, procs

MODEL = "sim-embed"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A sim engine without a key, started as its own process."""
    port = procs.free_port()
    log = Path(tmp_path_factory.mktemp("sim-embed")) / "engine.log"
    proc = procs.Proc.start([sys.executable, "-m", "llmgw.sim.engine", "--model", MODEL, "--port", str(port)],
                            log_path=log)
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health", timeout=20)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def test_the_openai_client_gets_one_unit_vector_per_input(url: str) -> None:
    """The openai client (base64 by default) gets EMBEDDING_DIM floats per input, of length 1, the same each time."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    got = client.embeddings.create(model=MODEL, input=["hello", "world"])
    again = client.embeddings.create(model=MODEL, input="hello", encoding_format="float")
    assert [d.index for d in got.data] == [0, 1] and got.model == MODEL and got.usage.prompt_tokens >= 2
    first = got.data[0].embedding
    assert len(first) == sim_engine.EMBEDDING_DIM and math.isclose(math.fsum(v * v for v in first), 1, rel_tol=1e-4)
    assert again.data[0].embedding == pytest.approx(first, abs=1e-6)
    assert got.data[1].embedding != pytest.approx(first, abs=1e-3)


def test_the_answer_and_refusals_are_openai_shaped(url: str) -> None:
    """A float answer validates against OpenAI's schema; a bad input or another model is refused in words."""
    ok = httpx.post(url + "/v1/embeddings", json={"model": MODEL, "input": [[1, 2, 3]]}, timeout=10)
    assert ok.status_code == 200
    openai_schema.validate("embedding", ok.json())
    empty = httpx.post(url + "/v1/embeddings", json={"model": MODEL, "input": []}, timeout=10)
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "input"
    other = httpx.post(url + "/v1/embeddings", json={"model": "nope", "input": "x"}, timeout=10)
    assert other.status_code == 404 and "sim-embed" in other.json()["error"]["message"]
