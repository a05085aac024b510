"""The sim engine's LoRA API (vLLM 0.32's routes, ``llmgw.sim.engine.lora``) as a process: load, list with the
base as parent, answer under the adapter's name and differently from the base, unload, and vLLM's refusals."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmgw.core import adapters
from llmgw.testing import procs

BASE = "sim-base"


def start(tmp: Path, *args: str, runtime: bool = True) -> tuple[procs.Proc, str]:
    port = procs.free_port()
    env = {**os.environ, adapters.VLLM_RUNTIME_ENV: "True" if runtime else "0"}
    proc = procs.Proc.start([sys.executable, "-m", "llmgw.sim.engine", "--model", BASE, "--port", str(port), *args],
                            env=env, log_path=tmp / f"engine-{port}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(f"{url}/health", timeout=20)
    except BaseException:
        proc.stop()
        raise
    return proc, url


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = Path(tmp_path_factory.mktemp("sim-lora"))
    # The flags and variable the control plane gives a model with adapters (``core.adapters.launch_args``).
    args, env = adapters.launch_args("sim", (adapters.Adapter("a", "/srv/a", 8),))
    assert dict(env) == {adapters.VLLM_RUNTIME_ENV: "True"}
    proc, base_url = start(tmp, *args)
    try:
        yield base_url
    finally:
        proc.stop()


def test_load_list_answer_unload(url: str, tmp_path: Path) -> None:
    (tmp_path / "sql").mkdir()
    (tmp_path / "chat").mkdir()
    for name in ("sql", "chat"):
        got = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(tmp_path / name)})
        assert got.status_code == 200 and got.text == f"Success: LoRA adapter '{name}' added successfully."
    cards = httpx.get(f"{url}/v1/models").json()["data"]
    assert [(c["id"], c.get("parent"), c.get("root")) for c in cards] == [
        (BASE, None, None), ("sql", BASE, str(tmp_path / "sql")), ("chat", BASE, str(tmp_path / "chat"))]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    answers = {}
    for model in (BASE, "sql", "chat"):
        out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        again = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3)
        assert out.model == model and out.choices[0].message.content == again.choices[0].message.content
        answers[model] = out.choices[0].message.content
    assert len(set(answers.values())) == 3
    stream = client.chat.completions.create(model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                            stream=True)
    chunks = list(stream)
    assert {c.model for c in chunks} == {"sql"}
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert gone.status_code == 200 and gone.text == "Success: LoRA adapter 'sql' removed successfully."
    assert [c["id"] for c in httpx.get(f"{url}/v1/models").json()["data"]] == [BASE, "chat"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"lora_name": "x"}, 400, "Both 'lora_name' and 'lora_path'"),
    ({"lora_name": BASE, "lora_path": "/"}, 400, "conflicts with a served base model"),
    ({"lora_name": "x", "lora_path": "/nonexistent/lora"}, 404, "No adapter found"),
])
def test_load_refusals_are_vllms(url: str, body: dict[str, str], status: int, words: str) -> None:
    got = httpx.post(f"{url}/v1/load_lora_adapter", json=body)
    assert got.status_code == status and words in got.json()["error"]["message"]


def test_loading_twice_and_unloading_what_is_not_there_are_refused(url: str, tmp_path: Path) -> None:
    body = {"lora_name": "twice", "lora_path": str(tmp_path)}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=body).status_code == 200
    again = httpx.post(f"{url}/v1/load_lora_adapter", json=body)
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    missing = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "never"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"


def test_routes_need_the_runtime_variable_and_lora_needs_enable_lora(tmp_path: Path) -> None:
    """As vLLM: without VLLM_ALLOW_RUNTIME_LORA_UPDATING there are no routes; without --enable-lora no loading."""
    off, off_url = start(tmp_path, "--enable-lora", runtime=False)
    try:
        plain, plain_url = start(tmp_path)
    except BaseException:
        off.stop()
        raise
    try:
        body = {"lora_name": "x", "lora_path": str(tmp_path)}
        assert httpx.post(f"{off_url}/v1/load_lora_adapter", json=body).status_code == 404
        refused = httpx.post(f"{plain_url}/v1/load_lora_adapter", json=body)
        assert refused.status_code == 500 and "--enable-lora" in refused.json()["error"]["message"]
    finally:
        off.stop()
        plain.stop()


def test_the_worker_holds_at_most_its_limit_and_loads_an_evicted_adapter_on_demand(tmp_path: Path) -> None:
    """vLLM's LRUCacheWorkerLoRAManager: every adapter stays registered (listed, servable); the cache holds
    --max-cpu-loras of them, least recently used evicted, and a request for an evicted one loads it again."""
    proc, url = start(tmp_path, "--enable-lora", "--max-loras", "1", "--max-cpu-loras", "2")
    try:
        for name in ("a", "b", "c"):
            (tmp_path / name).mkdir()
            got = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(tmp_path / name)})
            assert got.status_code == 200, got.text

        def lora() -> dict[str, object]:
            return dict(httpx.get(f"{url}/sim/stats").json()["lora"])

        # Each load through the API reads the adapter into the cache: the third evicted the first.
        assert lora() == {"capacity": 2, "held": ["b", "c"], "registered": ["a", "b", "c"], "loads": 3,
                          "evictions": 1}
        assert [c["id"] for c in httpx.get(f"{url}/v1/models").json()["data"]] == [BASE, "a", "b", "c"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)

        def ask(model: str) -> str:
            out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=1)
            return str(out.choices[0].message.content)

        assert ask("b") == " b:tok0"  # held: touched, so c is now the least recently used
        assert lora()["held"] == ["c", "b"] and lora()["loads"] == 3
        assert ask("a") == " a:tok0"  # evicted, yet served: loaded on demand, c evicted for it
        assert lora() == {"capacity": 2, "held": ["b", "a"], "registered": ["a", "b", "c"], "loads": 4,
                          "evictions": 2}
        assert ask(BASE) == " tok0" and lora()["held"] == ["b", "a"]  # the base touches no adapter
        # An unload forgets the name only: its weights stay held until evicted, as vLLM's do.
        assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "a"}).status_code == 200
        assert lora()["held"] == ["b", "a"] and lora()["registered"] == ["b", "c"]
    finally:
        proc.stop()
