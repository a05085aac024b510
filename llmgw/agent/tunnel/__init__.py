"""The agent's end of the engine tunnel (issue 33): for a node whose engines no router can reach (behind NAT).

* ``dialer``: ``TunnelDialer`` keeps one outbound mutual-TLS connection (the node certificate) to the tunnel port
  the control plane offered, re-dialled with backoff when it drops; each stream a router opens over it is
  connected to one of this node's engines, by port, and to nothing else (``engine_ports``).

The wire is ``llmgw.api.tunnel``; the router's end is ``llmgw.router.tunnel``.
"""
