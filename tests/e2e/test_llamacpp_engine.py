"""A real llama.cpp engine (the xllamacpp launcher) on a tiny GGUF, started from the adapter's argv."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from cryptography import x509

from llmgw.agent import enginetls, weights
from llmgw.agent.engines import base, llamacpp
from llmgw.control import datadir
from llmgw.core import pki, shards
from llmgw.testing import procs, tiny_gguf
from llmgw.testing.system import running

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


# --- engine TLS (issue 28): the launcher's relay, and a cluster whose agent has engine_tls on ---------------

NODE = "tls-node"


def test_engine_tls_serves_chat_through_the_launchers_relay(model: Path, tmp_path: Path) -> None:
    """With the node's engine key and certificate the launcher serves TLS (a relay in its process: the xllamacpp
    wheel has no SSL): the openai client verifying the cluster CA and the node chats and streams over it, plain
    HTTP to the port gets no answer, and a client expecting another node refuses the handshake."""
    ca = pki.create_ca()
    key = pki.new_key()
    (tmp_path / "engine.key").write_bytes(pki.key_pem(key))
    (tmp_path / "engine.crt").write_bytes(pki.sign_engine_csr(ca, pki.create_csr(NODE, key), NODE))
    spec = spec_for(model)
    ADAPTER.validate(spec)
    port = procs.free_port()
    argv = ADAPTER.launch(spec, host="127.0.0.1", port=port, model_path=str(model), cpu_count=os.cpu_count() or 1,
                          python=sys.executable, tls=base.TlsFiles(key=str(tmp_path / "engine.key"),
                                                                  cert=str(tmp_path / "engine.crt")))
    proc = procs.Proc.start(argv.argv, env={**os.environ, **argv.env}, log_path=tmp_path / "engine.log")
    ctx = enginetls.client_context(ca.cert_pem, NODE)
    try:
        procs.wait_for(lambda: "listening on https://" in proc.log_tail(50) or proc.poll() is not None,
                       timeout=60, what="the launcher's TLS relay")
        assert proc.poll() is None, proc.log_tail()
        with httpx.Client(verify=ctx, timeout=30) as http:
            c = openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, http_client=http)
            chat = c.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hello"}],
                                             temperature=0, max_tokens=8, extra_body={"ignore_eos": True})
            assert chat.usage is not None and chat.usage.completion_tokens == 8
            chunks = list(c.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hello"}],
                                                    temperature=0, max_tokens=8, stream=True,
                                                    extra_body={"ignore_eos": True}))
            assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] \
                == ["length"]
            with pytest.raises(openai.AuthenticationError):  # the bearer key stays
                openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0,
                              http_client=http).models.list()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        with pytest.raises(httpx.ConnectError, match="not this node's"):
            httpx.get(f"https://127.0.0.1:{port}/health", verify=enginetls.client_context(ca.cert_pem, "other"),
                      timeout=10)
    finally:
        code = proc.stop()
    assert code == 0, f"the launcher exited with {code} on SIGTERM:\n{proc.log_tail()}"


def test_a_cluster_with_engine_tls_on_runs_llamacpp_over_https(model: Path, tmp_path: Path) -> None:
    """A real control plane and a joined agent with engine_tls on: the llama.cpp replica gets Ready (the agent's
    probes over TLS), its endpoint is https://, it serves the node's engine certificate from the cluster CA, and
    the server's router, which checks that certificate against the table's CA and node, serves a chat through it."""
    models = model.parent
    os.chmod(models, 0o755)  # the engine runs as a uid of its own and reads the model from here
    with running(tmp_path, agent_env={"LLMGW_AGENT_ENGINE_TLS": "on",
                                      "LLMGW_AGENT_MODEL_DIRS": str(models)}) as s:
        s.apply({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "tiny-tls"},
                 "spec": {"engine": "llamacpp", "source": f"file://{model}", "served_name": "tiny-tls",
                          "engine_args": ["--ctx-size", "512", "--parallel", "2"], "startup_timeout": "90s"}})
        s.wait_model("tiny-tls", timeout=120)
        (replica,) = s.replicas("tiny-tls")
        url = urlsplit(str(replica["endpoint"]))
        assert url.scheme == "https", replica
        ca_pem = datadir.read_ca(s.data_dir).cert_pem
        ctx = ssl.create_default_context(cadata=ca_pem.decode())
        ctx.check_hostname = False
        with socket.create_connection((url.hostname, url.port), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
            der = tls.getpeercert(binary_form=True)
        assert der is not None and pki.engine_node(x509.load_der_x509_certificate(der)) == "node1"
        with httpx.Client(verify=enginetls.client_context(ca_pem, "node1"), timeout=10) as http:
            assert http.get(f"https://{url.hostname}:{url.port}/health").status_code == 200
        s.wait_router("tiny-tls", 1, timeout=60)
        chat = s.request("POST", "/v1/chat/completions", json={
            "model": "tiny-tls", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
        assert chat.status_code == 200, chat.text
        assert chat.json()["usage"]["completion_tokens"] > 0
