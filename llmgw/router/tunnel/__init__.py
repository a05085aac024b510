"""Engines behind NAT (issue 33): the router's end of the tunnels agents dial out to.

* ``hub``: ``TunnelHub``, the tunnel port: a TLS listener that takes only a node certificate of the cluster CA
  (its common name is the node; the control plane says whether it is still valid), keeps each node's current
  tunnel, and opens streams over it for the client;
* ``transport``: ``StreamTransport``, a tunnel stream as the asyncio transport ``router.client``'s connection
  runs on, as it does on a socket.

The wire itself is ``llmgw.api.tunnel``; the agent's end is ``llmgw.agent.tunnel``.
"""
