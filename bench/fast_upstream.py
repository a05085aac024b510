"""A near-zero-cost OpenAI-compatible upstream for router capacity runs: canned answers, no model.

The sim engine (``llmgw.sim.engine``) is an aiohttp app that tops out around
15k req/s on one core, below what the routers being compared can do, so a
capacity run against it measures the sim. This server answers in a few
microseconds: an ``asyncio.Protocol`` on uvloop with HTTP/1.1 keep-alive,
requests parsed by hand (request line, ``Content-Length``, the body searched
for ``"stream": true``) and every answer a precomputed byte string.

* ``POST /v1/chat/completions`` (and ``/v1/completions``): a 1-token chat
  completion as JSON with its length; with ``"stream": true`` a short SSE
  stream (role, two content chunks, a finish chunk with usage, ``data: [DONE]``)
  in chunked transfer encoding, as engines send it;
* ``GET /health``, ``GET /v1/models``, ``GET /metrics`` (vLLM-style gauges, so
  the router's load scraper has something to read); anything else is a 404.

It expects well-behaved clients (the routers and wrk): no chunked request
bodies, no pipelining beyond what arrives whole.

With ``--cert-file``/``--key-file`` it serves TLS (an engine's own TLS, issue 28: ``bench/engine_tls.py``,
and the router's engine-verification tests, with a certificate from ``llmgw.core.pki``).

    python bench/fast_upstream.py --port 9000 [--model bench-model] [--cert-file C --key-file K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import ssl
import sys

_CL = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_STREAM = re.compile(rb'"stream"\s*:\s*true')


def _whole(status: bytes, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: " + content_type + b"\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def answers(model: str, *, order: str = "openai") -> dict[str, bytes]:
    """Every canned response, by name, as the bytes that go on the wire.

    ``order="llamacpp"``: the chat answers as llama.cpp (xllamacpp 2026.10) writes them, key for
    key (``choices`` first, no usage on a stream without ``include_usage``), so a router that
    splices llama.cpp's bytes (llmgw with ``engine: llamacpp``) takes its usual path.
    """
    usage = {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}
    if order == "llamacpp":
        def doc_of(kind: str, choice: dict[str, object], **extra: object) -> dict[str, object]:
            return {"choices": [choice], "created": 1700000000, "id": "chatcmpl-bench", "model": model,
                    "system_fingerprint": "b0-unknown", "object": kind, **extra}

        completion = doc_of("chat.completion", {"finish_reason": "length", "index": 0,
                                                "message": {"role": "assistant", "content": "hi"}}, usage=usage)
        chunks = [doc_of("chat.completion.chunk", {"finish_reason": finish, "index": 0, "delta": delta})
                  for delta, finish in (({"role": "assistant", "content": None}, None), ({"content": "hi"}, None),
                                        ({"content": "!"}, None), ({}, "length"))]
    else:
        base = {"id": "chatcmpl-bench", "created": 1700000000, "model": model}
        completion = {**base, "object": "chat.completion",
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                   "finish_reason": "length"}], "usage": usage}

        def chunk(delta: dict[str, object], finish: str | None = None, **extra: object) -> dict[str, object]:
            return {**base, "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}

        chunks = [chunk({"role": "assistant", "content": ""}), chunk({"content": "hi"}), chunk({"content": "!"}),
                  chunk({}, "length", usage={"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10})]

    def event(doc: dict[str, object]) -> bytes:
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    # One chunk per event, as an engine flushes them, sent together: the router relays
    # each as it reads it, however they arrive.
    events = [*(event(c) for c in chunks), b"data: [DONE]\n\n"]
    stream = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
              b"transfer-encoding: chunked\r\n\r\n" + b"".join(_chunk(e) for e in events) + b"0\r\n\r\n")
    models = {"object": "list", "data": [{"id": model, "object": "model", "created": 1700000000,
                                          "owned_by": "bench"}]}
    metrics = (b'vllm:num_requests_running{model_name="%s"} 0\nvllm:num_requests_waiting{model_name="%s"} 0\n'
               % (model.encode(), model.encode()))
    return {"completion": _whole(b"200 OK", json.dumps(completion, separators=(",", ":")).encode()),
            "stream": stream,
            "health": _whole(b"200 OK", b"{}"),
            "models": _whole(b"200 OK", json.dumps(models).encode()),
            "metrics": _whole(b"200 OK", metrics, b"text/plain; version=0.0.4"),
            "not_found": _whole(b"404 Not Found", b'{"error":{"message":"not found"}}')}


class Upstream(asyncio.Protocol):
    """One client connection: answer each whole request in the buffer, keep the connection."""

    def __init__(self, canned: dict[str, bytes]) -> None:
        self._canned = canned
        self._buf = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            match = _CL.search(buf, 0, end + 2)
            length = int(match.group(1)) if match else 0
            if len(buf) < end + 4 + length:
                break
            line = buf[:buf.find(b"\r\n")]
            body = buf[end + 4:end + 4 + length]
            buf = buf[end + 4 + length:]
            out.append(self._answer(line, body))
        self._buf = buf
        if out and self._transport is not None:
            self._transport.write(b"".join(out))

    def _answer(self, line: bytes, body: bytes) -> bytes:
        method, _, rest = line.partition(b" ")
        path = rest.partition(b" ")[0]
        canned = self._canned
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            return canned["stream"] if _STREAM.search(body) else canned["completion"]
        if path == b"/health":
            return canned["health"]
        if path == b"/v1/models":
            return canned["models"]
        if path == b"/metrics":
            return canned["metrics"]
        return canned["not_found"]


async def serve(host: str, port: int, model: str, order: str = "openai", tls: ssl.SSLContext | None = None) -> None:
    canned = answers(model, order=order)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Upstream(canned), host, port, backlog=4096, ssl=tls)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--model", default="bench-model")
    parser.add_argument("--order", choices=("openai", "llamacpp"), default="openai",
                        help="the key order of the chat answers: llamacpp writes them as llama.cpp does")
    parser.add_argument("--cert-file", help="serve TLS with this certificate (PEM; --key-file its key)")
    parser.add_argument("--key-file")
    args = parser.parse_args(argv)
    tls = None
    if args.cert_file:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(args.cert_file, args.key_file)
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(args.host, args.port, args.model, args.order, tls))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
