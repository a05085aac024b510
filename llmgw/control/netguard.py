"""The control plane's side of ``llmgw.core.netpolicy``: its own remote reads reach no private address.

Before it places a model with a remote source, the control plane reads the weights' metadata itself
(``remotemeta``): Range requests to the source's URL, from the control plane's host. An operator who wrote
``http://127.0.0.1:8080/api/v1/...`` or ``http://169.254.169.254/...`` as a source would otherwise have the
control plane fetch its own API or its cloud credentials, and read the answer back as "metadata". So every
request of those reads passes ``Transport``: the host is resolved once, every address checked, and the
request sent to a checked address (the name kept for the Host header and for TLS: SNI and the
certificate check are the name's). A redirect is a new request through the same transport.

The cluster's hub and mirror (``--hub-endpoint``, ``--mirror-url``, the server's own ``/mirror``) are
trusted by configuration; ``--fetch-allow-private HOST[:PORT]`` opens others.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable

import httpx

from llmgw import hostnet
from llmgw.core import netpolicy

#: Named in every refusal.
SETTING = "--fetch-allow-private HOST[:PORT] on `llmgw server`"


def policy_of(allowed: Iterable[str], *, trusted: Iterable[str]) -> netpolicy.Policy:
    """The control plane's policy: the hosts its flag allows, and its own endpoints trusted."""
    return netpolicy.Policy.of(list(allowed), trusted=(), setting=SETTING).trusting(*trusted)


own_addresses = hostnet.own_addresses


class Transport(httpx.BaseTransport):
    """Sends each request to a checked address of its host through ``inner``; Refused before any connect."""

    def __init__(self, policy: netpolicy.Policy, inner: httpx.BaseTransport | None = None) -> None:
        self.policy = policy
        self.inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        host, port = url.host, url.port or (443 if url.scheme == "https" else 80)
        if self.policy.permits(host, port):
            return self.inner.handle_request(request)
        literal = netpolicy.address(host)
        if literal is not None:
            found = [literal]
        else:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise httpx.ConnectError(f"cannot resolve {host}: {exc}", request=request) from None
            found = [ip for info in infos if (ip := netpolicy.address(str(info[4][0]))) is not None]
        first = self.policy.check(f"{url.copy_with(query=None)}", host, port, found, own=own_addresses())[0]
        pinned = httpx.Request(request.method, url.copy_with(host=str(first)), headers=request.headers,
                               stream=request.stream,
                               extensions={**request.extensions, "sni_hostname": host})
        return self.inner.handle_request(pinned)

    def close(self) -> None:
        self.inner.close()
