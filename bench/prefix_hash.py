"""What prefix-aware routing costs per request: the prompt's text and block hashes of a 20 KB chat prompt.

    .venv/bin/python bench/prefix_hash.py
    .venv/bin/python bench/prefix_hash.py --kb 100 --calls 500 --repeats 7

The router computes ``prefix.request_key`` for every request of a model routed
by prefix, on the event loop, before it picks a replica. This times that call
alone (no server, no sockets): best and median per call over ``--repeats``
runs of ``--calls`` calls, on a chat of one long system message and one long
user message, the shape a RAG or agent prompt has. It moved here from a unit
test, where a wall-clock bound could only fail on a busy machine or pass on a
slow one.
"""

from __future__ import annotations

import argparse
import statistics
import time

from llmgw.router import prefix

SYSTEM = "You are a careful assistant for the accounts team. "  # 51 characters


def prompt_of(kb: int) -> dict[str, object]:
    """A chat of one system and one user message, together about ``kb`` KB of text."""
    system = SYSTEM * (kb * 1024 // 2 // len(SYSTEM) + 1)
    user = "question " * (kb * 1024 // 2 // len("question ") + 1)
    return {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kb", type=int, default=20, help="prompt size in KB (default 20)")
    ap.add_argument("--calls", type=int, default=200, help="calls per timed run (default 200)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs (default 5)")
    args = ap.parse_args()
    if args.kb < 1 or args.calls < 1 or args.repeats < 1:
        ap.error("--kb, --calls and --repeats must each be at least 1")
    doc = prompt_of(args.kb)
    chars = len(prefix.prompt_text(doc))
    blocks = len(prefix.request_key(doc).blocks)
    prefix.request_key(doc)  # warm
    per_call = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        for _ in range(args.calls):
            prefix.request_key(doc)
        per_call.append((time.perf_counter() - started) / args.calls)
    print(f"prompt: {chars} characters, {blocks} blocks; {args.repeats} runs of {args.calls} calls")
    print(f"prefix.request_key per call: best {min(per_call) * 1e6:.1f} us, "
          f"median {statistics.median(per_call) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
