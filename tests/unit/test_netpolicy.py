"""The address rule against server-side request forgery, as plain data: what is refused, what is allowed, and why."""

from __future__ import annotations

import ipaddress

import pytest

from llmgw.core import netpolicy

POLICY = netpolicy.Policy.of(False, setting="fetch_allow_private in the agent's settings")


def ip(text: str) -> netpolicy.Address:
    found = netpolicy.address(text)
    assert found is not None
    return found


@pytest.mark.parametrize(("addr", "why"), [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("::ffff:127.0.0.1", "loopback"),   # IPv4-mapped: the kernel connects it to 127.0.0.1
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("0.0.0.0", "unspecified"), ("0.1.2.3", "unspecified"), ("::", "unspecified"),
    ("224.0.0.1", "multicast"),
])
def test_loopback_link_local_unspecified_and_multicast_are_refused(addr: str, why: str) -> None:
    """Each refused kind, with its reason; nothing about the address is fetched."""
    assert why in netpolicy.why_refused(ip(addr))


@pytest.mark.parametrize("addr", ["10.0.0.5", "192.168.1.2", "172.16.0.9", "fd00::1", "8.8.8.8", "2606:4700::1"])
def test_private_and_public_addresses_are_allowed(addr: str) -> None:
    """Private ranges are where a cluster's own servers live: allowed (the README says why)."""
    assert netpolicy.why_refused(ip(addr)) == ""


def test_the_hosts_own_addresses_are_refused() -> None:
    """An address of the fetching host reaches its own ports as loopback would."""
    own = frozenset({ipaddress.ip_address("10.0.0.7")})
    assert "this host itself" in netpolicy.why_refused(ip("10.0.0.7"), own=own)
    with pytest.raises(netpolicy.Refused, match="10.0.0.7 is an address of this host itself"):
        POLICY.check("http://10.0.0.7:8080/x", "10.0.0.7", 8080, [ip("10.0.0.7")], own=own)


def test_every_resolved_address_is_checked_and_the_refusal_names_the_setting() -> None:
    """A name resolving to a public address and to loopback is refused; the sentence says what to change."""
    with pytest.raises(netpolicy.Refused) as refused:
        POLICY.check("http://evil.example/m.gguf", "evil.example", 80, [ip("93.184.216.34"), ip("127.0.0.1")])
    said = str(refused.value)
    assert said.startswith("http://evil.example/m.gguf: evil.example (resolved to 127.0.0.1) is a loopback address")
    assert "server-side request forgery" in said
    assert said.endswith("or allow evil.example:80 with fetch_allow_private in the agent's settings")
    assert POLICY.check("u", "ok.example", 443, [ip("93.184.216.34")]) == [ip("93.184.216.34")]


def test_allowed_hosts_trusted_endpoints_and_true() -> None:
    """A host or host:port in the setting, the cluster's endpoints by configuration, or true for any."""
    loop = [ip("127.0.0.1")]
    allowed = netpolicy.Policy.of(["127.0.0.1:9000", "LOCALHOST"], setting="s")
    assert allowed.check("u", "127.0.0.1", 9000, loop) == loop
    assert allowed.check("u", "localhost", 1234, loop) == loop
    with pytest.raises(netpolicy.Refused):
        allowed.check("u", "127.0.0.1", 9001, loop)
    trusted = POLICY.trusting("http://127.0.0.1:8080/mirror", "")
    assert trusted.check("u", "127.0.0.1", 8080, loop) == loop
    with pytest.raises(netpolicy.Refused):
        trusted.check("u", "127.0.0.1", 8081, loop)
    assert netpolicy.Policy.of(True, setting="s").check("u", "169.254.169.254", 80, [ip("169.254.169.254")])
    v6 = netpolicy.Policy.of(["[::1]:80"], setting="s")
    assert v6.permits("::1", 80) and not v6.permits("::1", 81)
