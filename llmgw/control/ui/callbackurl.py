"""The address the identity provider sends a browser back to after an SSO sign-in: ``…/ui/sso/callback``.

The ``redirect_uri`` of an authorization request is where the provider delivers the code; built from a
request's ``Host`` header alone, a request with a forged ``Host`` (a client of its own, a cache or proxy that
passes it on) would ask the provider to send a code to another server. So the address is either the one the
operator configured (``--sso-redirect-url``: the callback's URL as browsers reach it, e.g. behind a TLS
proxy; what is registered at the provider), or the request's own scheme and host **only when the host is
one of this server's known names** (its ``--host``, ``--advertise-address``, this machine's name,
loopback), on this server's own port or none. Anything else is refused with a sentence naming the host and
the setting; nothing is sent to the provider.

Pure: standard library only, tested on plain values.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import urllib.parse

#: Below the UI's mount: where the provider sends the browser back, and where a sign-in starts.
CALLBACK = "/sso/callback"
#: Names every server answers on its own machine; a browser on that machine opens the UI by them.
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


class UnknownHost(Exception):
    """The request's ``Host`` is none of this server's names: no authorization request is made for it."""


def _split_host(host: str) -> tuple[str, int | None]:
    """``("name", port)`` of a ``Host`` header (``[v6]:port`` included); ValueError when malformed."""
    parsed = urllib.parse.urlsplit(f"//{host}")
    if parsed.username is not None or parsed.path or parsed.query or parsed.fragment or not parsed.hostname:
        raise ValueError(host)
    return parsed.hostname.lower(), parsed.port


def _norm(name: str) -> str:
    name = name.strip().strip("[]").lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


@dataclasses.dataclass(frozen=True)
class CallbackUrls:
    """Which ``redirect_uri`` this server gives the provider; see the module's text for the rule."""

    #: The operator's callback URL (``https://llmgw.example.com/ui/sso/callback``), used as it is; "" : none.
    redirect_url: str = ""
    #: This server's names (lower case, no port): a request's Host is trusted only if it is one of them.
    hosts: frozenset[str] = LOOPBACK
    #: The port this server listens on: a Host naming another port is another service on the same machine.
    port: int | None = None
    #: The setting an operator sets to name the URL, quoted in the refusal.
    setting: str = "--sso-redirect-url"

    @classmethod
    def of(cls, *, redirect_url: str = "", names: tuple[str, ...] = (), port: int | None = None,
           setting: str = "--sso-redirect-url") -> CallbackUrls:
        """From the server's names as configured (wildcards and empty names dropped, loopback always in)."""
        hosts = {_norm(n) for n in names if n and n not in ("0.0.0.0", "::")}
        return cls(redirect_url=redirect_url, hosts=frozenset(hosts | LOOPBACK), port=port, setting=setting)

    def for_request(self, *, scheme: str, host: str, root_path: str) -> str:
        """The callback URL for a browser that sent ``Host: host`` over ``scheme``; UnknownHost if untrusted."""
        if self.redirect_url:
            return self.redirect_url
        try:
            name, port = _split_host(host)
        except ValueError:
            raise UnknownHost(f"this request's Host {host!r} is not a host name; open the UI at this server's "
                              f"address, or set {self.setting} to the URL browsers reach it by") from None
        if _norm(name) not in self.hosts or (port is not None and self.port is not None and port != self.port):
            raise UnknownHost(f"this server is not known as {host!r} (its names: {', '.join(sorted(self.hosts))}"
                              f"{f', port {self.port}' if self.port else ''}), so no sign-in is sent back there; "
                              f"open the UI at one of them, or set {self.setting} to the URL browsers reach it by "
                              "(behind a proxy)")
        return f"{'https' if scheme == 'https' else 'http'}://{host}{root_path}{CALLBACK}"
