"""`llmgw up` end to end on a real llama.cpp engine, and that SIGTERM leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
import yaml

from llmgw.cli import up as up_mod
from llmgw.testing import openai_schema
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.tiny_gguf import write_tiny_llama_gguf

pytestmark = pytest.mark.slow


def _env(tmp_path: Path) -> dict[str, str]:
    """This test's own config directory (where `up` logs the CLI in), and no token from outside."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLMGW_TOKEN", "LLMGW_URL")}
    return {**env, "XDG_CONFIG_HOME": str(tmp_path / "config")}


def _up(model: Path | None, data: Path, log: Path, *, http_port: int = 0, agent_port: int = 0) -> Proc:
    """`llmgw up` with ``model``'s file, or with none: the model `make up` serves."""
    chosen = ["--model", str(model)] if model is not None else []
    return Proc.start([sys.executable, "-m", "llmgw", "up", *chosen, "--http-port", str(http_port),
                       "--agent-port", str(agent_port), "--data-dir", str(data), "--wait", "90"], log_path=log,
                      env=_env(data.parent))


def _stream(create: Any, **kw: Any) -> tuple[list[Any], float]:
    """A stream's chunks, and the seconds of the clock its chunks arrived over."""
    chunks, arrived = [], []
    for chunk in create(stream=True, **kw):
        chunks.append(chunk)
        arrived.append(time.time())
    return chunks, arrived[-1] - arrived[0] if arrived else 0.0


def _crossed_a_second(chunks: list[Any], took: float) -> bool:
    """Asserts every chunk of a stream carries the same ``created`` (OpenAI's); True when the stream took long
    enough that llama.cpp's own stamps, one a chunk, changed in it (more than a second: always)."""
    assert chunks and len({ch.created for ch in chunks}) == 1, sorted({ch.created for ch in chunks})
    return took > 1.0


