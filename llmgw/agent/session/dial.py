"""Dialling one control plane: the channel (plaintext or mutual TLS), connecting or failing fast, and Refused.

With certificates (``cfg.tls``) each connection reads them afresh and dials with mutual TLS, so a certificate
renewed over the last stream is the one the next connection presents.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from llmgw.agent import nodepki

CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # grpc >= 1.5x waits this long for a ping's answer, whatever keepalive_timeout says (default 60 s):
    # without it a control plane frozen by SIGSTOP (or a VM paused) held the stream 70 s, measured, so
    # the agent came to the standby after its node's grace had run out and its engines were replaced.
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Reconnecting is this module's job, with its own backoff and address
    # rotation; gRPC's own reconnect backoff would hide a dead address.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]
REGISTER_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0


class Refused(Exception):
    """The control plane answered Register with a refusal; ``leader``: the address it names instead ("" none)."""

    def __init__(self, reason: str, *, leader: str = "", standby: bool = False, rejoin: bool = False,
                 skew: bool = False) -> None:
        super().__init__(reason)
        self.leader = leader
        #: A standby of a live cluster answered (it named a leader or listed the control planes).
        self.standby = standby
        #: The certificate is refused for good (revoked, unknown): only a new join lets the node in.
        self.rejoin = rejoin
        #: Outside the skew policy (``core.skew``): this agent's and that control plane's protocols do not
        #: work together, whichever side said so. Dialling again helps once one of them is upgraded.
        self.skew = skew


def channel(addr: str, tls: nodepki.NodePki | None) -> grpc.aio.Channel:
    """A channel to ``addr``: plaintext without ``tls``, else mutual TLS with the certificates read now."""
    if tls is None:
        return grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)
    ca, cert, key = tls.credentials()
    # root_certificates is the cluster CA alone: None would have gRPC trust the system's store.
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    return grpc.aio.secure_channel(addr, creds, options=CHANNEL_OPTIONS)


async def connect(ch: grpc.aio.Channel) -> None:
    """Connects, or fails at the first sign it cannot.

    Bounded, because a write on a channel that cannot connect waits forever
    (seen when an agent redialled a control plane that was still restarting:
    it never tried again). And failing on the first TRANSIENT_FAILURE rather
    than waiting out the timeout is what makes a refused address cost nothing
    when there is another one to try.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONNECT_TIMEOUT_S
    state = ch.get_state(try_to_connect=True)
    while state is not grpc.ChannelConnectivity.READY:
        if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            raise ConnectionRefusedError("refused or unreachable")
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise TimeoutError(f"no connection within {CONNECT_TIMEOUT_S:.0f}s")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ch.wait_for_state_change(state), remaining)
        state = ch.get_state(try_to_connect=True)
