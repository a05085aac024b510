"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) on the router's OpenAI port.

Each request is translated to a chat completion and takes the chat completions' path whole (the key, the
model, budgets, rate limits, admission, routing, metering); the answer is translated back:

* ``messages``: the two routes: the body replaced, ``x-api-key`` read as the key, the answer rewritten;
* ``convert``: the Messages request as a chat completion request (system, blocks, tools, stop sequences);
* ``answer``: a whole answer (``Message``), the count, and every error in Anthropic's shapes;
* ``events``: a stream rewritten as Anthropic's events as it passes;
* ``models``: ``GET /v1/models`` for an Anthropic client (it sends ``anthropic-version``), in Anthropic's shape.

Nothing here runs for the OpenAI routes (``/v1/models`` looks for the ``anthropic-version`` header).
"""
