"""A standalone router's way to tunnelled engines (issue 33): through the control plane's tunnel port.

Agents behind NAT dial the leader's tunnel port, never a router. A standalone ``llmgw router`` opens each tunnel
stream as a TLS connection to that port (the connection the hub hands to ``relay.Door``: no client certificate),
says ``TOKEN NODE PORT`` with its router token, and once answered OK runs the client's HTTP connection on it as on
a socket: streaming, cancellation, back-pressure, ejection and metering stay the direct replica's code.

Where: the host of each ``--control`` URL, on the port that control plane's endpoints answers name
(``api.tunnel.PORT_HEADER``; ``watch.TableWatcher.tunnel_ports``). With several control planes (HA), the one that
last opened a stream to the node is tried first, then the others in the order given: only the one holding the
node's tunnel (the leader, which has the agents) opens it; the others answer that the node has no tunnel there.
The port's certificate is verified with the cluster CA the table carries (``engine_ca``) and the URL's host.
A control plane that cannot be reached is tried after the others for a backoff (0.2 s doubling to 5 s) until it
answers again. A failed open is ``ConnectFailed`` (nothing sent): the client retries elsewhere, ejects, probes.

With ``--workers N`` the hub alone follows the control plane and holds the token: it runs a relay for its workers on
127.0.0.1 (``workers_relay``: ``relay.RelayServer``, their secret) whose streams it opens here, so a worker reaches
tunnelled engines as a server's router worker does (``relay.RelayTunnels``), one loopback hop more.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence

from llmgw.router.response import ConnectFailed
from llmgw.router.tunnel.relay import Refused, RelayServer, open_line

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.2, 5.0


class ControlTunnels:
    """``client.Tunnels`` over the tunnel ports of ``urls`` (as ``ports`` learnt them), with ``token``."""

    def __init__(self, urls: Sequence[str], *, token: str, ports: Mapping[str, int], ca_pem: Callable[[], str],
                 timeout_s: float = 5.0) -> None:
        self._urls = tuple(dict.fromkeys(u.rstrip("/") for u in urls))
        self._token, self._ports, self._ca_pem, self._timeout_s = token, ports, ca_pem, timeout_s
        self._holder: dict[str, str] = {}  # node -> the control plane that last opened one of its streams
        self._context: tuple[str, ssl.SSLContext] | None = None
        self._failing: dict[str, tuple[float, float]] = {}  # control plane -> (tried last until, backoff)

    def holder(self, node: str) -> str:
        """The control plane that last opened a stream to ``node`` ("": none yet)."""
        return self._holder.get(node, "")

    def backing_off(self) -> frozenset[str]:
        """The control planes tried last for now: their tunnel port could not be reached."""
        now = time.monotonic()
        return frozenset(u for u, (until, _) in self._failing.items() if until > now)

    def _failed(self, base: str) -> None:
        backoff = min(self._failing.get(base, (0.0, BACKOFF_MIN_S / 2))[1] * 2, BACKOFF_MAX_S)
        self._failing[base] = (time.monotonic() + backoff, backoff)

    def _trust(self) -> ssl.SSLContext:
        ca = self._ca_pem()
        if not ca:
            raise ConnectFailed("the control plane's table carries no cluster CA (engine_ca) to verify its tunnel "
                                "port with; a control plane of this release sends it")
        if self._context is None or self._context[0] != ca:
            try:
                self._context = (ca, ssl.create_default_context(cadata=ca))
            except (ssl.SSLError, ValueError) as exc:
                raise ConnectFailed(f"the table's engine_ca is not a usable CA certificate: {exc}") from None
        return self._context[1]

    async def connect(self, node: str, port: int, factory: Callable[[], asyncio.Protocol]) -> asyncio.Protocol:
        if not self._token:
            raise ConnectFailed(f"node {node}'s engines are reached through the control plane's tunnel port, which "
                                "takes a router token: give the router --token-file")
        first = self._holder.get(node)
        order = [u for u in ((first,) if first else ()) + self._urls if u in self._ports]
        if not order:
            raise ConnectFailed(f"cannot reach node {node}'s engine on port {port}: no control plane followed has "
                                "said its tunnel port yet (one of this release, not --insecure, says it)")
        context = self._trust()
        why: list[str] = []
        later = self.backing_off()
        for base in sorted(dict.fromkeys(order), key=lambda u: u in later):  # stable: the order otherwise kept
            host = urllib.parse.urlsplit(base).hostname or ""
            try:
                protocol = await open_line(host, self._ports[base], f"{self._token} {node} {port}", factory,
                                           what=f"the tunnel port of {base} (port {self._ports[base]})",
                                           ssl_context=context, timeout_s=self._timeout_s)
            except Refused as exc:  # it answered: up, but not holding the node's tunnel (or refusing the token)
                self._failing.pop(base, None)
                why.append(str(exc))
                continue
            except ConnectFailed as exc:
                self._failed(base)
                why.append(str(exc))
                continue
            self._failing.pop(base, None)
            self._holder[node] = base
            return protocol
        raise ConnectFailed("; ".join(why))


def workers_relay(urls: Sequence[str], *, token: str, ports: Mapping[str, int], ca_pem: Callable[[], str],
                  secret: str) -> RelayServer:
    """``llmgw router --workers N``'s relay for its workers (``secret``: the one they were given) to the tunnel
    ports of ``urls`` with the hub's router ``token``, which never leaves the hub's process."""
    return RelayServer(ControlTunnels(urls, token=token, ports=ports, ca_pem=ca_pem), secret)
