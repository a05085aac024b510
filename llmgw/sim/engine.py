"""The sim engine: an OpenAI-compatible fake engine with a simple latency model.

It stands in for a real engine wherever what matters is the HTTP behaviour and
the timing, not the text: router and agent tests, local runs, benchmarks of
the proxy. It speaks the same surface llama.cpp does (/health, /v1/models,
chat and text completions with SSE, embeddings, /metrics), and every body it
sends validates against OpenAI's published schemas. An embedding is a
deterministic unit vector of the input's hash (``EMBEDDING_DIM`` values).

The latency model, per request:

* prompt tokens ≈ prompt characters / 4 (at least 1);
* prefill takes prompt_tokens / prefill_tps seconds, and produces the first token;
* then one more token every 1 / decode_tps seconds, up to max_tokens (the
  text is `` tok0 tok1 …``, finish_reason "length");
* at most ``parallel`` requests generate at once; the rest wait in FIFO order.

Token times are absolute deadlines from the moment a request is admitted, so
event-loop lag does not accumulate into a slower decode rate.

aiohttp sets TCP_NODELAY on every accepted connection (BaseProtocol.connection_made;
checked on an accepted socket), so a token chunk is not held back by Nagle.

Started as a worker rank of a multi-node replica (``--rank`` above 0) it
answers /health, /v1/models (the agent's readiness probe) and /sim/stats, and
refuses completions with 503: only the leader serves the API, as with a real
engine. /sim/stats reports the rank it was given and the rank variables its
agent set, so a test sees what each rank was started with.

A client that disconnects aborts its request at once, waiting or generating:
the runner is built with ``handler_cancellation=True``, without which aiohttp
(3.14) lets a handler whose client has gone run to the end: checked, a
non-streaming request whose client closed after 0.2 s still held its slot
0.3 s later, with nothing counted as aborted.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import base64
import collections
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

Json = dict[str, Any]

#: The rank variables an agent sets for a rank of a multi-node replica; /sim/stats reports them.
GROUP_ENV = ("LLMGW_NNODES", "LLMGW_RANK", "LLMGW_LEADER_ADDR", "LLMGW_LEADER_PORT", "NCCL_IB_HCA")

#: Compact JSON: the separators json.dumps adds by default are a tenth of a small chunk.
_dumps = functools.partial(json.dumps, separators=(",", ":"))
#: Dimensions of a sim embedding: small, since what is tested is the wire, not the meaning.
EMBEDDING_DIM = 64
#: Inputs one embeddings request may carry (OpenAI's limit).
MAX_EMBEDDING_INPUTS = 2048


def embedding(text: str, *, dim: int = EMBEDDING_DIM) -> list[float]:
    """A deterministic unit vector for ``text``: the same text gives the same vector, in any process."""
    raw = b"".join(hashlib.sha256(f"{i}:{text}".encode()).digest() for i in range(-(-dim // 32)))
    values = [(b - 127.5) / 127.5 for b in raw[:dim]]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [round(v / norm, 6) for v in values]


async def _json_body(request: web.Request) -> dict[str, Any] | web.Response:
    """The request's JSON object, or the 400 that says why it is not one."""
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as e:
        return error(400, f"request body is not valid JSON: {e}", type_="invalid_request_error")
    if not isinstance(body, dict):
        return error(400, "request body must be a JSON object", type_="invalid_request_error")
    return body


