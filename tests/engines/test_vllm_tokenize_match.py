"""The router's tokenizer gives a real vLLM 0.32 engine's own ids, for completion prompts and chats.

vLLM (from ``.venv-vllm``) serves the tiny random Llama with its tokenizer made Llama 3-like: BOS added by
``tokenizer.json``'s post-processor and written by the chat template as ``{{ bos_token }}`` (so both BOS
paths are exercised). For each prompt the engine's ``/tokenize`` answer (the renderer its completions and
chats use; a chat's ``usage.prompt_tokens`` is checked against it too) must equal what
``router.tokenizer.ModelTokenizer`` computes from the same three files a router is sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.router import tokenizer as rtok
from llmgw.testing import procs

pytestmark = pytest.mark.engines

FIXTURES = Path(__file__).parents[1] / "fixtures/kvtok"
LLAMA3 = {v["name"]: v for v in json.loads((FIXTURES / "cases.json").read_text())["variants"]}["tiny-llama3"]

PROMPTS = ["Hello world", " leading and trailing ", "A special <|im_start|> token and <|end_of_text|> too",
           "Unicode: café 東京 🚀", "the quick brown fox " * 40]
CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is a router?"},
     {"role": "assistant", "content": "It routes."}, {"role": "user", "content": "And a replica? 🚀"}],
    [{"role": "user", "content": [{"type": "text", "text": "first part"}, {"type": "text", "text": "second"}]}],
]


def _llama3_like(model: Path, out: Path) -> Path:
    shutil.copytree(model, out)
    doc = json.loads((out / "tokenizer.json").read_text())
    doc["post_processor"] = LLAMA3["post_processor"]
    (out / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False))
    (out / "chat_template.jinja").write_text(LLAMA3["chat_template"])
    return out


async def _run(vllm_python: str, model: Path, log: Path) -> None:
    port = procs.free_port()
    proc = procs.Proc.start([vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                             "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512",
                             "--enforce-eager"], log_path=log, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    tok = rtok.ModelTokenizer((model / "tokenizer.json").read_bytes(), (model / "tokenizer_config.json").read_bytes(),
                              (model / "chat_template.jinja").read_text())
    base = f"http://127.0.0.1:{port}"
    try:
        await asyncio.to_thread(proc.wait_http, f"{base}/health", timeout=900)
        async with httpx.AsyncClient(base_url=base, timeout=120) as http:
            for prompt in PROMPTS:
                for add in (True, False):
                    got = (await http.post("/tokenize", json={"model": str(model), "prompt": prompt,
                                                              "add_special_tokens": add})).json()
                    body: dict[str, Any] = {"prompt": prompt} if add else {"prompt": prompt, "add_special_tokens": add}
                    assert tok.completion_ids(body) == tuple(got["tokens"]), (prompt, add)
            assert tok.completion_ids({"prompt": "Hello world"})[0] == 0  # BOS: the case is exercised
            for messages in CHATS:
                got = (await http.post("/tokenize", json={"model": str(model), "messages": messages,
                                                          "add_generation_prompt": True})).json()
                ids = tok.chat_ids({"model": str(model), "messages": messages})
                assert ids == tuple(got["tokens"]), messages
                done = (await http.post("/v1/chat/completions", json={"model": str(model), "messages": messages,
                                                                       "max_tokens": 1})).json()
                assert done["usage"]["prompt_tokens"] == len(ids), messages
    finally:
        proc.stop()


def test_the_routers_ids_are_vllms_own(vllm_python: str, tiny_hf_model: Path, tmp_path: Path) -> None:
    model = _llama3_like(tiny_hf_model, tmp_path / "tiny-llama3")
    asyncio.run(_run(vllm_python, model, tmp_path / "vllm.log"))
