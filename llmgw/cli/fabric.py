"""``llmgw fabric test NODE_A NODE_B``: RDMA write bandwidth between two nodes, against the port's rate."""

from __future__ import annotations

from typing import Any

import typer

from llmgw.cli import client as client_mod
from llmgw.core import fabrictest as ft
from llmgw.core.errors import LlmgwError

UrlOpt = typer.Option(None, "--url", help="Control plane URL [env LLMGW_URL, default http://127.0.0.1:8080]")
_OUTPUT_SHOWN = 15


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _output(side: dict[str, Any]) -> None:
    lines = side.get("output") or []
    if lines:
        typer.echo(f"{side['node']} ({side['role']}) ib_write_bw said:", err=True)
        for line in lines[-_OUTPUT_SHOWN:]:
            typer.echo(f"  | {line}", err=True)


def register(app: typer.Typer) -> None:
    """Adds the ``fabric`` group to ``app``."""
    fabric_app = typer.Typer(no_args_is_help=True, help="Test the InfiniBand/RoCE fabric between nodes.")
    app.add_typer(fabric_app, name="fabric")

    @fabric_app.command("test")
    def test(node_a: str, node_b: str,
             hca: str = typer.Option("", help="The adapter on both nodes, such as mlx5_0 [default: each node's "
                                     "first with an active port]"),
             port: int = typer.Option(0, help="The adapter's port [default: its first active one]"),
             size: str = typer.Option("64KiB", help="Message size, such as 1M or 64KiB"),
             duration: int = typer.Option(5, help="Seconds to measure"),
             tcp_port: int = typer.Option(ft.DEFAULT_TCP_PORT, help="TCP port the two sides exchange connection "
                                          "data on"),
             url: str = UrlOpt) -> None:
        """Measure RDMA write bandwidth from NODE_B to NODE_A (perftest's ib_write_bw) against the port's rate."""
        # The answer comes when the test is done: its duration, plus the agents' own deadline to set up.
        timeout = duration + ft.CONNECT_WAIT_S + ft.SETUP_S + 30
        body = {"node_a": node_a, "node_b": node_b, "hca": hca, "port": port, "size": size, "duration": duration,
                "tcp_port": tcp_port}
        try:
            _, doc = client_mod.Client(url or client_mod.default_url(), timeout=timeout).request(
                "POST", "/api/v1/fabric/tests", json=body)
        except LlmgwError as e:
            raise _fail(str(e)) from None
        server, client = doc["server"], doc["client"]
        where = f"{node_b} {client['describe']} -> {node_a} {server['describe']}"
        if not doc["ok"]:
            for side in (server, client):
                _output(side)
            raise _fail(f"fabric test {where} failed: {doc['error']}")
        typer.echo(f"{where}, {doc['size_bytes']} B messages for {doc['duration_s']} s: "
                   f"{doc['gbps']:.2f} Gb/s, {doc['verdict']}")