def _files_containing(root: Path, secret: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_up_serves_llamacpp_and_sigterm_stops_everything(tmp_path: Path) -> None:
    """`up` with a tiny GGUF serves real llama.cpp completions through the router; SIGTERM ends every process;
    a second `up` on the same ports starts at once (its connections left in TIME_WAIT do not hold them)."""
    gguf = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({
        "apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "tiny"},
        "spec": {"engine": "llamacpp", "source": f"file://{gguf}", "served_name": "tiny",
                 "engine_args": ["--ctx-size", "512", "--parallel", "2"], "startup_timeout": "60s"}}))
    # Port 0: the server binds free ports itself and `up` reads them back, so no other
    # process can take a port between the test choosing it and the server binding it.
    up = _up(model, tmp_path / "data", tmp_path / "up.log")
    again: Proc | None = None
    family: set[int] = set()
    try:
        wait_for(lambda: "llmgw is up" in up.log_tail(200) or up.poll() is not None, timeout=120, interval=0.2,
                 what="llmgw up")
        out = up.log_tail(200)
        assert up.poll() is None, out
        found = re.search(r"OpenAI base URL: http://127\.0\.0\.1:(\d+)/v1", out)
        assert found and "model:           tiny" in out, out
        http_port = int(found.group(1))
        agent_port = json.loads((tmp_path / "data" / "ports.json").read_text())["agent_port"]
        assert f"REST API:        http://127.0.0.1:{http_port}/api/v1" in out and "Ctrl-C" in out
        # Secure on one machine: initialised (the password printed once, and in no file under the data
        # directory, logs included), the agent joined over mutual TLS, and this user's CLI logged in.
        password = re.search(r"password \(shown once, not stored; keep it now\): (\S+)", out)
        assert password, out
        creds = tmp_path / "config" / "llmgw" / "credentials.json"
        assert creds.stat().st_mode & 0o777 == 0o600
        assert (up_mod.agent_state(tmp_path / "data") / "pki" / "node.key").stat().st_mode & 0o777 == 0o600
        got = subprocess.run([sys.executable, "-m", "llmgw", "get", "models", "--url", f"http://127.0.0.1:{http_port}"],
                             capture_output=True, text=True, timeout=60, env={**_env(tmp_path), "COLUMNS": "200"})
        assert got.returncode == 0 and "tiny" in got.stdout and "insecure" not in got.stderr, got.stderr
        anonymous = httpx.get(f"http://127.0.0.1:{http_port}/api/v1/models", timeout=10)
        assert anonymous.status_code == 401
        assert _files_containing(tmp_path / "data", password.group(1)) == []
        family = {p.pid for p in psutil.Process(up.pid).children(recursive=True)}
        assert len(family) >= 3  # server, agent, engine
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="x", max_retries=0, timeout=60)
        chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                         temperature=0, extra_body={"ignore_eos": True})
        assert chat.choices[0].message.role == "assistant" and chat.usage and chat.usage.completion_tokens == 6
        chunks = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=6, temperature=0, stream=True,
                                                extra_body={"ignore_eos": True}))
        for ch in chunks:
            openai_schema.validate("chat_chunk", ch.model_dump(mode="json", exclude_unset=True))
        assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content is not None) >= 1
        assert len({ch.created for ch in chunks}) == 1  # one stream, one created (OpenAI's)
        # The router asked llama.cpp for prefill progress events (to notice a client leaving); none reach the client.
        assert not any("prompt_progress" in ch.model_dump() for ch in chunks)
        comp = c.completions.create(model="tiny", prompt="a b c", max_tokens=4, temperature=0,
                                    extra_body={"ignore_eos": True})
        assert comp.usage and comp.usage.completion_tokens == 4
        # Its engine_args lack --embeddings: /v1/models says it does not embed, and the router says how to.
        listed = httpx.get(f"http://127.0.0.1:{http_port}/v1/models", timeout=10).json()["data"]
        assert [m.get("llmgw") for m in listed if m["id"] == "tiny"] == [{"embeddings": False}]
        with pytest.raises(openai.BadRequestError, match="--embeddings"):
            c.embeddings.create(model="tiny", input="hi")
        t0 = time.monotonic()
        up.signal(signal.SIGTERM)
        code = up.popen.wait(timeout=15)
        took = time.monotonic() - t0
        assert code == 0, up.log_tail(40)
        assert took < 10, f"stopping took {took:.1f}s"
        left = [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert left == [], f"processes left behind: {left}"

        creds_before = creds.read_text()
        # Stop, then start again at once on the same ports: the clients' kept-alive connections
        # the server closed sit in TIME_WAIT on the HTTP port, which must not count as "in use".
        again = _up(model, tmp_path / "data", tmp_path / "up2.log", http_port=http_port, agent_port=agent_port)
        wait_for(lambda: "llmgw is up" in again.log_tail(200) or again.poll() is not None, timeout=120,
                 interval=0.2, what="the second llmgw up")
        assert again.poll() is None and f"http://127.0.0.1:{http_port}/v1" in again.log_tail(200), again.log_tail(40)
        assert "password" not in again.log_tail(200)  # initialised once; the agent's certificate reused, no join
        assert creds.read_text() == creds_before
        family |= {p.pid for p in psutil.Process(again.pid).children(recursive=True)}
        again.signal(signal.SIGTERM)
        assert again.popen.wait(timeout=15) == 0, again.log_tail(40)
    finally:
        up.stop(timeout=15)
        if again is not None:
            again.stop(timeout=15)
        for pid in family:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def test_up_default_model_embeds_and_chats(tmp_path: Path) -> None:
    """The model `make up` serves (SmolLM2-135M on llama.cpp) answers /v1/embeddings through the router with
    vectors of its width, 576, and still chats; every chunk of a stream carries one created, also when the
    stream crosses a second (llama.cpp stamps each chunk with its own second)."""
    up = _up(None, tmp_path / "data", tmp_path / "up.log")
    family: set[int] = set()
    try:
        wait_for(lambda: "llmgw is up" in up.log_tail(200) or up.poll() is not None, timeout=300, interval=0.5,
                 what="llmgw up with the default model")
        out = up.log_tail(200)
        assert up.poll() is None, out
        found = re.search(r"OpenAI base URL: (http://127\.0\.0\.1:\d+/v1)", out)
        assert found and "model:           smollm2-135m" in out, out
        family = {p.pid for p in psutil.Process(up.pid).children(recursive=True)}
        c = openai.OpenAI(base_url=found.group(1), api_key="x", max_retries=0, timeout=60)
        listed = httpx.get(found.group(1) + "/models", timeout=10).json()["data"]
        assert [m.get("llmgw") for m in listed if m["id"] == "smollm2-135m"] == [{"embeddings": True}]
        one = c.embeddings.create(model="smollm2-135m", input="GPUs are fast.")
        openai_schema.validate("embedding", one.model_dump(mode="json", exclude_unset=True))
        assert len(one.data) == 1 and len(one.data[0].embedding) == 576
        assert one.usage.prompt_tokens > 0
        two = c.embeddings.create(model="smollm2-135m", input=["GPUs are fast.", "Cats sleep a lot."],
                                  encoding_format="float")
        assert [len(d.embedding) for d in two.data] == [576, 576] and [d.index for d in two.data] == [0, 1]
        assert two.data[0].embedding == pytest.approx(one.data[0].embedding, abs=1e-4)
        assert two.data[0].embedding != pytest.approx(two.data[1].embedding, abs=1e-3)
        chat = c.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
        assert chat.usage and chat.usage.completion_tokens == 6 and chat.choices[0].message.content
        crossed = False
        for _ in range(5):  # on a fast machine a stream may take under a second: another, until one does not
            chunks, took = _stream(c.chat.completions.create, model="smollm2-135m", max_tokens=300, temperature=0,
                                   messages=[{"role": "user", "content": "Tell me a long story."}],
                                   extra_body={"ignore_eos": True})
            for ch in chunks:
                openai_schema.validate("chat_chunk", ch.model_dump(mode="json", exclude_unset=True))
            crossed = _crossed_a_second(chunks, took)
            texts, took = _stream(c.completions.create, model="smollm2-135m", prompt="Once upon a time",
                                  max_tokens=300, temperature=0, extra_body={"ignore_eos": True})
            crossed = _crossed_a_second(texts, took) and crossed
            if crossed:
                break
        assert crossed, "no stream took more than a second: the created check proved nothing"
    finally:
        up.stop(timeout=15)
        for pid in family:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def test_up_refuses_a_busy_port(tmp_path: Path) -> None:
    """`up` on a port that is taken says which flag to use instead, and starts nothing."""
    import socket

    model = tmp_path / "sim.yaml"
    model.write_text(yaml.safe_dump({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "s"},
                                     "spec": {"engine": "sim"}}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        up = Proc.start([sys.executable, "-m", "llmgw", "up", "--model", str(model), "--http-port", str(port),
                         "--agent-port", str(free_port()), "--data-dir", str(tmp_path)], log_path=tmp_path / "up.log")
        code = up.popen.wait(timeout=60)
    assert code == 1
    assert f"port {port} is in use" in up.log_tail() and "--http-port" in up.log_tail()
    # The kernel tells who listens (this test's process), and the refusal says so.
    assert f"by pid {os.getpid()} (" in up.log_tail()
