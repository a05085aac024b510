"""Verifying an engine that serves TLS (issue 28): the cluster CA issued its certificate, for its node.

An engine on another host reports an ``https://`` endpoint; its certificate (``pki.sign_engine_csr``) has
the node's id as CN, ``llmgw-engine`` as OU, and no subject alternative name, on purpose (a node must not
get a certificate for the control plane's name). So the hostname is not checked (``check_hostname`` off);
after the handshake the router checks the subject instead: ``pki.engine_node(cert)`` must be the node the
table says the endpoint runs on. Anything else (a certificate from another CA, another node's engine
certificate, a cluster certificate that is not an engine's) closes the connection before a byte of the
request (its prompt, the engine's bearer key) is written, and ``upstream`` ejects the endpoint with the
reason and sends the request to another replica.

Costs are per connection, never per request: one ``ssl.SSLContext`` per CA (made once, cached), the
handshake and this check when ``client.Pool`` opens a connection, which it then keeps alive. Plain
``http://`` endpoints, and ``https://`` ones of a table without ``engine_ca`` (an older control plane), are
untouched: ``client`` uses no expectation for them.
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import Iterable, Mapping
from typing import Any

from llmgw.api.routing import EndpointDoc
from llmgw.core import pki

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def context(ca_pem: str) -> ssl.SSLContext:
    """The client context trusting only ``ca_pem``: certificate required, TLS 1.2 or later, no hostname check.

    ``ssl.SSLError`` when ``ca_pem`` is not a certificate.
    """
    made = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, server purpose (serverAuth EKU)
    made.minimum_version = ssl.TLSVersion.TLSv1_2
    made.check_hostname = False  # engine certificates carry no SAN: the subject is checked (``Expected.check``)
    made.verify_mode = ssl.CERT_REQUIRED
    made.load_verify_locations(cadata=ca_pem)
    return made


class Expected:
    """What the engine at ``url`` must present: a certificate of the CA in ``context`` for ``node``.

    Compared by identity: ``client.Pool`` keys its connections with it, so a connection verified for one
    node is never handed to a request for another.
    """

    __slots__ = ("url", "node", "ca_pem", "context", "broken")

    def __init__(self, url: str, node: str, ca_pem: str) -> None:
        self.url, self.node, self.ca_pem = url, node, ca_pem
        self.context: ssl.SSLContext | None = None
        #: Why no connection may be made ("" when one may): said as the ejection's reason.
        self.broken = ""
        if not node:
            self.broken = (f"TLS: the table names no node for the engine at {url}, so its certificate cannot be "
                           "checked; the control plane sets it for every ready replica")
            return
        try:
            self.context = context(ca_pem)
        except ssl.SSLError as exc:
            self.broken = (f"TLS: the table's engine_ca is not a PEM certificate ({exc.reason or exc}), so the "
                           f"engine at {url} cannot be verified")

    def check(self, transport: Any) -> str:
        """After the handshake: "" when the peer's certificate is this node's engine's, else the reason."""
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return f"TLS: the engine at {self.url} presented no certificate"
        cert = pki.load_cert(ssl.DER_cert_to_PEM_cert(der).encode())
        node = pki.engine_node(cert)
        if node is None:
            return (f"TLS: the engine at {self.url} presented a cluster certificate that is not an engine "
                    f"certificate ({cert.subject.rfc4514_string()}), not one for node {self.node}")
        if node != self.node:
            return f"TLS: the engine at {self.url} presented a certificate for node {node}, not node {self.node}"
        return ""

    def handshake_failed(self, exc: ssl.SSLError) -> str:
        """The reason for a handshake that failed (``exc``)."""
        if isinstance(exc, ssl.SSLCertVerificationError):
            return (f"TLS: the engine at {self.url} presented a certificate not issued by the cluster CA: "
                    f"{exc.verify_message or exc.reason}")
        return f"TLS: the handshake with the engine at {self.url} failed: {exc.reason or exc}"


def expectations(ca_pem: str, endpoints: Iterable[EndpointDoc],
                 old: Mapping[str, Expected]) -> dict[str, Expected]:
    """Each ``https://`` endpoint's ``Expected``, by URL; none without ``ca_pem``.

    An endpoint whose node and CA did not change keeps its ``Expected`` (the pool's connections to it stay
    usable); built once per table, off the request path.
    """
    if not ca_pem:
        return {}
    out: dict[str, Expected] = {}
    for endpoint in endpoints:
        if not endpoint.url.startswith("https://") or endpoint.url in out:
            continue
        kept = old.get(endpoint.url)
        if kept is not None and kept.node == endpoint.node and kept.ca_pem == ca_pem:
            out[endpoint.url] = kept
        else:
            out[endpoint.url] = Expected(endpoint.url, endpoint.node, ca_pem)
            if out[endpoint.url].broken:
                log.warning("%s", out[endpoint.url].broken)
    return out
