"""The mirror's side of ``llmgw.core.netpolicy``: where its upstream may send it.

The upstream URL is an administrator's flag (``--upstream``, ``--mirror-upstream``), trusted as written, even
on loopback. What it answers is not: the Hub sends LFS files to a CDN with a redirect, and a redirect from a
compromised or misconfigured upstream to ``http://127.0.0.1:8080/...`` or ``169.254.169.254`` would have the
mirror fetch the control plane's API or the cloud's credentials and serve them to every node as a file.
So every connection the upstream client opens, each redirect hop included, asks ``Connector`` for its
addresses first: the upstream's own host:port passes, anything else is resolved, every address checked
(no loopback, link-local, unspecified or this host's own) and only checked addresses are dialled.
"""

from __future__ import annotations

import aiohttp

from llmgw import hostnet
from llmgw.core import netpolicy

SETTING = "the mirror's --upstream (a redirect from it is not followed there)"


def policy_for(upstream: str) -> netpolicy.Policy:
    """Nothing private is reached but the upstream itself."""
    return netpolicy.Policy.of(False, setting=SETTING).trusting(upstream)


class Refused(aiohttp.ClientError):
    """An upstream redirect to an address the policy refuses (an aiohttp error, so the client's handling holds)."""


class Connector(hostnet.CheckedConnector):
    """The upstream session's connector: only the upstream itself or a checked public address is dialled."""

    def refused(self, exc: netpolicy.Refused) -> aiohttp.ClientError:
        return Refused(f"the upstream redirected to {str(exc).split(';', 1)[0]}; not followed")
