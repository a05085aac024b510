"""A fabric bandwidth test between two nodes, run by their agents over their streams.

``run`` decides first and acts after: it chooses each node's port from the
adapters its last heartbeat reported (``fabrictest.choose_port``) and refuses,
before anything runs, a node that is not connected or whose port is down. Then
it sends the server side to A and the client side (with A's management
address) to B together, and gathers the two FabricTestResults: the client's is
the measurement; a server that fails first (its tool missing, its port down
since the heartbeat) ends the test at once, since the client can then only
fail too, after its connect wait. Every wait is bounded by the sides' own
deadline (``FabricTestRequest.timeout_s``, after which the agents kill the
tool) plus a margin for the stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from llmgw.control.loop.links import AgentLink
from llmgw.control.state import NodeView
from llmgw.core import fabrictest as ft

#: Past the agents' own deadline: the result's trip over the stream.
_ANSWER_MARGIN_S = 5.0
#: How long the server's answer is awaited once the client's is in: its output belongs in the report.
_SERVER_AFTER_CLIENT_S = 3.0


class _Cluster(Protocol):
    nodes: dict[str, NodeView]

    def link(self, node_id: str) -> AgentLink | None: ...


class FabricTestRefused(Exception):
    """The test cannot run; ``status`` is the HTTP status that says why (404 unknown node, 409 not now)."""

    def __init__(self, status: int, message: str, *, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    server: ft.FabricTestRequest
    client: ft.FabricTestRequest
    server_port: ft.PortChoice
    client_port: ft.PortChoice

    @property
    def rate_gbps(self) -> float:
        """The slower end's rate: a 400 Gb/s port cabled to a 200 Gb/s one can carry 200."""
        rates = [r for r in (self.server_port.rate_gbps, self.client_port.rate_gbps) if r > 0]
        return min(rates) if rates else 0.0


def plan(nodes: Mapping[str, NodeView], connected: set[str], *, node_a: str, node_b: str, hca: str = "",
         port: int = 0, size_bytes: int = 65536, duration_s: int = 5, tcp_port: int = ft.DEFAULT_TCP_PORT,
         test_id: str = "") -> Plan:
    """The two sides' requests, or FabricTestRefused with why not and what to do (pure: no I/O)."""
    if node_a == node_b:
        raise FabricTestRefused(400, f"both ends are node {node_a}: a fabric test runs between two nodes; name "
                                "another as NODE_B", code="invalid_request")
    choices: list[ft.PortChoice] = []
    for node_id in (node_a, node_b):
        view = nodes.get(node_id)
        if view is None:
            raise FabricTestRefused(404, f"no node {node_id!r}; `llmgw get nodes` lists them", code="not_found")
        if node_id not in connected:
            raise FabricTestRefused(409, f"node {node_id} is not connected now, so its agent cannot run its side; "
                                    "start its agent (or wait for it to reconnect) and test again",
                                    code="node_not_connected")
        choice = ft.choose_port(node_id, view.inventory.hcas, hca=hca, port=port)
        if isinstance(choice, str):
            raise FabricTestRefused(409, choice, code="port_unusable")
        choices.append(choice)
    peer = nodes[node_a].mgmt_addr
    if not peer:
        raise FabricTestRefused(409, f"node {node_a} reported no management address for the client to connect to; "
                                "set mgmt_addr in its agent's settings", code="no_address")
    if duration_s < 1 or size_bytes < 1:
        raise FabricTestRefused(400, "duration and size must be at least 1 (seconds, bytes)", code="invalid_request")
    test_id = test_id or uuid.uuid4().hex[:12]
    common = {"test_id": test_id, "tcp_port": tcp_port, "size_bytes": size_bytes, "duration_s": duration_s}
    server = ft.FabricTestRequest(role=ft.SERVER, hca=choices[0].hca, hca_port=choices[0].port,
                                  gid_index=choices[0].gid_index, **common)  # type: ignore[arg-type]
    client = ft.FabricTestRequest(role=ft.CLIENT, hca=choices[1].hca, hca_port=choices[1].port, peer_addr=peer,
                                  gid_index=choices[1].gid_index, **common)  # type: ignore[arg-type]
    return Plan(server, client, choices[0], choices[1])


