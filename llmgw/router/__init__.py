"""The router: the OpenAI API served by forwarding each request straight to a ready engine.

A request's path, in order:

* ``server``: the router's own HTTP/1.1 server (standalone and in ``llmgw server``); each client
  ``connection`` parses requests and runs the ASGI app, ``httphead`` writes the answers, ``limits``
  bounds how long a client may take to send a request;
* ``app``: ``RouterApp``, the front: it owns the parts below and sends each path to its job
  (``asgi``: the raw ASGI helpers; ``errors``: the router's own OpenAI-shaped refusals);
* ``completions``: one forwarded request up to its slot: ``request`` reads the body, ``auth`` the
  key, ``quota`` its budgets held across routers (``budgets``: one budget's lease, a request's share, the
  ``x-ratelimit-*`` headers and the 429; ``ratelimit``: the per-router window when no control plane
  keeps them), ``cold`` holds a request for a model scaled to zero, ``admission`` queues it;
  ``metering`` makes each request's usage record, ``usagejournal`` keeps and sends them
  (``usagehttp``: the standalone router's transports);
* ``anthropic``: Anthropic's Messages API (``/v1/messages``, ``count_tokens``) onto the same path: the request
  translated to a chat completion and the answer back (or passed through to an engine that serves it), its
  refusals and stream in Anthropic's shapes;
* ``proxying``: the admitted request's trip: ``upstream.Forwarder`` picks the endpoint and retries,
  ``relay`` relays the answer, ``openai_shape`` and ``openai_errors`` put llama.cpp's answers and every
  engine's errors in OpenAI's shape;
* ``upstream``: the choice of endpoint by the model's policy (``policies``: one file per routing
  policy on ``policies.base.Policy``, wrapping the pure choices in ``pick`` and ``prefix``; a LoRA
  adapter's request first narrowed to the replicas whose engine holds it, ``adaptercache``), the
  retry rules, and what is in flight (``loadwatch``; ``enginemetrics`` re-exports what it read of each engine on
  ``/metrics``), ejected (``health``) or hung (``hung``);
  ``lookahead`` what it reads of an engine's answer before handing it over (llama.cpp's progress events,
  a refusal's start); ``client`` is its HTTP/1.1 pool to engines, ``response`` the engine's response it hands over,
  ``enginetls`` the check of an ``https://`` engine's certificate (the cluster CA's, for its node) at connect.

Beside the path:

* ``table``: the route table, an immutable snapshot of the control plane's endpoints document, and
  the holder it is swapped into; ``watch``: what keeps it current: a long poll of the control plane
  (``TableWatcher``, outliving control-plane restarts) or, inside ``llmgw server``, the control
  plane's own published object (``LocalWatcher``); the document itself is ``llmgw.api.routing``;
  ``controltls``: how every session to an https:// control plane verifies it (``--control-ca``,
  ``--control-ca-hash``);
* ``reports``: ejections, recoveries and keys used (``keyuse``), told to the control plane;
  ``signals``: the autoscaler's load signals;
* ``metrics``: the Prometheus registry; ``tracing``: OpenTelemetry spans, only when asked for;
* ``tlslisten``: TLS on a listener of ``server``: the server context and its certificate re-read from disk when
  the files change (new handshakes get the new one, open connections keep theirs);
* ``settings``: the router's one settings object (``RouterSettings``, its flags generated from it);
  ``standalone``: ``python -m llmgw.router.standalone`` for a router on its own;
* ``hub``: ``--workers N``, N such routers on one port (SO_REUSEPORT) behind one hub that follows the control
  plane once and serves them its router-facing API (or, over a static table, their limits from ``ledger``,
  the in-memory budget ledger); ``workers``: how the hub starts, restarts and stops them.

The router never imports ``llmgw.control`` or ``llmgw.agent``: they meet on the wire.
"""
