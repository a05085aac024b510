"""What the fetching parts share of ``llmgw.core.netpolicy``'s I/O: this host's addresses, and a checked connector.

Three parts fetch what an operator's spec names (the agent its weights, the control plane their metadata,
the mirror its upstream's redirects); each refuses this host's own addresses, and the agent and the mirror
both hand aiohttp only checked addresses. Those two pieces live here, once; each part keeps its own policy
and its own refusal (an error its callers already handle).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import psutil

from llmgw.core import netpolicy


def own_addresses() -> frozenset[netpolicy.Address]:
    """Every address of this machine's interfaces."""
    found: set[netpolicy.Address] = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6) and (ip := netpolicy.address(a.address)) is not None:
                found.add(ip)
    return frozenset(found)


class CheckedConnector(aiohttp.TCPConnector):
    """An aiohttp connector that hands aiohttp only checked addresses (redirect hops and IP literals included).

    ``_resolve_host`` is the hook aiohttp itself documents for a connector-level address policy (its own
    comment there says so); every connection of the session, redirects included, asks it first. A subclass
    says what a refusal becomes (``refused``): an aiohttp error, so the session's own handling holds.
    """

    def __init__(self, policy: netpolicy.Policy, **kw: Any) -> None:
        super().__init__(**kw)
        self.policy = policy

    def refused(self, exc: netpolicy.Refused) -> aiohttp.ClientError:
        return aiohttp.ClientConnectionError(str(exc))

    async def _resolve_host(self, host: str, port: int, traces: Any = None) -> list[Any]:
        results = await super()._resolve_host(host, port, traces)
        if self.policy.permits(host, port):
            return results
        addresses = [ip for r in results if (ip := netpolicy.address(str(r["host"]))) is not None]
        own = await asyncio.to_thread(own_addresses)
        try:
            self.policy.check("", host, port, addresses, own=own)
        except netpolicy.Refused as exc:
            # aiohttp turns an OSError here into a DNS error (retried); an aiohttp error passes through as it is.
            raise self.refused(exc) from None
        return results
