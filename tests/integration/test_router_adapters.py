"""LoRA adapters through a standalone router: each adapter is its own model name in /v1/models (with its
base as ``parent``), routed only to the base's endpoints whose engine holds it, with ``model`` kept as the
adapter's name (the engine serves it under that name) and counted under it; the base still answers as itself."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from llmgw.core import adapters
from llmgw.testing import routed


def load(url: str, name: str, path: Path) -> None:
    got = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}, timeout=10)
    assert got.status_code == 200, got.text


def completed(url: str) -> int:
    return int(httpx.get(f"{url}/sim/stats", timeout=10).json()["completed"])


def test_adapters_route_to_their_holders_and_answer_as_themselves(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(adapters.VLLM_RUNTIME_ENV, "True")  # the sims inherit it, as the agent sets it
    with routed.started(tmp_path) as p:
        holder, other = p.sim("base", "--enable-lora"), p.sim("base", "--enable-lora")
        load(holder, "sql", tmp_path)
        load(holder, "chat", tmp_path)
        load(other, "chat", tmp_path)
        router = p.router([{
            "name": "base", "served_name": "base", "routing": "round_robin", "adapters": ["sql", "chat"],
            "endpoints": [{"replica_id": "r1", "url": holder, "adapters": ["sql", "chat"]},
                          {"replica_id": "r2", "url": other, "adapters": ["chat"]}],
        }])
        listed = httpx.get(f"{router}/v1/models", timeout=10).json()["data"]
        assert [(m["id"], m.get("parent")) for m in listed] == [("base", None), ("sql", "base"), ("chat", "base")]
        client = openai.OpenAI(base_url=f"{router}/v1", api_key="none", max_retries=0)
        answers = {}
        for model in ("base", "sql", "chat"):
            got = [client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=2) for _ in range(4)]
            assert {g.model for g in got} == {model}
            assert len({g.choices[0].message.content for g in got}) == 1  # repeatable
            answers[model] = got[0].choices[0].message.content
        assert answers["sql"] == " sql:tok0 sql:tok1" and answers["base"] == " tok0 tok1"
        assert len(set(answers.values())) == 3
        # sql: only the holder; base: both (round robin); chat: both hold it, and adapter affinity keeps it on
        # one, the one whose cache it fills without sharing (the holder's has sql): 4 + 2 there, 4 + 2 here.
        assert (completed(holder), completed(other)) == (6, 6)
        metrics = httpx.get(f"{router}/metrics", timeout=10).text
        assert 'model="sql"' in metrics and 'model="chat"' in metrics
