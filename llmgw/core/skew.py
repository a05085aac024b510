"""The version-skew policy (issue 29): which control planes, agents and routers work together.

Versions are compared by their wire *protocol*, a small integer raised by a release whose wire documents
change in a way an older peer must know of, not by the llmgw version string (a patch release does not
change the protocol). The README's "Versions and upgrades" says the same in words:

- a control plane at protocol N serves agents and routers at N-1 and N;
- control planes at N-1 and N share one database during a rolling upgrade (the store's schema floor says
  which releases may run against it: ``llmgw.control.store.schemafloor``);
- an agent or a router is never newer than the control plane it talks to: upgrade the control planes
  first (standby, then leader), then the agents one node at a time, then the routers.

A peer from a release before protocols were exchanged sends none (0 on the wire, a missing header): it is
protocol 1, :data:`LEGACY`.

Pure decisions: nothing here does I/O. The refusal sentences name both sides' versions and what to do.
"""

from __future__ import annotations

#: The wire protocol this release speaks. Raise it (and say so in CHANGELOG.md) when a release changes
#: the wire in a way the previous release must not meet unprepared.
PROTOCOL = 3

#: What a peer that sends no protocol (a release before 0.2.0) speaks.
LEGACY = 1

#: How many protocols older than the control plane's an agent or a router may be.
OLDER_ALLOWED = 1

#: The HTTP header a router sends its protocol in (and the control plane answers with its own), and the
#: one with the llmgw version beside it.
PROTOCOL_HEADER = "X-Llmgw-Protocol"
VERSION_HEADER = "X-Llmgw-Version"


def effective(protocol: int) -> int:
    """The protocol a peer speaks, given what it sent (0 or nothing: :data:`LEGACY`)."""
    return protocol if protocol > 0 else LEGACY


def parse_header(value: str | None) -> int:
    """The protocol in a :data:`PROTOCOL_HEADER` value; a missing or unreadable one is :data:`LEGACY`."""
    if not value:
        return LEGACY
    try:
        return effective(int(value.strip()))
    except ValueError:
        return LEGACY


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _name(kind: str, version: str, protocol: int) -> str:
    return f"{kind} {version or 'of an unknown version'} (protocol {protocol})"


def peer_refusal(kind: str, peer_protocol: int, peer_version: str, *, server_protocol: int = PROTOCOL,
                 server_version: str = "") -> str:
    """Why a control plane at ``server_protocol`` refuses an agent or router (``kind``) at ``peer_protocol``;
    "" when the policy allows it. ``peer_protocol`` as sent (0: :data:`LEGACY`)."""
    peer = effective(peer_protocol)
    server = _name("control plane", server_version, server_protocol)
    them = _name(f"this {kind}", peer_version, peer)
    if peer > server_protocol:
        return (f"{them} is newer than the {server}: {_article(kind)} {kind} may not be newer than its control plane; "
                f"upgrade the control planes first (standby, then leader), or run this {kind} at the "
                "control plane's version")
    if peer < server_protocol - OLDER_ALLOWED:
        return (f"{them} is too old for the {server}, which serves {kind}s at protocol "
                f"{server_protocol - OLDER_ALLOWED} or newer; upgrade this {kind} to the control plane's version"
                + (" (`llmgw node upgrade NODE`)" if kind == "agent" else ""))
    return ""


def server_refusal(kind: str, server_protocol: int, server_version: str, *, own_protocol: int = PROTOCOL,
                   own_version: str = "") -> str:
    """Why an agent or router (``kind``) at ``own_protocol`` refuses a control plane that answered with
    ``server_protocol`` (0: :data:`LEGACY`); "" when the policy allows it. An older control plane cannot
    know to refuse a newer peer, so the peer refuses it."""
    server = effective(server_protocol)
    return peer_refusal(kind, own_protocol, own_version, server_protocol=server, server_version=server_version)


def skewed(peer_version: str, server_version: str) -> bool:
    """Whether a peer runs another llmgw version than the control plane (shown as a skew, even when the
    policy allows it: an upgrade under way, or one forgotten). Unknown versions are not flagged."""
    return bool(peer_version) and bool(server_version) and peer_version != server_version


def headers(protocol: int = PROTOCOL, version: str = "") -> dict[str, str]:
    """The headers that say a side's protocol and llmgw version over HTTP (a router's table request, the
    control plane's answer); the version header only when it is known."""
    out = {PROTOCOL_HEADER: str(protocol)}
    if version:
        out[VERSION_HEADER] = version
    return out


#: The REST error ``code`` of a control plane's refusal of a router outside the policy (HTTP 409).
REFUSAL_CODE = "version_skew"