def report(p: Plan, *, node_a: str, node_b: str, server: ft.FabricTestResult | None,
           client: ft.FabricTestResult | None) -> dict[str, Any]:
    """The answer's body: the measurement against the rate, each side's words and output (pure)."""
    def side(node: str, choice: ft.PortChoice, r: ft.FabricTestResult | None, role: str,
             other_failed: bool) -> dict[str, Any]:
        if r is not None:
            error = "" if r.ok else r.error
        elif other_failed:
            error = ""  # not awaited: the other side's failure is the reason, said once
        else:
            error = f"node {node} did not answer within the test's deadline; see its agent's log (`llmgw logs {node}`)"
        return {"node": node, "role": role, "hca": choice.hca, "port": choice.port, "describe": choice.describe(),
                "ok": r is not None and r.ok, "error": error, "gbps": r.gbps if r else 0.0,
                "output": list(r.output) if r else []}

    server_failed = server is not None and not server.ok
    client_failed = client is not None and not client.ok
    sides = [side(node_a, p.server_port, server, ft.SERVER, client_failed),
             side(node_b, p.client_port, client, ft.CLIENT, server_failed)]
    ok = all(s["ok"] for s in sides) and client is not None and client.gbps > 0
    errors = [f"{s['node']} ({s['role']}): {s['error']}" for s in sides if s["error"]]
    if not ok and not errors:
        errors.append(f"{node_b} (client): ib_write_bw ended without measuring anything (0 Gb/s); its output is "
                      "in the answer")
    rate = p.rate_gbps
    gbps = client.gbps if client is not None and client.ok else 0.0
    percent, said = ft.verdict(gbps, rate) if ok else (0, "")
    return {"id": p.server.test_id, "node_a": node_a, "node_b": node_b, "ok": ok, "gbps": gbps,
            "port_rate_gbps": rate, "percent": percent, "verdict": said, "size_bytes": p.server.size_bytes,
            "duration_s": p.server.duration_s, "error": "; ".join(errors), "server": sides[0], "client": sides[1]}


async def run(cluster: _Cluster, *, node_a: str, node_b: str, hca: str = "", port: int = 0,
              size_bytes: int = 65536, duration_s: int = 5, tcp_port: int = ft.DEFAULT_TCP_PORT) -> dict[str, Any]:
    """Runs a test from node_b (client) to node_a (server) and answers ``report``'s body."""
    connected = {n for n in (node_a, node_b) if cluster.link(n) is not None}
    p = plan(cluster.nodes, connected, node_a=node_a, node_b=node_b, hca=hca, port=port, size_bytes=size_bytes,
             duration_s=duration_s, tcp_port=tcp_port)
    links = cluster.link(node_a), cluster.link(node_b)
    if links[0] is None or links[1] is None:  # gone between the check and now
        raise FabricTestRefused(409, "a node disconnected as the test began; test again", code="node_not_connected")
    server_link, client_link = links
    server_fut = server_link.fabric_test(p.server)
    client_fut = client_link.fabric_test(p.client)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + p.server.timeout_s() + _ANSWER_MARGIN_S
    try:
        done, _ = await asyncio.wait({server_fut, client_fut}, timeout=deadline - loop.time(),
                                     return_when=asyncio.FIRST_COMPLETED)
        if server_fut in done and not server_fut.result().ok and not ft.ran_out_of_time(server_fut.result()):
            pass  # refused before it ran (tool missing, port down): the client can only fail now; answer at once
        elif client_fut not in done:
            # A server that ran out its time is answered with the client's side too: its deadline is a moment
            # later, and its answer says why (seen under load: the server's timeout came in first).
            await asyncio.wait({client_fut}, timeout=max(0.0, deadline - loop.time()))
        if client_fut.done() and not server_fut.done():
            await asyncio.wait({server_fut}, timeout=_SERVER_AFTER_CLIENT_S)
    finally:
        server_link.forget_fabric_test(p.server.test_id)
        client_link.forget_fabric_test(p.client.test_id)
    return report(p, node_a=node_a, node_b=node_b, server=server_fut.result() if server_fut.done() else None,
                  client=client_fut.result() if client_fut.done() else None)
