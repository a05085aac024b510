"""The fabric bandwidth test's shared facts: what each side is asked and answers, which port, the verdict.

``llmgw fabric test A B`` measures RDMA write bandwidth from node B to node A with
perftest's ``ib_write_bw`` (server on A, client on B) and says it against the
port's rate: "94% of 400 Gb/s". The control plane and the agent both choose the
port from the same adapter facts (``choose_port``): the control plane refuses a
test whose port its last heartbeat says is down before asking anyone to run
anything, and the agent checks again against sysfs at the moment it runs,
because a link can drop between a heartbeat and the test.

Pure: no I/O and no clock; both ends import it, so the timing constants below
are the one place the agent's kill deadline and the control plane's wait agree.
"""

from __future__ import annotations

import dataclasses

from llmgw.core.inventory import Hca, HcaPort

SERVER, CLIENT = "server", "client"
#: perftest's own default for the TCP port the two sides exchange connection data on.
DEFAULT_TCP_PORT = 18515
#: The client tries to connect again this long: its agent can get the request before the
#: server's agent has started listening (both requests go out together, on two streams).
CONNECT_WAIT_S = 5.0
#: Past the measured duration, for opening the device, registering memory and exchanging QPs.
SETUP_S = 10.0
#: Below this share of the port's rate the verdict says the link is underperforming.
LOW_PERCENT = 80


@dataclasses.dataclass(frozen=True, slots=True)
class FabricTestRequest:
    test_id: str
    #: SERVER listens first; CLIENT connects to ``peer_addr``.
    role: str
    #: The adapter (mlx5_0); empty: the node's first one with an active port.
    hca: str = ""
    #: 0: the adapter's first active port.
    hca_port: int = 0
    tcp_port: int = DEFAULT_TCP_PORT
    peer_addr: str = ""
    size_bytes: int = 65536
    duration_s: int = 5
    #: RoCE: the port's RoCE v2 GID index; -1: the agent reads it from sysfs.
    gid_index: int = -1

    def timeout_s(self) -> float:
        """When the agent kills the tool: a hung side (a peer that vanished mid-test) never ends by itself."""
        return self.duration_s + CONNECT_WAIT_S + SETUP_S


@dataclasses.dataclass(frozen=True, slots=True)
class FabricTestResult:
    test_id: str
    role: str
    ok: bool
    #: Why it failed, in words that say what to do ("no route to 10.0.0.2:18515; ...").
    error: str = ""
    #: BW average as the tool reported it, Gb/s (the client's is the measurement).
    gbps: float = 0.0
    #: The rate of the port it ran on, as the node read it (Gb/s).
    port_rate_gbps: float = 0.0
    output: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class PortChoice:
    hca: str
    port: int
    rate_gbps: float
    #: "InfiniBand", or "Ethernet" for RoCE.
    link_layer: str
    #: RoCE v2 GID index (-1 on InfiniBand, or on RoCE when the port has no IPv4 GID).
    gid_index: int

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"

    def describe(self) -> str:
        """``mlx5_1 port 1 (RoCE, 100 Gb/s, GID index 3)``."""
        kind = f"RoCE, {self.rate_gbps:g} Gb/s, GID index {self.gid_index}" if self.roce \
            else f"InfiniBand, {self.rate_gbps:g} Gb/s"
        return f"{self.hca} port {self.port} ({kind})"


def _state(p: HcaPort) -> str:
    phys = f", physical state {p.phys_state}" if p.phys_state else ""
    return f"{p.state or 'in no known state'}{phys}"


def choose_port(node_id: str, hcas: tuple[Hca, ...], *, hca: str = "", port: int = 0) -> PortChoice | str:
    """The adapter port a test runs on, or the refusal that says why none can and what to do."""
    if not hcas:
        return (f"node {node_id} has no InfiniBand or RoCE adapter (nothing under /sys/class/infiniband): a fabric "
                "test needs one on each node; check that the driver (mlx5_ib) is loaded")
    if hca:
        named = next((h for h in hcas if h.name == hca), None)
        if named is None:
            return (f"node {node_id} has no adapter {hca}; it has {', '.join(h.name for h in hcas)}: "
                    "pick one of those with --hca")
        candidates = [named]
    else:
        candidates = list(hcas)
    if port:
        h = candidates[0]
        chosen = next((p for p in h.ports if p.port == port), None)
        if chosen is None:
            return (f"adapter {h.name} of node {node_id} has no port {port}; it has port(s) "
                    f"{', '.join(str(p.port) for p in h.ports) or 'none'}: pick one with --port")
        if not chosen.usable:
            return (f"port {port} of {h.name} on node {node_id} is {_state(chosen)}: ib_write_bw would stop at "
                    f"once with \"Port number {port} state is {chosen.state or 'DOWN'}\"; bring the link up (the "
                    "cable, the switch port, the subnet manager) or pick another port with --hca/--port")
        return _choice(h, chosen)
    for h in candidates:
        for p in h.ports:
            if p.usable:
                return _choice(h, p)
    states = "; ".join(f"{h.name} port {p.port} is {_state(p)}" for h in candidates for p in h.ports)
    which = f"adapter {hca}" if hca else "adapter"
    return (f"no {which} port of node {node_id} is active ({states or 'no ports'}): bring a link up (the cable, "
            "the switch port, the subnet manager) or pick another adapter with --hca")


def _choice(h: Hca, p: HcaPort) -> PortChoice:
    return PortChoice(h.name, p.port, p.rate_gbps, p.link_layer, p.roce_v2_gid_index)


def verdict(gbps: float, rate_gbps: float) -> tuple[int, str]:
    """(percent, sentence): ``(94, "94% of 400 Gb/s")``; a low share says what to look at."""
    if rate_gbps <= 0:
        return 0, f"{gbps:g} Gb/s (the port's rate is not known, so there is nothing to compare with)"
    percent = round(100 * gbps / rate_gbps)
    said = f"{percent}% of {rate_gbps:g} Gb/s"
    if percent < LOW_PERCENT:
        said += (f": below {LOW_PERCENT}% of the port's rate; check the PCIe link width (lspci -vv), the MTU, "
                 "and for RoCE the switch's flow control (PFC/ECN)")
    return percent, said


#: How an agent's timed-out side begins its error: the tool ran its full time and was killed.
TIMED_OUT = "timed out after"


def ran_out_of_time(result: FabricTestResult) -> bool:
    """Whether this side failed by running out its deadline (the other side's answer then says why)."""
    return not result.ok and result.error.startswith(TIMED_OUT)
