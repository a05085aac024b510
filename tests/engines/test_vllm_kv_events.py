"""A real vLLM 0.32 CPU engine's KV cache events reach the agent's follower, and hold the hashes llmgw computes.

vLLM (from ``.venv-vllm``) serves the tiny random Llama with ``--kv-events-config`` from
``kvfollow.kv_events_config`` (loopback: the follower binds the SUB, vLLM's PUB connects); one
completion given as token ids; the follower's block set must then hold exactly the hashes
``core.kvhash`` computes for those ids at the block size the events carry (128 on CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import openai
import pytest

from llmgw.agent import kvfollow
from llmgw.core import kvhash
from llmgw.testing import procs

pytestmark = pytest.mark.engines


async def _run(vllm_python: str, model: Path, log: Path) -> None:
    config = kvfollow.kv_events_config(procs.free_port(), procs.free_port(), topic="kv")
    cfg = json.loads(config)
    follower = kvfollow.KvFollower(cfg["endpoint"], cfg["replay_endpoint"], topic="kv")
    task = asyncio.create_task(follower.run())
    port = procs.free_port()
    # PYTHONHASHSEED unset: the engine seeds NONE_HASH with vLLM's default, which kvhash assumes here.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"} | {"VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = procs.Proc.start([vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                             "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512",
                             "--enforce-eager", "--kv-events-config", config],
                            log_path=log, env=env)
    try:
        await asyncio.to_thread(proc.wait_http, f"http://127.0.0.1:{port}/health", timeout=600)
        tokens = [(i * 37 + 5) % 470 + 3 for i in range(300)]
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        await client.completions.create(model=str(model), prompt=tokens, max_tokens=1, temperature=0)
        for _ in range(1000):
            if follower.blocks.blocks:
                break
            await asyncio.sleep(0.02)
        size = follower.blocks.block_size
        assert size is not None, "the engine published no BlockStored for the prompt"
        expected = {kvhash.external(h) for h in kvhash.block_hashes(tokens, size)}
        assert expected and follower.blocks.blocks == expected
        await client.close()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        follower.close()
        proc.stop()


def test_real_vllm_publishes_the_block_hashes_llmgw_computes(vllm_python: str, tiny_hf_model: Path,
                                                             tmp_path: Path) -> None:
    asyncio.run(_run(vllm_python, tiny_hf_model, tmp_path / "vllm.log"))
