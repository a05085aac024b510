"""The sim engine's web application: the OpenAI routes, /health, /metrics and /sim/stats, and the latency model.

Per request: prompt tokens = prompt characters / 4 (at least 1); prefill takes prompt_tokens / prefill_tps
seconds and produces the first token; then one more token every 1 / decode_tps seconds, up to max_tokens.
Token times are absolute deadlines from the moment a request is admitted, so event-loop lag does not
accumulate into a slower decode rate.
"""

from __future__ import annotations

import array
import asyncio
import base64
import collections
import dataclasses
import hashlib
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .lora import Loras
from .protocol import (
    MAX_EMBEDDING_INPUTS,
    Json,
    dumps,
    echo_pieces,
    embedding,
    embedding_inputs,
    error,
    json_body,
    prompt_chars,
)
from .sleep import SleepConfig, SleepMode
from .slots import Slots, Stats
from .toolcalls import Answer, choice_extra, delta, message, shape

if TYPE_CHECKING:  # kvcache imports llmgw.core and zmq: only with --kv-events-config (the wheel ships alone)
    from .kvcache import SimKvCache

#: The rank variables an agent sets for a rank of a multi-node replica; /sim/stats reports them.
GROUP_ENV = ("LLMGW_NNODES", "LLMGW_RANK", "LLMGW_LEADER_ADDR", "LLMGW_LEADER_PORT", "NCCL_IB_HCA")


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
    #: Answer a chat with its last user message (``echo_pieces``, one token a word) instead of `` tok0 tok1 …``.
    echo: bool = False
    #: A rank of a multi-node replica: rank 0 serves the API, the others only /health and /sim/stats.
    nnodes: int = 1
    rank: int = 0
    leader_addr: str = ""
    leader_port: int = 0
    #: vLLM's ``--kv-events-config`` JSON: publish KV events from the simulated cache (``kvcache``); "" off.
    kv_events_config: str = ""
    #: The simulated KV cache's capacity in blocks, and its block size in tokens.
    kv_cache_blocks: int = 4096
    block_size: int = 16
    #: vLLM's ``--enable-lora``: adapters may be loaded at runtime (``lora``).
    enable_lora: bool = False
    #: vLLM's ``max_cpu_loras``: the adapters its worker holds at once (``lora``), and the seconds a load takes.
    max_cpu_loras: int = 1
    lora_load_delay: float = 0.0
    #: vLLM's sleep mode (``sleep.py``): off unless ``--enable-sleep-mode``.
    sleep: SleepConfig = SleepConfig()


