"""A real llama.cpp engine (the xllamacpp launcher) on a tiny GGUF, started from the adapter's argv."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmgw.agent import weights
from llmgw.agent.engines import llamacpp
from llmgw.core import shards
from llmgw.testing import procs, tiny_gguf

pytestmark = pytest.mark.slow

KEY = "sk-llamacpp-test"
ALIAS = "tiny-llama"
# The launcher even when a llama-server is on PATH: this tests the launcher.
ADAPTER = llamacpp.LlamaCpp(which=lambda name: None)


@dataclasses.dataclass(frozen=True)
class Engine:
    url: str
    proc: procs.Proc


def spec_for(model: Path) -> shards.ShardSpec:
    return shards.ShardSpec(shard_id="e2e", replica_id="r", model="tiny", engine="llamacpp", served_name=ALIAS,
                            source=f"file://{model}", api_key=KEY, threads=1,
                            args=("--ctx-size", "512", "--parallel", "2"))


def launch(spec: shards.ShardSpec, *, port: int, model_path: str, log: Path) -> procs.Proc:
    ADAPTER.validate(spec)
    argv = ADAPTER.launch(spec, host="127.0.0.1", port=port, model_path=model_path,
                          cpu_count=os.cpu_count() or 1, python=sys.executable)
    return procs.Proc.start(argv.argv, env={**os.environ, **argv.env}, log_path=log)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf.write_tiny_llama_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="module")
def engine(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    spec = spec_for(model)
    path = weights.resolve_source(spec.source)
    assert path == str(model)
    port = procs.free_port()
    proc = launch(spec, port=port, model_path=path, log=tmp_path_factory.mktemp("logs") / "engine.log")
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health", timeout=60)
        yield Engine(url=f"http://127.0.0.1:{port}", proc=proc)
    finally:
        code = proc.stop()
        assert code == 0, f"the launcher exited with {code} on SIGTERM:\n{proc.log_tail()}"


def client(engine: Engine, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_models_lists_the_alias(engine: Engine) -> None:
    """Ready means /health answers and /v1/models lists the served name."""
    request = urllib.request.Request(engine.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        body = json.loads(r.read())
    assert ALIAS in [m["id"] for m in body["data"]]
    assert "listening on" in engine.proc.log_tail(200)


def test_chat_generates(engine: Engine) -> None:
    """A greedy chat request generates exactly max_tokens tokens, the same twice."""
    def ask() -> openai.types.chat.ChatCompletion:
        return client(engine).chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "hello"}], temperature=0, max_tokens=8,
            extra_body={"ignore_eos": True})

    first, second = ask(), ask()
    choice = first.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert first.usage is not None and first.usage.completion_tokens == 8
    assert second.choices[0].message.content == choice.message.content


def test_chat_streams(engine: Engine) -> None:
    """Streaming delivers the tokens as chunks and ends with finish_reason length."""
    stream = client(engine).chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "hello"}], temperature=0, max_tokens=8,
        stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    with_content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert 1 <= len(with_content) <= 8
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]


def test_engine_requires_the_key(engine: Engine) -> None:
    """Without the shard's key /v1 answers 401."""
    with pytest.raises(openai.AuthenticationError):
        client(engine, key="wrong").models.list()
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(engine.url + "/v1/models", timeout=10)
    assert caught.value.code == 401


def exits_with_message(spec: shards.ShardSpec, *, port: int, model_path: str, log: Path) -> str:
    proc = launch(spec, port=port, model_path=model_path, log=log)
    try:
        code = proc.popen.wait(timeout=30)
    finally:
        proc.stop()
    assert code not in (0, None), proc.log_tail()
    return proc.log_tail(5)


def test_bad_model_path_is_refused(model: Path, tmp_path: Path) -> None:
    """A missing model, or a file that is not GGUF, exits non-zero saying so in one line."""
    missing = tmp_path / "missing.gguf"
    out = exits_with_message(spec_for(model), port=procs.free_port(), model_path=str(missing),
                             log=tmp_path / "missing.log")
    assert f"model file {missing} does not exist" in out
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model")
    out = exits_with_message(spec_for(model), port=procs.free_port(), model_path=str(junk),
                             log=tmp_path / "junk.log")
    assert "is not a GGUF file" in out


def test_busy_port_is_refused(model: Path, tmp_path: Path) -> None:
    """A port someone else listens on exits non-zero naming the port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = exits_with_message(spec_for(model), port=port, model_path=str(model), log=tmp_path / "busy.log")
    assert f"port {port} on 127.0.0.1 is not available" in out
