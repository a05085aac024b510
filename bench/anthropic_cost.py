"""What Anthropic's Messages API costs the router per request, and that the OpenAI routes pay nothing for it.

In process, without sockets (as ``metering_cost.py --inproc``): N non-streamed requests straight through the
app's ASGI entry to a canned upstream answer (a chat completion), the best of five runs of N, each case in its own
process, the cases interleaved over ``--rounds``:

* **chat**: ``POST /v1/chat/completions`` on this tree, and with ``--before TREE`` on that checkout too: what the
  Messages routes add to the OpenAI routes (nothing runs for them: their path is matched first);
* **messages**: ``POST /v1/messages`` translated (``llmgw.router.anthropic``): the body read and turned into a chat
  completion, the answer into a Message; its figure over chat's is the translation's cost;
* **stream**: ``events.Events`` alone on a 16-token chat stream (with its usage chunk), µs per stream.

    .venv/bin/python bench/anthropic_cost.py [--n 20000] [--rounds 3] [--before /tmp/before]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
MODEL = "m"
ANSWER = json.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": MODEL,
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"},
                                  "finish_reason": "length"}],
                     "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}).encode()
BODIES = {
    "chat": ("/v1/chat/completions", {"model": MODEL, "max_tokens": 2,
                                      "messages": [{"role": "user", "content": "hi"}]}),
    "messages": ("/v1/messages", {"model": MODEL, "max_tokens": 2, "system": "Be brief.",
                                  "messages": [{"role": "user", "content": "hi"}]}),
}


async def one(case: str, n: int) -> float:
    """The app's CPU µs per request for ``case``, the best of five runs of ``n``."""
    from llmgw.router import app as app_mod
    from llmgw.router import table as table_mod
    from llmgw.router.asgi import CANCELS

    class Canned:
        status = 200
        headers = {"Content-Type": "application/json"}

        async def read(self) -> bytes:
            return ANSWER

        def close(self) -> None:
            pass

    class Upstream:
        async def open(self, route: object, path: str, body: bytes, **_: object) -> tuple[object, Canned]:
            return route.endpoints[0], Canned()  # type: ignore[attr-defined]

    path, doc = BODIES[case]
    body = json.dumps(doc).encode()
    scope = {"type": "http", "path": path, "method": "POST", "headers": [(b"x-api-key", b"k")],
             "extensions": {CANCELS: {}}}
    statuses: list[int] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])  # type: ignore[arg-type]

    holder = table_mod.TableHolder()
    holder.swap(table_mod.RouteTable.from_doc({"version": 1, "models": [
        {"name": MODEL, "state": "Ready", "endpoints": [{"replica_id": "r", "url": "http://127.0.0.1:9"}]}]}))
    app = app_mod.RouterApp(holder)
    app._proxy.forwarder = Upstream()  # type: ignore[assignment]
    for _ in range(2000):
        await app(dict(scope), receive, send)
    assert set(statuses) == {200}, f"{case}: answered {set(statuses)}"
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(n):
            await app(dict(scope), receive, send)
        best = min(best, (time.process_time() - start) / n * 1e6)
    return best


def stream_cost(n: int) -> float:
    from llmgw.router.anthropic.events import Events

    def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
        return b"data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()
    chunks = [chunk({"role": "assistant", "content": " tok0"})] + [chunk({"content": f" tok{i}"}) for i in range(1, 15)]
    chunks += [chunk({"content": " tok15"}, "length"),
               b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
               b'"usage":{"prompt_tokens":9,"completion_tokens":16,"total_tokens":25}}', b"data: [DONE]"]
    reads = [c + b"\n\n" for c in chunks]
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(n):
            events = Events(MODEL, None)
            for read in reads:
                events.feed(read)
            events.close()
        best = min(best, (time.process_time() - start) / n * 1e6)
    return best


def run(tree: Path, case: str, n: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", case, "--n", str(n)],
                         env=env, capture_output=True, text=True, check=True, cwd=tree)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout of the commit before, for the chat case")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(stream_cost(max(1, args.n // 10)) if args.one == "stream" else asyncio.run(one(args.one, args.n)))
        return 0
    cases = [("chat", TREE), ("messages", TREE), ("stream", TREE)]
    if args.before:
        cases.insert(0, ("chat before", args.before))
    figures: dict[str, list[float]] = {name: [] for name, _ in cases}
    for i in range(args.rounds):
        for name, tree in cases:
            figures[name].append(run(tree, name.split()[0], args.n))
            print(f"round {i + 1} {name}: {figures[name][-1]:.2f} us", flush=True)
    med = {name: statistics.median(v) for name, v in figures.items()}
    print(f"\nmedians of {args.rounds} rounds (each the best of 5 runs of {args.n} requests; stream: per stream)")
    for name, value in med.items():
        extra = f"  (+{value - med['chat']:.2f} us over chat)" if name == "messages" else ""
        extra = f"  ({med['chat'] - value:+.2f} us this tree)" if name == "chat before" else extra
        print(f"  {name:12} {value:8.2f} us{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
