"""What putting llama.cpp's answers into OpenAI's shape costs the router, per chunk and per request.

Times ``llmgw.router.openai_shape`` on llama.cpp's own bytes (xllamacpp 2026.10, copied
from a real engine): the splice of a chat chunk as the relay calls it, the same with
``include_usage``, a chat chunk written a second after the stream's first (its
``created`` put back to the first's), several events read at once, a completions
chunk (only its ``created`` checked), a whole chat answer, the per-request plan;
and, for scale, parsing and dumping the same chunk with ``json``. Each figure is the best of ``--repeat`` runs
of ``--number`` calls: other load on the machine only ever adds time.

    .venv/bin/python bench/openai_shape_cost.py
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from collections.abc import Callable

from llmgw.router import openai_shape

#: A chat chunk and a whole chat answer exactly as llama.cpp writes them.
CHUNK = (b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" the"}}],"created":1796160739,'
         b'"id":"chatcmpl-O2j9L4SXC9U8218uNGV0Ei1Cw200FYXd","model":"m","system_fingerprint":"b0-unknown",'
         b'"object":"chat.completion.chunk"}\n\n')
BODY = (b'{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"hi there"}}],'
        b'"created":1796160739,"model":"m","system_fingerprint":"b0-unknown","object":"chat.completion","usage":'
        b'{"completion_tokens":3,"prompt_tokens":21,"total_tokens":24,"prompt_tokens_details":{"cached_tokens":0}},'
        b'"id":"chatcmpl-q1zmvdccLNySTT3mANoUs9rDmhATHe01"}')
COMPLETION_CHUNK = (b'data: {"choices":[{"text":"s","index":0,"logprobs":null,"finish_reason":null}],'
                    b'"created":1796160744,"model":"m","system_fingerprint":"b0-unknown","object":"text_completion",'
                    b'"id":"chatcmpl-7HqDKIKZV1lcvdOhG0feSgOgriY3RTuq"}\n\n')
CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def cases() -> list[tuple[str, Callable[[], object]]]:
    chat = openai_shape.plan("llamacpp", "/v1/chat/completions", CHAT)
    usage = openai_shape.plan("llamacpp", "/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}})
    completion = openai_shape.plan("llamacpp", "/v1/completions", {"model": "m", "prompt": "hi", "stream": True})
    assert chat is not None and usage is not None and completion is not None
    shaper, usage_shaper, completion_shaper = chat.shaper("r"), usage.shaper("r"), completion.shaper("r")
    # A stream past its first second: llama.cpp's chunk carries a later created than the stream's first.
    later = chat.shaper("r")
    later.feed(CHUNK)
    next_second = CHUNK.replace(b'"created":1796160739', b'"created":1796160740')
    five = CHUNK * 4 + b"data: [DONE]\n\n"
    five_later = next_second * 4 + b"data: [DONE]\n\n"
    return [
        ("baseline: a call that returns its argument", lambda: (lambda c: c)(CHUNK)),
        ("plan(), a llamacpp chat request (per request)", lambda: openai_shape.plan("llamacpp", "/v1/chat/completions",
                                                                                  CHAT)),
        ("plan(), a vllm request: None (per request)", lambda: openai_shape.plan("vllm", "/v1/chat/completions", CHAT)),
        ("a chat chunk: logprobs null (per chunk)", lambda: shaper.feed(CHUNK)),
        ("a chat chunk, include_usage: usage and logprobs null", lambda: usage_shaper.feed(CHUNK)),
        ("a chat chunk a second later: the first created too", lambda: later.feed(next_second)),
        ("four chat events and [DONE] read as one chunk", lambda: shaper.feed(five)),
        ("the same a second later", lambda: later.feed(five_later)),
        ("a completions chunk: only created checked", lambda: completion_shaper.feed(COMPLETION_CHUNK)),
        ("a whole chat answer: logprobs and refusal (per request)", lambda: chat.body(BODY)),
        ("for scale: json.loads + json.dumps of the chat chunk",
         lambda: json.dumps(json.loads(CHUNK[6:]), separators=(",", ":")).encode()),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--number", type=int, default=100_000, help="calls per timed run")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs; the best is reported")
    args = parser.parse_args(argv)
    for label, call in cases():
        best = min(timeit.repeat(call, number=args.number, repeat=args.repeat)) / args.number
        print(f"{label:58} {best * 1e9:8.0f} ns", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