class SimEngine:
    """The web application and the state behind it."""

    def __init__(self, config: Config, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.slots = Slots(config.parallel)
        self.stats = Stats()
        self.sleep = SleepMode(config.sleep, clock=clock,
                               busy=lambda: self.slots.running > 0 or self.slots.waiting > 0)
        self.ready_at = clock() + config.startup_delay
        self.created = int(time.time())
        # Prompts seen lately, so a repeated one reports its blocks as cached (``prompt_tokens_details``).
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        #: The simulated KV cache publishing vLLM's events (``--kv-events-config``), set by ``serve``.
        self.kv: SimKvCache | None = None
        self.loras = Loras(config.model, enabled=config.enable_lora, capacity=config.max_cpu_loras,
                           load_delay=config.lora_load_delay)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._gate])
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/sim/stats", self.sim_stats)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        self.loras.add_routes(app)
        self.sleep.routes(app)
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
            if self.sleep.sleeping and request.path != "/v1/models":
                return error(503, "the engine is sleeping; POST /wake_up first",
                             type_="unavailable_error", code="engine_sleeping")
            try:
                return await handler(request)
            except web.HTTPException as e:
                # An unknown /v1 path or method: still an OpenAI-shaped answer, not aiohttp's text.
                return error(e.status, f"{request.method} {request.path}: {e.reason}",
                             type_="invalid_request_error")
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        if self.loading():
            return web.json_response({"status": "loading"}, status=503, dumps=dumps)
        return web.json_response({"status": "ok"}, dumps=dumps)

    async def sim_stats(self, request: web.Request) -> web.Response:
        return web.json_response({"running": self.slots.running, "waiting": self.slots.waiting,
                                  "completed": self.stats.completed, "aborted": self.stats.aborted,
                                  "peak_inside": self.stats.peak_inside,
                                  "traceparents": list(self.stats.traceparents),
                                  "aborts": [{"user": u, "at": t} for u, t in self.stats.aborts],
                                  "arrivals": list(self.stats.arrivals),
                                  "requests": list(self.stats.requests),
                                  "group": self.group(), "sleep": self.sleep.stats(), "lora": self.loras.stats(),
                                  # The simulated KV cache (--kv-events-config): blocks found cached / asked.
                                  "kv_hits": self.kv.hits if self.kv else 0,
                                  "kv_queries": self.kv.queries if self.kv else 0},
                                 dumps=dumps)

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
        return web.json_response({"object": "list", "data": [model, *self.loras.cards(self.created)]}, dumps=dumps)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def embeddings(self, request: web.Request) -> web.Response:
        """A deterministic vector per input (``embedding``), as floats or, as the openai client asks by
        default, base64 of little-endian float32s; no latency model: an embedding is one prefill."""
        body = await json_body(request)
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
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, dumps=dumps)

    async def _parse(self, request: web.Request, *, chat: bool) -> tuple[Json, int, int] | web.Response:
        """The body, prompt tokens and tokens to generate, or the error to answer with."""
        body = await json_body(request)
        if isinstance(body, web.Response):
            return body
        model = body.get("model")
        if model is None:
            return error(400, "model is required", type_="invalid_request_error", param="model")
        if model != self.config.model and not self.loras.serves(model):
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
        tokens = self._tokens(body, n_out, chat=chat)
        if body["model"] != self.config.model:  # an adapter's answer differs from the base's, by its name
            tokens = dataclasses.replace(tokens, pieces=[f" {body['model']}:{t.strip()}" for t in tokens.pieces])
            await self.loras.use(str(body["model"]))  # loaded on demand when its worker does not hold it
        cached = self._cached(body, n_prompt, chat=chat)
        ids = body.get("prompt")
        if self.kv is not None and not chat and isinstance(ids, list) and all(type(t) is int for t in ids):
            cached = await self.kv.admit(ids)
        self.stats.total += 1
        self.stats.requests.append(body)
        traceparent = request.headers.get("traceparent")
        if traceparent is not None:
            self.stats.traceparents.append(traceparent)
        self.stats.inside += 1
        self.stats.peak_inside = max(self.stats.peak_inside, self.stats.inside)
        arrival: dict[str, Any] = {"user": str(body.get("user") or ""), "arrived": time.monotonic(), "first": None}
        self.stats.arrivals.append(arrival)
        try:
            if body.get("stream"):
                response = await self._stream(request, body, n_prompt, tokens, chat=chat, arrival=arrival,
                                              cached=cached)
            else:
                response = await self._whole(n_prompt, tokens, chat=chat, cached=cached, model=str(body["model"]))
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

    def _tokens(self, body: Json, n_out: int, *, chat: bool) -> Answer:
        """The pieces of text to send, one a token, and the finish_reason: `` tok0 tok1 …`` up to ``n_out``
        ("length"), or with ``echo`` the last user message, cut at ``n_out`` ("length") or whole ("stop");
        then a tool call instead when one is asked for, or the text cut at a stop sequence (``toolcalls``)."""
        if self.config.echo and chat:
            pieces = echo_pieces(body) or [""]
            return shape(body, pieces[:n_out], "length" if len(pieces) > n_out else "stop")
        return shape(body, [f" tok{i}" for i in range(n_out)], "length")

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

    def _envelope(self, chat: bool, *, chunk: bool, model: str = "") -> Json:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
        prefix = "chatcmpl" if chat else "cmpl"
        return {"id": f"{prefix}-sim{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
                "model": model or self.config.model, "system_fingerprint": "llmgw-sim"}

    def _cached(self, body: Json, n_prompt: int, *, chat: bool) -> int:
        """Prompt tokens an engine's prefix cache would hold: whole 16-token blocks of a prompt seen lately."""
        digest = hashlib.blake2b(dumps(body.get("messages" if chat else "prompt")).encode(), digest_size=16).digest()
        seen = digest in self._seen
        self._seen[digest] = None
        self._seen.move_to_end(digest)
        if len(self._seen) > 4096:
            self._seen.popitem(last=False)
        return n_prompt // 16 * 16 if seen else 0

    @staticmethod
    def _usage(n_prompt: int, n_out: int, cached: int = 0) -> Json:
        return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
                "prompt_tokens_details": {"cached_tokens": cached}}

    async def _whole(self, n_prompt: int, tokens: Answer, *, chat: bool,
                     cached: int = 0, model: str = "") -> web.Response:
        pieces, finish = tokens.pieces, tokens.finish
        n_out = len(pieces)
        async with self.slots.held():
            until = self._pace(n_prompt - (cached if self.kv is not None else 0))
            await until(n_out - 1)
        text = "".join(pieces)
        if chat:
            choice: Json = {"index": 0, "message": message(tokens, text), "logprobs": None,
                            "finish_reason": finish} | choice_extra(tokens, True)
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        usage = self._usage(n_prompt, n_out, cached)
        out = self._envelope(chat, chunk=False, model=model) | {"choices": [choice], "usage": usage}
        return web.json_response(out, dumps=dumps)

    async def _stream(self, request: web.Request, body: Json, n_prompt: int, tokens: Answer, *,
                      chat: bool, arrival: dict[str, Any] | None = None, cached: int = 0) -> web.StreamResponse:
        pieces, finish = tokens.pieces, tokens.finish
        n_out = len(pieces)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        # vLLM's extension: with include_usage, usage so far on every chunk, not only on the last.
        continuous = include_usage and bool(options.get("continuous_usage_stats"))  # type: ignore[union-attr]
        base = self._envelope(chat, chunk=True, model=str(body["model"]))
        if include_usage:
            # The spec: with include_usage, every chunk but the last carries "usage": null.
            base["usage"] = None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)

        async def send(choice: Json | None) -> None:
            chunk = base | {"choices": [choice] if choice is not None else []}
            if "usage" in chunk:
                chunk["usage"] = chunk.pop("usage")  # last, as vLLM writes it
            await response.write(b"data: " + dumps(chunk).encode() + b"\n\n")

        def choice(i: int, text: str, finish: str | None) -> Json:
            if chat:
                return {"index": 0, "delta": delta(tokens, i, text), "logprobs": None,
                        "finish_reason": finish} | choice_extra(tokens, finish is not None)
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        async with self.slots.held():
            until = self._pace(n_prompt - (cached if self.kv is not None else 0))
            for i in range(n_out):
                await until(i)
                if continuous:
                    base["usage"] = self._usage(n_prompt, i + 1, cached)
                await send(choice(i, pieces[i], finish if i == n_out - 1 else None))
                if i == 0 and arrival is not None:
                    arrival["first"] = time.monotonic()
        if include_usage:
            base["usage"] = self._usage(n_prompt, n_out, cached)
            await send(None)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