def embedding_inputs(value: Any) -> list[str] | None:
    """An embeddings request's ``input`` as texts (token ids as their decimal text), None when it is not one."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and len(value) <= MAX_EMBEDDING_INPUTS:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [" ".join(map(str, value))]
        if all(isinstance(v, list) and v and all(isinstance(t, int) for t in v) for v in value):
            return [" ".join(map(str, v)) for v in value]
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """How the sim engine behaves; one field per command-line flag."""

    model: str
    api_key: str = ""
    prefill_tps: float = 5000.0
    decode_tps: float = 200.0
    parallel: int = 8
    startup_delay: float = 0.0
    max_tokens_default: int = 16
    #: A rank of a multi-node replica: rank 0 serves the API, the others only /health and /sim/stats.
    nnodes: int = 1
    rank: int = 0
    leader_addr: str = ""
    leader_port: int = 0


class Slots:
    """At most ``parallel`` holders at once; the rest wait first come, first served."""

    def __init__(self, parallel: int) -> None:
        self._free = parallel
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()
        self.running = 0

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def acquire(self) -> None:
        if self._free > 0 and not self._queue:
            self._free -= 1
            self.running += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # Granted a slot in the same tick it was cancelled: hand it on, or it leaks.
                self.release()
            elif future in self._queue:
                # (A release() may already have popped and skipped it: at shutdown every handler
                # is cancelled at once, and removing it again raised ValueError.)
                self._queue.remove(future)
            raise

    def release(self) -> None:
        self.running -= 1
        while self._queue:
            future = self._queue.popleft()
            if not future.done():
                self.running += 1
                future.set_result(None)
                return
        self._free += 1

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()


@dataclasses.dataclass(slots=True)
class Stats:
    """Request counts since start (running and waiting come from Slots)."""

    total: int = 0
    completed: int = 0
    aborted: int = 0
    #: Completion requests held now (running or waiting), and the most held at once since
    #: start: what a router's per-replica concurrency limit bounds.
    inside: int = 0
    peak_inside: int = 0
    #: The last ``traceparent`` headers received, so a test can see a router passed its trace on.
    traceparents: collections.deque[str] = dataclasses.field(default_factory=lambda: collections.deque(maxlen=256))
    #: The last aborts: the request's ``user`` field (a test's tag for it), and when, in
    #: ``time.monotonic()`` seconds (one clock for every process on a Linux machine), so a
    #: test or bench can tell which requests were aborted and how soon after their client left.
    aborts: collections.deque[tuple[str, float]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=4096))
    #: The last requests: ``user``, when each arrived and when its first token went out
    #: (``time.monotonic()``; first is None until then, and for whole responses), so a test
    #: can see the order in which a router let requests reach the engine.
    arrivals: collections.deque[dict[str, Any]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=4096))


def error(status: int, message: str, *, type_: str, code: str | None = None,
          param: str | None = None) -> web.Response:
    """An OpenAI-shaped error response."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status, dumps=_dumps)


