"""How long the HTTP server waits for a client to send a request, and how many connections one address may hold.

Without these a client that sent half a header line, or a body one byte a minute, held its connection
(and the memory of what it had sent) for good, and one address could open connections until the
process ran out of file descriptors. They bound the *reading* of a request only: once the request is
complete, its answer may take as long as it takes (an SSE stream for minutes is not cut).

The defaults are nginx's and Go's usual ones, rounded: a header block has 10 s from its first byte
(nginx's ``client_header_timeout`` is 60 s, but an API client sends its headers in one write; 10 s
is ample on any link that can carry a completion), a body may pause 30 s between two reads (a 32 MiB
upload on a slow link still moves more often than that), an idle keep-alive connection is closed
after 5 s (as before), and one client address may hold 256 connections (a load test with wrk -c 256
fits; a front load balancer that reaches the router from one address needs 0: no cap).
"""

from __future__ import annotations

import dataclasses

#: The defaults, as the flags document them.
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 5.0
MAX_PER_ADDRESS = 256


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """The HTTP server's limits on reading requests; 0 turns a limit off."""

    #: Seconds from a request's first byte to the end of its header block.
    header_timeout_s: float = HEADER_TIMEOUT_S
    #: Seconds a request body may go without a byte arriving.
    body_timeout_s: float = BODY_TIMEOUT_S
    #: Seconds a keep-alive connection may sit idle between requests (and before its first).
    idle_timeout_s: float = IDLE_TIMEOUT_S
    #: Connections one client address may hold open at once; more are answered 503 and closed.
    max_per_address: int = MAX_PER_ADDRESS

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s"):
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise ValueError(f"{name.removesuffix('_s').replace('_', ' ')}: expected seconds >= 0 (0: off), "
                                 f"got {value!r}")
        if self.max_per_address < 0:
            raise ValueError(f"max connections per address: expected 0 (no cap) or more, got {self.max_per_address}")


#: The command-line flags for these, shared by ``llmgw server``, ``llmgw router`` and the standalone router.
FLAG_HELP = {
    "header_timeout_s": f"seconds a client has from a request's first byte to the end of its headers; 0: no limit "
                        f"[default {HEADER_TIMEOUT_S:g}]",
    "body_timeout_s": f"seconds a request body may pause between two reads; 0: no limit [default {BODY_TIMEOUT_S:g}]",
    "idle_timeout_s": f"seconds an idle keep-alive connection stays open; 0: no limit [default {IDLE_TIMEOUT_S:g}]",
    "max_per_address": f"connections one client address may hold open; more get 503 and are closed; 0: no cap "
                       f"(a load balancer in front) [default {MAX_PER_ADDRESS}]",
}


class AddressCounts:
    """Open connections per client address, against ``max_per_address`` (0: counted nowhere, no cap)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.held: dict[str, int] = {}

    def take(self, address: str) -> bool:
        """Counts one more connection from ``address``; False (and not counted) when it is at the cap."""
        held = self.held.get(address, 0)
        if held >= self.cap:
            return False
        self.held[address] = held + 1
        return True

    def give(self, address: str) -> None:
        left = self.held.get(address, 1) - 1
        if left > 0:
            self.held[address] = left
        else:
            self.held.pop(address, None)

    def refusal(self, address: str) -> str:
        return (f"This address holds {self.held.get(address, 0)} connections to the router, its limit; reuse them "
                "(keep-alive) or close some, or raise --max-connections-per-address (0: no cap) if a load balancer "
                "in front reaches the router from one address.")
