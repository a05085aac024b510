"""The agent's side of ``llmgw.core.netpolicy``: resolve a URL's host, check every address, connect to those.

Both of the fetcher's HTTP clients go through here, so no request of a fetch reaches an address the
policy refuses, whichever client sends it and however many redirects it follows:

* the transfer's blocking ``http.client`` connections (``connection``): the host is resolved once, checked,
  and the socket is opened to a checked address; TLS still verifies the certificate for the host's name
  (SNI and the Host header are the name's), so a pinned address costs nothing in trust;
* the planner's aiohttp session (``Connector``): aiohttp asks its connector for a host's addresses before
  every connection, redirects included, and connects to exactly what it answers.

The agent's own addresses are read at each check (``psutil``), so an address DHCP gave the node after the
agent started is refused as well.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.parse
from collections.abc import Sequence
from typing import Any

import aiohttp

from llmgw import hostnet
from llmgw.core import netpolicy

#: Named in every refusal: what an administrator changes to allow a host.
SETTING = "fetch_allow_private in the agent's settings"


def policy_of(allowed: bool | Sequence[str]) -> netpolicy.Policy:
    """The agent's policy from its ``fetch_allow_private`` setting."""
    return netpolicy.Policy.of(allowed, setting=SETTING)


def describe(allowed: bool | Sequence[str]) -> str:
    """For the agent's start-up line: what URL sources may reach."""
    if allowed is True:
        return "may reach any address (fetch_allow_private: true)"
    if not allowed:
        return "reach no loopback, link-local or own address (fetch_allow_private: false)"
    return f"reach no loopback, link-local or own address but {', '.join(allowed)} (fetch_allow_private)"


own_addresses = hostnet.own_addresses


def checked(policy: netpolicy.Policy, url: str, host: str, port: int) -> list[netpolicy.Address]:
    """The addresses ``host`` resolves to, all allowed by ``policy``; Refused otherwise (blocking: DNS).

    OSError when the name does not resolve, which may pass: the transfer retries it.
    """
    literal = netpolicy.address(host)
    if literal is not None:
        found = [literal]
    else:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)   # OSError: the caller's to retry
        found = [ip for info in infos if (ip := netpolicy.address(str(info[4][0]))) is not None]
    if policy.permits(host, port):
        return found
    return policy.check(url, host, port, found, own=own_addresses())


class _Pinned(http.client.HTTPConnection):
    """An HTTP connection to the checked addresses of its host, never to a fresh resolution of the name."""

    addresses: Sequence[netpolicy.Address] = ()

    def connect(self) -> None:
        self.sock = _connect(self.addresses, self.port, self.timeout)


class _PinnedTLS(http.client.HTTPSConnection):
    addresses: Sequence[netpolicy.Address] = ()

    def connect(self) -> None:
        sock = _connect(self.addresses, self.port, self.timeout)
        # The certificate is verified for the name, as it would be without the pin.
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def _connect(addresses: Sequence[netpolicy.Address], port: int, timeout: Any) -> socket.socket:
    last: OSError | None = None
    for ip in addresses:
        try:
            return socket.create_connection((str(ip), port), timeout=timeout)
        except OSError as exc:
            last = exc
    raise last or OSError("no address to connect to")


def connection(policy: netpolicy.Policy, url: str, *, timeout: float,
               tls: ssl.SSLContext | None = None) -> http.client.HTTPConnection:
    """A connection for ``url`` whose socket goes to a checked address of its host; Refused when there is none.

    ``tls``: what an https:// URL's certificate is verified with (``trust.context``); None: the system's.
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = checked(policy, url, host, port)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = _PinnedTLS(host, port, timeout=timeout, context=tls or ssl.create_default_context())
    else:
        conn = _Pinned(host, port, timeout=timeout)
    conn.addresses = addresses  # type: ignore[attr-defined]
    return conn


class Connector(hostnet.CheckedConnector):
    """The fetch session's connector: a refused address is an ``AddressRefused``, which the plan unwraps."""

    def refused(self, exc: netpolicy.Refused) -> aiohttp.ClientError:
        return AddressRefused(exc)


class AddressRefused(aiohttp.ClientError):
    """The policy refused an address: carried through aiohttp as one of its errors, and unwrapped by the caller."""

    def __init__(self, refused: netpolicy.Refused) -> None:
        super().__init__(str(refused))
        self.refused = refused
