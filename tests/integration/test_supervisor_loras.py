"""The agent keeps a running engine's LoRA adapters as its shard spec lists them (``agent.supervisor.loras``),
against a real sim engine serving vLLM's runtime LoRA API: loaded once ready, a StartShard for the live
shard that changes only the list loads and unloads with no restart (same pid), and a load that fails is
said in the status while the others load."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from llmgw.core import adapters
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.testing.supervised import SupervisorHarness, torn_down

S = ShardState


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[SupervisorHarness]:
    with torn_down(SupervisorHarness(tmp_path / "run")) as h:
        yield h


def spec(listed: tuple[adapters.Adapter, ...]) -> ShardSpec:
    args, env = adapters.launch_args("sim", listed)
    return ShardSpec(shard_id="lora-1", replica_id="r-lora", model="m", engine="sim", served_name="m",
                     api_key="k", args=args, env=env, adapters=listed)


def wait_adapters(h: SupervisorHarness, want: tuple[str, ...], *, timeout: float = 15.0) -> ShardStatus:
    async def poll() -> ShardStatus:
        deadline = time.monotonic() + timeout
        while (st := h.sup.status("lora-1")) is None or st.adapters != want:
            if time.monotonic() > deadline:
                raise AssertionError(f"adapters are {st and st.adapters}, not {want}: {st}")
            await asyncio.sleep(0.05)
        return st
    return h.run(poll())


async def listed(endpoint: str) -> list[tuple[str, str | None]]:
    async with aiohttp.ClientSession() as s, s.get(endpoint + "/v1/models",
                                                   headers={"Authorization": "Bearer k"}) as r:
        return [(m["id"], m.get("parent")) for m in (await r.json())["data"]]


def test_adapters_load_once_ready_and_change_without_a_restart(harness: SupervisorHarness, tmp_path: Path) -> None:
    made = {}
    for name in ("sql", "chat", "code"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")
        made[name] = adapters.Adapter(name, f"file://{tmp_path / name}")
    first = spec((made["sql"], made["chat"]))
    started = harness.run(harness.sup.start(first))
    wait_adapters(harness, ("sql", "chat"))
    ready = harness.wait_state("lora-1", S.READY)
    assert harness.run(listed(ready.endpoint)) == [("m", None), ("sql", "m"), ("chat", "m")]
    # One more, one fewer: the same shard id, the same process.
    changed = dataclasses.replace(first, adapters=(made["chat"], made["code"]))
    again = harness.run(harness.sup.start(changed))
    assert again.pid == started.pid
    st = wait_adapters(harness, ("chat", "code"))
    assert st.pid == started.pid and st.state is S.READY and st.adapters_message == ""
    assert st.spec is not None and st.spec.adapters == changed.adapters
    assert harness.run(listed(ready.endpoint)) == [("m", None), ("chat", "m"), ("code", "m")]
    assert S.STOPPING not in harness.states("lora-1")


def test_an_adapter_that_cannot_load_is_said_and_the_others_load(harness: SupervisorHarness, tmp_path: Path) -> None:
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "adapter_config.json").write_text("{}")
    (tmp_path / "bare").mkdir()  # no adapter_config.json: not an adapter
    listed_ = (adapters.Adapter("ok", f"file://{tmp_path / 'ok'}"), adapters.Adapter("gone", "file:///nonexistent/x"),
               adapters.Adapter("bare", f"file://{tmp_path / 'bare'}"))
    harness.run(harness.sup.start(spec(listed_)))
    st = wait_adapters(harness, ("ok",))
    deadline = time.monotonic() + 15
    while "bare" not in st.adapters_message and time.monotonic() < deadline:
        time.sleep(0.05)
        harness.run(asyncio.sleep(0.05))
        st = harness.sup.status("lora-1") or st
    assert "fetching gone from file:///nonexistent/x" in st.adapters_message
    assert "no adapter_config.json" in st.adapters_message and "fetching bare" in st.adapters_message
