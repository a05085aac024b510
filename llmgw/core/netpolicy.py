"""Which addresses a fetch may connect to: the one rule against server-side request forgery.

A model's ``spec.source`` is written by an operator, yet the bytes are fetched by a node's agent (root), by
the control plane (its metadata reads before placing) and by the mirror (redirects from its upstream). Each
of those sits where the operator does not: on loopback next to the agent's and engines' ports, on the
control plane's own REST port, and in reach of a cloud's metadata service at 169.254.169.254, which hands
out the machine's credentials to anyone who asks. So a URL chosen by an operator must not reach:

* loopback (127.0.0.0/8, ::1), the unspecified address and 0.0.0.0/8 (a connect to them reaches this host);
* link-local (169.254.0.0/16, fe80::/10): the metadata services answer there;
* multicast, which no HTTP server answers on;
* any address of the fetching host itself (its public or private address reaches its own ports too).

Private ranges (10/8, 172.16/12, 192.168/16, fc00::/7) are allowed: inside a cluster the mirror, an
artifact server and the nodes themselves live there, and refusing them would refuse the normal case.

Every resolved address is checked, not the first: a name that resolves to a public address and to
127.0.0.1 is refused. The caller then connects to exactly the addresses checked here, never resolving the
name a second time, so a DNS answer that changes between the check and the connect (rebinding) cannot slip
through; a redirect is a new host, checked the same way.

Two ways past the rule, both by configuration and never by an operator's spec: the cluster's own endpoints
(the mirror or hub the control plane was started with, the mirror's upstream) are ``trusted`` by their
host:port, and ``allowed`` names hosts (or host:port) an administrator opened with a setting (the agent's
``fetch_allow_private``, the server's ``--fetch-allow-private``), ``*`` for any. Pure: resolution is the
caller's, so each process checks with its own resolver and this module opens nothing.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import urllib.parse
from collections.abc import Collection, Iterable

from llmgw.core import errors

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
#: 0.0.0.0/8 "this network": Linux connects 0.0.0.1 .. 0.255.255.255 to this host as it does 0.0.0.0.
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
ANY = "*"


class Refused(errors.FetchError):
    """A URL resolves to an address no fetch may reach; the message names it, why, and the setting that allows it."""


def address(text: str) -> Address | None:
    """``text`` as an IP address (brackets, IPv6 zone and ``::ffff:`` mapping taken off); None for a name."""
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped   # ::ffff:127.0.0.1 is 127.0.0.1 to the kernel
    return ip


def why_refused(ip: Address, *, own: Collection[Address] = ()) -> str:
    """What makes ``ip`` unreachable for a fetch ("a loopback address"), or "" when it may be fetched from."""
    found = address(str(ip)) or ip
    if found.is_loopback:
        return "a loopback address"
    if found.is_link_local:
        return "a link-local address (where cloud metadata services such as 169.254.169.254 answer)"
    if found.is_unspecified or (isinstance(found, ipaddress.IPv4Address) and found in _THIS_NETWORK):
        return "an unspecified address (a connect to it reaches this host)"
    if found.is_multicast:
        return "a multicast address"
    if found in own:
        return "an address of this host itself"
    return ""


def host_port(host: str, port: int) -> str:
    """``host:port`` as the settings write it: lower-case, an IPv6 address in brackets."""
    h = host.strip("[]").lower()
    return f"[{h}]:{port}" if ":" in h else f"{h}:{port}"


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """Who may be fetched from by this process; ``setting`` is what a refusal tells the reader to change."""

    #: host or host:port an administrator allowed ("*": every address), lower-case.
    allowed: frozenset[str] = frozenset()
    #: host:port of the cluster's own endpoints, trusted by configuration whatever their address.
    trusted: frozenset[str] = frozenset()
    #: Named in refusals: "fetch_allow_private in the agent's settings".
    setting: str = "fetch_allow_private in the agent's settings"

    @classmethod
    def of(cls, allowed: Iterable[str] | bool, *, trusted: Iterable[str] = (), setting: str) -> Policy:
        """A policy from a setting's value: True allows every address, False none, a list those hosts."""
        names = [ANY] if allowed is True else [] if allowed is False else list(allowed)
        return cls(allowed=frozenset(_norm(n) for n in names if n.strip()), setting=setting,
                   trusted=frozenset(_norm(t) for t in trusted if t.strip()))

    def trusting(self, *urls_or_host_ports: str) -> Policy:
        """This policy with the cluster's endpoints (URLs or host:port) trusted too."""
        more = {_endpoint(u) for u in urls_or_host_ports if u}
        return dataclasses.replace(self, trusted=self.trusted | {m for m in more if m})

    def permits(self, host: str, port: int) -> bool:
        """Whether ``host:port`` is reached whatever it resolves to (trusted, or allowed by the setting)."""
        hp, h = host_port(host, port), host.strip("[]").lower()
        return ANY in self.allowed or hp in self.trusted or hp in self.allowed or h in self.allowed

    def check(self, url: str, host: str, port: int, addresses: Iterable[Address], *,
              own: Collection[Address] = ()) -> list[Address]:
        """The addresses of ``host`` a fetch of ``url`` may connect to: all, or Refused naming the first bad one.

        ``url`` starts the refusal's sentence ("" when the caller says what was fetched itself).
        """
        found = list(dict.fromkeys(addresses))
        if self.permits(host, port):
            return found
        said = f"{url}: " if url else ""
        if not found:
            raise Refused(f"{said}{host} resolves to no address; check the name")
        for ip in found:
            why = why_refused(ip, own=own)
            if why:
                named = host if str(ip) == host.strip("[]") else f"{host} (resolved to {ip})"
                raise Refused(f"{said}{named} is {why}; nothing is fetched from loopback, link-local, unspecified "
                              "or this host's own addresses, which would reach services that trust their local "
                              "callers (server-side request forgery). Serve the file from another host or the "
                              f"cluster's mirror, or allow {host_port(host, port)} with {self.setting}")
        return found


def _norm(text: str) -> str:
    t = text.strip().lower()
    if t == ANY:
        return t
    ip = address(t)
    if ip is not None:   # a bare address, IPv6 included
        return f"[{ip}]" if ip.version == 6 else str(ip)
    host, sep, port = t.rpartition(":")
    if sep and port.isdigit() and host:
        return host_port(host, int(port))
    return t.strip("[]")


def _endpoint(text: str) -> str:
    """host:port of a URL (its scheme's port when none is written), or ``text`` itself when it is one already."""
    if "://" not in text:
        return _norm(text)
    parts = urllib.parse.urlsplit(text)
    if not parts.hostname:
        return ""
    return host_port(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
