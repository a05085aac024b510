"""What the router's tokenizer costs ``kv_aware`` per text request, and what it costs every other model (issue 31).

    .venv/bin/python bench/kv_tokenize.py

In-process, no sockets; SmolLM2's tokenizer (49,152 tokens, the fixture in tests/fixtures/kvtok) and its
chat template. For prompts of about 100, 1,000 and 4,000 tokens, best and median µs over ``--repeats`` runs:

* ``completion``: a ``/v1/completions`` string prompt to ids (``ModelTokenizer.completion_ids``);
* ``chat``: a ``/v1/chat/completions`` body (system + user) rendered in the sandbox and tokenized;
* ``hash``: every full 16-token block of those ids hashed as vLLM does (``core.kvhash``, sha256): the upper
  bound of ``kv_aware``'s pick, which stops one block past the longest match;
* ``thread hop``: ``asyncio.to_thread`` of a call that does nothing: what moving the tokenizing off the event
  loop costs (``tokenizers.INLINE_CHARS`` is set where tokenizing costs about as much);
* ``loop while off``: how many turns another task on the event loop gets while a 4,000-token prompt is
  tokenized in a worker thread, with ``encode`` (holds the GIL for the whole call) and ``encode_batch``
  (releases it: what ``tokenizers.prompt_ids`` uses);
* ``not kv_aware``: the one test the request path adds for every other model
  (``route.routing in TOKENED and ...``, False at its first term), in ns.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import lzma
import pathlib
import statistics
import time
from collections.abc import Callable

from llmgw.core import kvhash
from llmgw.router import tokenizer as rtok
from llmgw.router.policies import TOKENED

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "tests/fixtures/kvtok"
WORDS = ("the router sends each request to the replica whose engine already holds the longest prefix of its "
         "prompt in its cache, so the prefill it skips is the work saved; ").split()
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
            "<|im_end|>\n' }}"
            "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def timed(fn: Callable[[], object], calls: int, repeats: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return min(runs), statistics.median(runs)


def fmt(figures: tuple[float, float], unit: str = "µs") -> str:
    return f"best {figures[0]:8.1f} {unit}, median {figures[1]:8.1f} {unit}"


def text_of(tok: rtok.ModelTokenizer, tokens: int) -> str:
    words: list[str] = []
    while len(tok.encode(" ".join(words), add_special_tokens=False)) < tokens:
        words.extend(WORDS)
    while len(tok.encode(" ".join(words), add_special_tokens=False)) > tokens:
        words.pop()
    return " ".join(words)


async def hop_cost(calls: int, repeats: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            await asyncio.to_thread(int)
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return min(runs), statistics.median(runs)


async def loop_turns(fn: Callable[[], object]) -> int:
    """Turns another task on the loop gets while ``fn`` runs in a worker thread."""
    turns = 0
    done = False

    async def spin() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    spinner = asyncio.create_task(spin())
    await asyncio.sleep(0)
    await asyncio.to_thread(fn)
    done = True
    await spinner
    return turns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    tok = rtok.ModelTokenizer(lzma.decompress((FIXTURES / "smollm2/tokenizer.json.xz").read_bytes()),
                              b'{"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}', TEMPLATE)
    for size in (100, 1000, 4000):
        text = text_of(tok, size)
        completion = {"prompt": text}
        chat = {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]}
        ids = tok.chat_ids(chat)
        assert ids is not None and tok.completion_ids(completion)
        print(f"~{size} tokens ({len(text)} chars, chat {len(ids)} ids)")
        runs = {"completion": functools.partial(tok.completion_ids, completion),
                "chat": functools.partial(tok.chat_ids, chat),
                "hash": functools.partial(kvhash.block_hashes, ids, 16),
                "chat + hash": functools.partial(lambda c: kvhash.block_hashes(tok.chat_ids(c) or (), 16), chat)}
        for name, fn in runs.items():
            print(f"  {name:<11} {fmt(timed(fn, a.calls, a.repeats))}")
    print(f"thread hop    {fmt(asyncio.run(hop_cost(a.calls * 4, a.repeats)))}")
    big = text_of(tok, 4000)
    held = [asyncio.run(loop_turns(lambda: tok.encode(big, add_special_tokens=True))) for _ in range(a.repeats)]
    freed = [asyncio.run(loop_turns(lambda: tok.encode(big, add_special_tokens=True, release_gil=True)))
             for _ in range(a.repeats)]
    print(f"loop while off: encode {statistics.median(held):.0f} turns, encode_batch {statistics.median(freed):.0f} "
          "turns (median)")
    routing, tokenizer = "prefix_cache", "hf://x/y"
    n = 1_000_000
    check = timed(lambda: routing in TOKENED and not () and tokenizer, n, a.repeats)
    base = timed(lambda: None, n, a.repeats)
    print(f"not kv_aware  {(check[0] - base[0]) * 1000:.0f} ns best, {(check[1] - base[1]) * 1000:.0f} ns median "
          "(the added test, net of the lambda call)")


if __name__ == "__main__":
    main()
