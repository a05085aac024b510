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
  text is `` tok0 tok1 …``, finish_reason "length"; with ``--echo`` a chat's
  last user message instead, a word a token, finish_reason "stop" when whole);
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

/sim/stats lists the last 64 request bodies as received (``requests``), and
/metrics counts the requests whose client went away
(``llmgw_sim_requests_aborted_total``): a test sees what a client sent through a
router, and that a cancelled request stopped generating at the engine.

One module per job: ``protocol`` (the OpenAI bodies read and written), ``toolcalls`` (a tool call when asked
for one, stop sequences), ``slots`` (how many run at once, what
is counted), ``app`` (the routes and the latency model) and ``cli`` (the flags and the process). The package
imports only the standard library and aiohttp, each part by a relative import, because it also ships alone
as a wheel (``python -m llmgw_sim_engine``, built by ``llmgw.testing.wheelhouse``).
"""

from __future__ import annotations

from .app import GROUP_ENV, Config, SimEngine
from .cli import main, parse_args, serve
from .protocol import EMBEDDING_DIM, MAX_EMBEDDING_INPUTS, embedding, embedding_inputs, error, prompt_chars
from .slots import Slots, Stats

__all__ = ["EMBEDDING_DIM", "GROUP_ENV", "MAX_EMBEDDING_INPUTS", "Config", "SimEngine", "Slots", "Stats", "embedding",
           "embedding_inputs", "error", "main", "parse_args", "prompt_chars", "serve"]
