"""The sim engine's /v1/embeddings as a process: what the openai client sends, deterministic vectors, refusals;
and through a router, which says in /v1/models which models embed and refuses the ones that do not itself."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmgw.sim import engine as sim_engine
from llmgw.testing import openai_schema, procs, routed

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


def test_a_router_says_which_models_embed_and_refuses_for_one_that_does_not(tmp_path: Path) -> None:
    """``llmgw.embeddings`` in /v1/models where the table knows it; a model known not to embed (llama.cpp without
    --embeddings) is refused by the router with a 400 naming the flag, not sent to its engine's 501."""
    with routed.started(tmp_path) as spawner:
        def model(name: str, engine: str, embeddings: bool | None) -> dict[str, object]:
            entry = {"name": name, "state": "Ready", "engine": engine,  # each a sim serving its name
                     "endpoints": [{"replica_id": f"{name}-0", "url": spawner.sim(name)}]}
            return entry if embeddings is None else {**entry, "embeddings": embeddings}

        router = spawner.router([model("embedder", "sim", True), model("chatty", "llamacpp", False),
                                 model("maybe", "vllm", None)])
        listed = {m["id"]: m.get("llmgw") for m in httpx.get(router + "/v1/models", timeout=10).json()["data"]}
        assert listed == {"embedder": {"embeddings": True}, "chatty": {"embeddings": False}, "maybe": None}
        client = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0)
        assert len(client.embeddings.create(model="embedder", input="hi").data[0].embedding) == \
            sim_engine.EMBEDDING_DIM
        assert client.embeddings.create(model="maybe", input="hi").data  # not known: the engine answers
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model="chatty", input="hi")
        error = refused.value.body
        assert isinstance(error, dict)
        assert error["code"] == "embeddings_not_supported" and error["param"] == "model"
        assert "'chatty' does not serve embeddings" in error["message"] and "'--embeddings'" in error["message"]
        chat = client.chat.completions.create(model="chatty", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=2)
        assert chat.choices[0].message.content is not None  # only embeddings are refused