def prompt_chars(body: Json, *, chat: bool) -> int | None:
    """Characters of prompt in a request body (token ids count 4 each), None when it has none."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        total = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(len(p) for p in prompt)
        if all(isinstance(p, int) for p in prompt):
            return 4 * len(prompt)
        if all(isinstance(p, list) for p in prompt):
            return 4 * sum(len(p) for p in prompt)
    return None


class SimEngine:
    """The web application and the state behind it."""

    def __init__(self, config: Config, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.slots = Slots(config.parallel)
        self.stats = Stats()
        self.ready_at = clock() + config.startup_delay
        self.created = int(time.time())

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._gate])
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/sim/stats", self.sim_stats)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        return app

    def loading(self) -> bool:
        return self.clock() < self.ready_at

    @web.middleware
    async def _gate(self, request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            if self.config.rank > 0 and request.path != "/v1/models":
                # A real engine's worker rank serves no API either: requests go to the leader.
                # Its model list still answers: the agent's readiness probe asks it, and a
                # worker rank is ready as soon as its process runs.
                return error(503, f"this is rank {self.config.rank} of {self.config.nnodes}, a worker; send "
                                  f"requests to the leader (rank 0 at {self.config.leader_addr})",
                             type_="unavailable_error", code="worker_rank")
            key = self.config.api_key
            if key and request.headers.get("Authorization", "") != f"Bearer {key}":
                return error(401, "Invalid API key: send Authorization: Bearer <key>",
                             type_="authentication_error", code="invalid_api_key")
            if self.loading():
                return error(503, "the model is still loading; retry shortly",
                             type_="unavailable_error", code="model_loading")
            try:
                return await handler(request)
            except web.HTTPException as e:
                # An unknown /v1 path or method: still an OpenAI-shaped answer, not aiohttp's text.
                return error(e.status, f"{request.method} {request.path}: {e.reason}",
                             type_="invalid_request_error")
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        if self.loading():
            return web.json_response({"status": "loading"}, status=503, dumps=_dumps)
        return web.json_response({"status": "ok"}, dumps=_dumps)

    async def sim_stats(self, request: web.Request) -> web.Response:
        return web.json_response({"running": self.slots.running, "waiting": self.slots.waiting,
                                  "completed": self.stats.completed, "aborted": self.stats.aborted,
                                  "peak_inside": self.stats.peak_inside,
                                  "traceparents": list(self.stats.traceparents),
                                  "aborts": [{"user": u, "at": t} for u, t in self.stats.aborts],
                                  "arrivals": list(self.stats.arrivals),
                                  "group": self.group()},
                                 dumps=_dumps)

    def group(self) -> Json:
        """The rank it was started as, and the rank variables its agent set (what a real engine would read)."""
        c = self.config
        return {"nnodes": c.nnodes, "rank": c.rank, "leader_addr": c.leader_addr, "leader_port": c.leader_port,
                "env": {k: os.environ[k] for k in GROUP_ENV if k in os.environ}}

    async def metrics(self, request: web.Request) -> web.Response:
        rows = [
            ("llmgw_sim_requests_running", "gauge", "Requests generating now.", self.slots.running),
            ("llmgw_sim_requests_waiting", "gauge", "Requests waiting for a slot.", self.slots.waiting),
            ("llmgw_sim_requests_total", "counter", "Completion requests accepted.", self.stats.total),
            ("llmgw_sim_requests_aborted_total", "counter", "Requests whose client went away.",
             self.stats.aborted),
        ]
        text = "".join(f"# HELP {n} {h}\n# TYPE {n} {t}\n{n} {v}\n" for n, t, h, v in rows)
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def models(self, request: web.Request) -> web.Response:
        model = {"id": self.config.model, "object": "model", "created": self.created, "owned_by": "llmgw-sim"}
        return web.json_response({"object": "list", "data": [model]}, dumps=_dumps)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def embeddings(self, request: web.Request) -> web.Response:
        """A deterministic vector per input (``embedding``), as floats or, as the openai client asks by
        default, base64 of little-endian float32s; no latency model: an embedding is one prefill."""
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        if body.get("model") != self.config.model:
            return error(404, f"The model {body.get('model')!r} does not exist; this engine serves "
                              f"{self.config.model!r}", type_="invalid_request_error", code="model_not_found",
                         param="model")
        texts = embedding_inputs(body.get("input"))
        if texts is None:
            return error(400, "input must be a string, a list of strings or of token ids, not empty and at most "
                              f"{MAX_EMBEDDING_INPUTS} of them", type_="invalid_request_error", param="input")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            return error(400, f"encoding_format must be 'float' or 'base64', not {fmt!r}",
                         type_="invalid_request_error", param="encoding_format")
        data = []
        for i, text in enumerate(texts):
            vec: list[float] | str = embedding(text)
            if fmt == "base64":
                packed = array.array("f", vec)
                if sys.byteorder != "little":
                    packed.byteswap()
                vec = base64.b64encode(packed.tobytes()).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        tokens = sum(max(1, len(t) // 4) for t in texts)
        return web.json_response({"object": "list", "data": data, "model": self.config.model,
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, dumps=_dumps)

    async def _parse(self, request: web.Request, *, chat: bool) -> tuple[Json, int, int] | web.Response:
        """The body, prompt tokens and tokens to generate, or the error to answer with."""
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        model = body.get("model")
        if model is None:
            return error(400, "model is required", type_="invalid_request_error", param="model")
        if model != self.config.model:
            return error(404, f"The model {model!r} does not exist; this engine serves {self.config.model!r}",
                         type_="invalid_request_error", code="model_not_found", param="model")
        chars = prompt_chars(body, chat=chat)
        if chars is None:
            field = "messages" if chat else "prompt"
            return error(400, f"{field} is required and must not be empty", type_="invalid_request_error",
                         param=field)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is None:
            limit = self.config.max_tokens_default
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            return error(400, f"max_tokens must be a positive integer, not {limit!r}",
                         type_="invalid_request_error", param="max_tokens")
        return body, max(1, chars // 4), limit

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        parsed = await self._parse(request, chat=chat)
        if isinstance(parsed, web.Response):
            return parsed
        body, n_prompt, n_out = parsed
        self.stats.total += 1
        traceparent = request.headers.get("traceparent")
        if traceparent is not None:
            self.stats.traceparents.append(traceparent)
        self.stats.inside += 1
        self.stats.peak_inside = max(self.stats.peak_inside, self.stats.inside)
        arrival: dict[str, Any] = {"user": str(body.get("user") or ""), "arrived": time.monotonic(), "first": None}
        self.stats.arrivals.append(arrival)
        try:
            if body.get("stream"):
                response = await self._stream(request, body, n_prompt, n_out, chat=chat, arrival=arrival)
            else:
                response = await self._whole(n_prompt, n_out, chat=chat)
        except (asyncio.CancelledError, ConnectionResetError):
            # The client went away: the handler was cancelled (waiting, prefilling or between
            # tokens), or a write found the connection closed.
            self.stats.aborted += 1
            self.stats.aborts.append((str(body.get("user") or ""), time.monotonic()))
            raise
        finally:
            self.stats.inside -= 1
        self.stats.completed += 1
        return response

    def _pace(self, n_prompt: int) -> Callable[[int], Awaitable[None]]:
        """After admission: a function that sleeps until token ``i`` is ready."""
        loop = asyncio.get_running_loop()
        first = loop.time() + n_prompt / self.config.prefill_tps
        step = 1.0 / self.config.decode_tps

        async def until(i: int) -> None:
            delay = first + i * step - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)

        return until

    def _envelope(self, chat: bool, *, chunk: bool) -> Json:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
        prefix = "chatcmpl" if chat else "cmpl"
        return {"id": f"{prefix}-sim{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
                "model": self.config.model, "system_fingerprint": "llmgw-sim"}

    @staticmethod
    def _usage(n_prompt: int, n_out: int) -> Json:
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}

    async def _whole(self, n_prompt: int, n_out: int, *, chat: bool) -> web.Response:
        async with self.slots.held():
            until = self._pace(n_prompt)
            await until(n_out - 1)
        text = "".join(f" tok{i}" for i in range(n_out))
        if chat:
            message = {"role": "assistant", "content": text, "refusal": None}
            choice: Json = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        out = self._envelope(chat, chunk=False) | {"choices": [choice], "usage": self._usage(n_prompt, n_out)}
        return web.json_response(out, dumps=_dumps)

    async def _stream(self, request: web.Request, body: Json, n_prompt: int, n_out: int, *,
                      chat: bool, arrival: dict[str, Any] | None = None) -> web.StreamResponse:
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        base = self._envelope(chat, chunk=True)
        if include_usage:
            # The spec: with include_usage, every chunk but the last carries "usage": null.
            base["usage"] = None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)

        async def send(choice: Json | None) -> None:
            chunk = base | {"choices": [choice] if choice is not None else []}
            await response.write(b"data: " + _dumps(chunk).encode() + b"\n\n")

        def choice(i: int, text: str, finish: str | None) -> Json:
            if chat:
                delta: Json = {"content": text} if i else {"role": "assistant", "content": text}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        async with self.slots.held():
            until = self._pace(n_prompt)
            for i in range(n_out):
                await until(i)
                await send(choice(i, f" tok{i}", "length" if i == n_out - 1 else None))
                if i == 0 and arrival is not None:
                    arrival["first"] = time.monotonic()
        if include_usage:
            base["usage"] = self._usage(n_prompt, n_out)
            await send(None)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m llmgw.sim.engine", description=__doc__.split("\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", required=True, help="the served model name")
    # The agent passes the key by environment: a command line is readable by every user of the node.
    parser.add_argument("--api-key", default=os.environ.get("LLMGW_SIM_API_KEY", ""),
                        help="require Authorization: Bearer KEY on /v1/* (default $LLMGW_SIM_API_KEY)")
    parser.add_argument("--prefill-tps", type=float, default=5000.0, help="prompt tokens per second")
    parser.add_argument("--decode-tps", type=float, default=200.0, help="generated tokens per second")
    parser.add_argument("--parallel", type=int, default=8, help="requests generating at once")
    parser.add_argument("--startup-delay", type=float, default=0.0, help="seconds /health answers 503")
    parser.add_argument("--max-tokens-default", type=int, default=16, help="max_tokens when not given")
    parser.add_argument("--nnodes", type=int, default=1, help="ranks of its multi-node replica")
    parser.add_argument("--rank", type=int, default=0, help="its rank; only rank 0 serves /v1")
    parser.add_argument("--leader-addr", default="", help="rank 0's address")
    parser.add_argument("--leader-port", type=int, default=0, help="rank 0's rendezvous port")
    args = parser.parse_args(argv)
    if args.prefill_tps <= 0 or args.decode_tps <= 0 or args.parallel < 1:
        parser.error("--prefill-tps and --decode-tps must be > 0 and --parallel >= 1")
    if args.nnodes < 1 or not 0 <= args.rank < args.nnodes:
        parser.error(f"--rank must be one of 0..{max(args.nnodes, 1) - 1} and --nnodes at least 1")
    return args


async def serve(config: Config, *, host: str, port: int) -> int:
    """Serve until SIGTERM or SIGINT; the exit status (1 when the port cannot be bound)."""
    engine = SimEngine(config)
    # shutdown_timeout: aiohttp waits 60 s for open requests by default, and waits it twice
    # (for the handler to end, then for it to end once cancelled); a stopped engine must be gone
    # in well under a second, and its open streams are cut anyway. 0.1 gives ~0.25 s in all.
    runner = web.AppRunner(engine.app(), handler_cancellation=True, shutdown_timeout=0.1, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as e:
            print(f"llmgw sim engine: cannot listen on {host}:{port}: {e.strerror or e}; "
                  "pick another --port or stop what holds it", file=sys.stderr)
            return 1
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        bound = runner.addresses[0]
        print(f"llmgw sim engine: listening on http://{bound[0]}:{bound[1]} serving {config.model!r}",
              flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = Config(model=args.model, api_key=args.api_key, prefill_tps=args.prefill_tps,
                    decode_tps=args.decode_tps, parallel=args.parallel, startup_delay=args.startup_delay,
                    max_tokens_default=args.max_tokens_default, nnodes=args.nnodes, rank=args.rank,
                    leader_addr=args.leader_addr, leader_port=args.leader_port)
    return asyncio.run(serve(config, host=args.host, port=args.port))


if __name__ == "__main__":
    sys.exit(main())
