"""The router: the OpenAI API served by forwarding each request straight to a ready engine.

* ``table``: the route table, an immutable snapshot of the control plane's endpoints
  document, and the holder it is swapped into;
* ``watch``: the long poll that keeps the table current and outlives control-plane restarts;
* ``pick``: endpoint choice, pure (round-robin with exclusion of endpoints already tried);
* ``upstream``: the choice of endpoint and the retry rules; ``client``: its HTTP/1.1 pools to engines;
* ``app``: the raw ASGI app (``RouterApp``); ``asgi``, ``request``, ``errors``: its parts;
* ``standalone``: ``python -m llmgw.router.standalone`` for a router on its own, served by
  ``server`` (its own HTTP/1.1 server, which ``llmgw server`` runs too, with the REST API beside it).

The router never imports ``llmgw.control`` or ``llmgw.agent``: they meet on the wire.
"""
